"""Crash explanations on a real CUDA GPU (run with ``pytest -m gpu``): an out-of-memory error with the
allocator's statistics, a batch left on the CPU, and a device-side assert from a label out of range (in a
subprocess: the assert leaves the CUDA context unusable)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import torchdoctor

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def crash(model, optimizer, body):
    s = torchdoctor.watch(model, optimizer, on_finding=lambda f: None, report=False)
    with pytest.raises(BaseException) as info:
        with s:
            body()
    return s, info.value


def test_a_cuda_oom_is_broken_down_with_the_allocators_numbers():
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
    opt = torch.optim.Adam(model.parameters())

    def body():
        for _ in range(2):
            opt.zero_grad()
            nn.functional.cross_entropy(
                model(torch.randn(64, 1024, device="cuda")), torch.randint(0, 10, (64,), device="cuda")
            ).backward()
            opt.step()
        free, total = torch.cuda.mem_get_info()
        torch.empty(int(total * 2), dtype=torch.uint8, device="cuda")  # more than the whole device

    s, exc = crash(model, opt, body)
    assert isinstance(exc, torch.OutOfMemoryError)
    (finding,) = s.findings
    assert finding.name == "out-of-memory" and finding.location.device.startswith("cuda")
    assert "optimizer state (Adam)" in finding.message and "Reserved by PyTorch" in finding.message
    assert "empty_cache" not in finding.fix.title + finding.fix.code


def test_a_batch_left_on_the_cpu_is_named_with_the_layer():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    s, exc = crash(model, opt, lambda: model(torch.randn(4, 8)))
    (finding,) = s.findings
    assert finding.name == "device-mismatch" and "on cuda:0" in finding.message and "`input` on cpu" in finding.message


def test_a_label_out_of_range_after_a_device_side_assert(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent("""
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 10)).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = TensorDataset(torch.randn(32, 8), torch.arange(32) % 11)  # label 10 for 10 classes
        for x, y in DataLoader(data, batch_size=8):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x.cuda()), y.cuda()).backward()
            opt.step()
        torch.cuda.synchronize()
    """)
    )
    done = subprocess.run(
        [sys.executable, "-m", "torchdoctor", "run", str(script)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    assert "TD333 cuda-device-assert" in done.stderr and "held values up to 10" in done.stderr
