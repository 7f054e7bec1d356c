"""The CUDA performance checks on a real GPU (run with ``pytest -m gpu``): host-device-sync sees a per-step
``.item()`` through torch's sync debug mode, tensor-cores-idle a float32 Linear model on an Ampere GPU, and
input-bound names pin_memory for a CUDA model."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import torchdoctor

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).cuda()
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _loop(checks, log_every: int, steps: int = 12):
    model, opt = _setup()
    x, y = torch.randn(64, 256, device="cuda"), torch.randint(0, 10, (64,), device="cuda")
    with torchdoctor.watch(model, opt, checks=checks, on_finding=lambda f: None, report=False) as s:
        for step in range(steps):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            if step % log_every == 0:
                print(loss.item())
    return s


def test_item_every_step_is_a_host_device_sync():
    [finding] = _loop(["host-device-sync"], log_every=1).findings
    assert finding.location.file == __file__ and "loss.item()" in finding.message


def test_item_every_hundred_steps_is_quiet():
    assert _loop(["host-device-sync"], log_every=100).findings == []


@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 0),
    reason="needs tensor cores with TF32 (Ampere or newer)",
)
def test_float32_linear_without_tf32_leaves_the_tensor_cores_idle():
    precision = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert len(_loop(["tensor-cores-idle"], log_every=100).findings) == 1
        torch.set_float32_matmul_precision("high")
        assert _loop(["tensor-cores-idle"], log_every=100).findings == []
    finally:
        torch.set_float32_matmul_precision(precision)


class Slow(Dataset):
    def __len__(self) -> int:
        return 8 * 16

    def __getitem__(self, i: int):
        time.sleep(0.004)
        return torch.randn(256), i % 10


def test_input_bound_on_cuda_asks_for_pinned_memory():
    model, opt = _setup()
    with torchdoctor.watch(model, opt, checks=["input-bound"], on_finding=lambda f: None, report=False) as s:
        for x, y in DataLoader(Slow(), batch_size=8):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x.cuda()), y.cuda()).backward()
            opt.step()
    [finding] = s.findings
    assert "pin_memory=True" in finding.fix.code and "num_workers=4" in finding.fix.code
