"""`torchdoctor env` on a real NVIDIA GPU: facts against nvidia-smi, memory held by orphaned or stopped
processes, and CUDA_VISIBLE_DEVICES with real indices and UUIDs (run with ``pytest -m gpu``)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from torchdoctor import registry
from torchdoctor.env.doctor import collect_facts, diagnose_env

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

MiB = 1 << 20
HOLD_MIB = 1024

# A child that takes HOLD_MIB of GPU memory, says so, then sleeps; its parent (the group leader) only waits.
HOLDER = f"""
import sys, time, torch
x = torch.empty({HOLD_MIB} * 2**20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(600)
"""
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=sys.stdout)
print(child.pid, flush=True)
time.sleep(600)
"""


def smi(*fields: str) -> list[str]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits", "-i", "0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [v.strip() for v in out.split(",")]


def smi_processes() -> dict[int, int]:
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {int(pid): int(mem) for pid, mem in (line.split(",") for line in out.splitlines() if line.strip())}


def env_findings(name: str) -> list:
    return [f for f in diagnose_env(checks=[registry.get(name)]).findings]


def test_facts_match_nvidia_smi_field_by_field():
    gpu_facts = collect_facts()
    nv, gpu = gpu_facts.nvidia, gpu_facts.nvidia.gpus[0]
    (driver, name, uuid, bus, total, used, persistence, ecc, cap, hw, hw_thermal, sw_thermal, brake) = smi(
        "driver_version",
        "name",
        "uuid",
        "pci.bus_id",
        "memory.total",
        "memory.used",
        "persistence_mode",
        "ecc.mode.current",
        "compute_cap",
        "clocks_throttle_reasons.hw_slowdown",
        "clocks_throttle_reasons.hw_thermal_slowdown",
        "clocks_throttle_reasons.sw_thermal_slowdown",
        "clocks_throttle_reasons.hw_power_brake_slowdown",
    )
    query = subprocess.run(["nvidia-smi", "-q"], capture_output=True, text=True, check=True).stdout
    cuda = next(line.split(":")[1].strip() for line in query.splitlines() if line.startswith("CUDA Version"))
    assert (nv.driver_version, nv.driver_cuda) == (driver, cuda)
    assert (gpu.name, gpu.uuid, gpu.pci_bus_id.lower()) == (name, uuid, bus.lower())
    assert gpu.memory_total // MiB == int(total)
    assert abs(gpu.memory_used // MiB - int(used)) <= 64  # nvidia-smi's "used" leaves out the driver's reserve
    assert gpu.persistence_mode == (persistence == "Enabled") and gpu.ecc_enabled == (ecc == "Enabled")
    assert ".".join(map(str, gpu.capability)) == cap
    assert len(gpu.throttle_reasons) == [hw, hw_thermal, sw_thermal, brake].count("Active")
    assert gpu_facts.torch.cuda_devices[0]["capability"] == tuple(gpu.capability)
    assert {p.pid for p in gpu.processes} == set(smi_processes())


@pytest.fixture
def orphan_holder():
    """A process group whose leader is killed, leaving its GPU-holding child orphaned; yields the child."""
    leader = subprocess.Popen(
        [sys.executable, "-c", PARENT, HOLDER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    child = int(leader.stdout.readline())
    assert leader.stdout.readline().strip() == "ready"
    leader.kill()
    leader.wait()
    yield child
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while child in smi_processes() and time.monotonic() < deadline:
        time.sleep(0.2)


def test_an_orphaned_child_holding_gpu_memory_is_named_then_forgotten_once_it_exits(orphan_holder):
    assert orphan_holder in smi_processes()
    [f] = [f for f in env_findings("gpu-memory-held") if f"pid {orphan_holder}" in f.message]
    assert re.search(rf"pid {orphan_holder}, (\w+, )?[\d.]+ GiB, `\S*python\S* -c ", f.message), f.message
    assert "is orphaned" in f.message and f"kill {orphan_holder}" in f.fix.title + f.fix.code
    os.kill(orphan_holder, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while orphan_holder in smi_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [f for f in env_findings("gpu-memory-held") if f"pid {orphan_holder}" in f.message]


def test_a_stopped_child_holding_gpu_memory_is_listed_with_pid_memory_and_command():
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        holder.send_signal(signal.SIGSTOP)  # Ctrl-Z: stopped, not dead, still holding its memory
        [f] = [f for f in env_findings("gpu-memory-held") if f"pid {holder.pid}" in f.message]
        assert re.search(rf"pid {holder.pid}, (\w+, )?[\d.]+ GiB, `\S*python\S* -c ", f.message), f.message
        assert str(f.severity) == "info" and "stopped (Ctrl-Z" in f.message
    finally:
        holder.kill()
        holder.wait()


def _env_under(visible: str) -> dict:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=visible)
    out = subprocess.run(
        [sys.executable, "-m", "torchdoctor", "env", "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    return json.loads(out)


@pytest.mark.parametrize("kind", ["index", "uuid", "uuid-prefix", "absent-index", "absent-uuid", "duplicate"])
def test_cuda_visible_devices_findings_match_what_cuda_sees(kind):
    uuid = smi("uuid")[0]
    visible = {
        "index": "0",
        "uuid": uuid,
        "uuid-prefix": uuid[:12],
        "absent-index": "1,0",
        "absent-uuid": "GPU-00000000-dead",
        "duplicate": "0,0",
    }[kind]
    doc = _env_under(visible)
    sees = doc["facts"]["torch"]["cuda_device_count"]
    found = [f for f in doc["findings"] if f["name"] == "cuda-visible-devices"]
    if kind in ("index", "uuid", "uuid-prefix"):
        assert sees == 1 and found == []
    else:
        assert sees == 0 and len(found) == 1  # the finding says CUDA sees no GPU; torch agrees
        assert ("malformed" in found[0]["message"]) == (kind == "duplicate")
