"""Environment checks about the GPUs themselves, from NVML: memory held by other (or dead) processes,
and health (ECC errors, slowdowns, persistence mode, GPUs busy with someone else's work)."""
from __future__ import annotations

from typing import Iterator

from torchdoctor.env.facts import EnvFacts, GpuProcess
from torchdoctor.findings import Finding, Location, Severity
from torchdoctor.registry import Scope, check

from torchdoctor.units import byte_size

BUSY_PERCENT = 90


def _who(p: GpuProcess) -> str:
    bits = [f"pid {p.pid}"]
    if p.user:
        bits.append(p.user)
    if p.used_bytes is not None:
        bits.append(byte_size(p.used_bytes))
    if p.command:
        cmd = p.command if len(p.command) <= 80 else p.command[:77] + "..."
        bits.append(f"`{cmd}`")
    return ", ".join(bits)


@check(code="TD110", name="gpu-memory-held", scope=Scope.ENV, severity="warning",
       summary="GPU memory held by other processes, especially dead, zombie or orphaned ones.")
def gpu_memory_held(facts: EnvFacts) -> Iterator[Finding]:
    for gpu in facts.nvidia.gpus:
        where = Location(device=f"GPU{gpu.index}")
        live = []
        for p in gpu.processes:
            if p.alive is False and p.status != "zombie":
                yield Finding(
                    f"GPU{gpu.index} ({gpu.name}): {_who(p)} holds GPU memory but the process no longer exists; "
                    "the memory stays allocated (nvidia-smi shows it, `kill` answers 'no such process').",
                    fix="Find what still has the device open with `sudo fuser -v /dev/nvidia*` and kill those "
                        "processes (often leftover DataLoader workers of the dead job). Only if nothing holds "
                        f"it: `sudo nvidia-smi --gpu-reset -i {gpu.index}` with the GPU idle.",
                    location=where,
                )
            elif p.status == "zombie":
                yield Finding(
                    f"GPU{gpu.index} ({gpu.name}): {_who(p)} is a zombie still holding GPU memory; its parent "
                    f"(pid {p.parent_pid}) has not reaped it.",
                    fix=f"kill the parent: `kill {p.parent_pid}` (then `kill -9 {p.parent_pid}` if it ignores it)",
                    location=where,
                )
            elif p.alive and p.orphaned:
                yield Finding(
                    f"GPU{gpu.index} ({gpu.name}): {_who(p)} is orphaned (its parent and the leader of its "
                    "process group are gone) and still holds GPU memory, typically a DataLoader worker or DDP rank left behind by Ctrl-C.",
                    fix=f"kill {p.pid}  (or `pkill -f <your script>` to get all leftovers)",
                    location=where,
                )
            else:
                live.append(p)
        if live:
            held = sum(p.used_bytes or 0 for p in live)
            yield Finding(
                f"GPU{gpu.index} ({gpu.name}): {len(live)} other process(es) hold {byte_size(held)} of "
                f"{byte_size(gpu.memory_total)}: " + "; ".join(_who(p) for p in live) + ".",
                fix="If they are yours and finished, `kill <pid>`; otherwise pick another GPU with CUDA_VISIBLE_DEVICES.",
                location=where,
                severity=Severity.INFO,
            )


@check(code="TD114", name="gpu-health", scope=Scope.ENV, severity="warning",
       summary="ECC errors, hardware/thermal slowdowns, persistence mode off, a GPU busy with other work.")
def gpu_health(facts: EnvFacts) -> Iterator[Finding]:
    for gpu in facts.nvidia.gpus:
        where = Location(device=f"GPU{gpu.index}")
        label = f"GPU{gpu.index} ({gpu.name})"
        if gpu.ecc_uncorrected:
            yield Finding(
                f"{label} reports {gpu.ecc_uncorrected} uncorrected ECC memory error(s) since the driver loaded: "
                "results computed on it may be wrong, and CUDA may fail with 'uncorrectable ECC error encountered'.",
                fix=f"Drain the GPU and reset it (`sudo nvidia-smi -r -i {gpu.index}`); if errors return, have it replaced.",
                location=where,
            )
        if gpu.throttle_reasons:
            temp = f" at {gpu.temperature}°C" if gpu.temperature is not None else ""
            yield Finding(
                f"{label} is slowed down{temp}: {', '.join(gpu.throttle_reasons)}.",
                fix="Check cooling and power (`nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER`).",
                location=where,
            )
        others = [p for p in gpu.processes if p.alive]
        if gpu.utilization is not None and gpu.utilization >= BUSY_PERCENT and others:
            yield Finding(
                f"{label} is {gpu.utilization}% busy with other processes ({'; '.join(_who(p) for p in others)}): "
                "your job will share its compute.",
                fix="Pick an idle GPU with CUDA_VISIBLE_DEVICES (`nvidia-smi` shows utilisation).",
                location=where,
            )
        if gpu.persistence_mode is False:
            yield Finding(
                f"{label} has persistence mode off: the driver tears the GPU down when no process uses it, so "
                "every new CUDA process pays seconds of initialisation.",
                fix="sudo nvidia-smi -pm 1   (or run nvidia-persistenced)",
                location=where,
                severity=Severity.INFO,
            )
