"""check-ckpt on checkpoints saved from CUDA tensors, and `--fix` writing a copy that a CPU-only machine
loads with plain ``torch.load`` (run with ``pytest -m gpu``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from torchdoctor import check_checkpoint

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

LOAD_ON_CPU_ONLY = """
import sys, torch
assert not torch.cuda.is_available()
try:
    obj = torch.load(sys.argv[1], map_location=None, weights_only=True)
except RuntimeError as exc:
    print("error:", str(exc).splitlines()[0])
else:
    print("loaded", ", ".join(sorted(obj)))
"""


def training_checkpoint(path) -> str:
    """Model, Adam state and a step counter, saved straight from the GPU (the usual training script)."""
    model = nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.Linear(64, 4)).cuda()
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 32, device="cuda")).sum().backward()
    opt.step()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 1}, path)
    return str(path)


def load_without_cuda(path: str) -> str:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(
        [sys.executable, "-c", LOAD_ON_CPU_ONLY, path], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_cuda_checkpoint_is_flagged_and_the_message_is_what_a_cpu_machine_says(tmp_path):
    path = training_checkpoint(tmp_path / "gpu.pt")
    [f] = [f for f in check_checkpoint(path).findings if f.name == "cuda-tensors"]
    assert "on cuda:0" in f.message and f.location.device == "cuda:0"
    said = load_without_cuda(path)
    assert said.startswith("error: Attempting to deserialize object on a CUDA device")
    assert said.removeprefix("error: ").split(". ")[0] in f.message  # torch's own words, quoted


def test_fix_writes_a_copy_that_a_cpu_only_machine_loads(tmp_path):
    path = training_checkpoint(tmp_path / "gpu.pt")
    out = tmp_path / "cpu.pt"
    done = subprocess.run(
        [sys.executable, "-m", "torchdoctor", "check-ckpt", path, "--fix", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 1) and out.exists(), done.stderr
    assert load_without_cuda(str(out)) == "loaded model, optimizer, step"  # the whole training checkpoint kept
    assert not [f for f in check_checkpoint(str(out)).findings if f.name == "cuda-tensors"]
    original = torch.load(path, map_location="cpu", weights_only=True)
    copy = torch.load(str(out), weights_only=True)
    assert copy["step"] == original["step"] and copy["model"].keys() == original["model"].keys()
    assert all(torch.equal(original["model"][k], copy["model"][k]) for k in original["model"])
    state = copy["optimizer"]["state"]
    assert state and all(t.device.type == "cpu" for s in state.values() for t in s.values() if torch.is_tensor(t))
