"""host-device-sync and tensor-cores-idle on the CPU: the device facts they read are faked (the same checks run on
a real GPU in tests/gpu/test_gpu_perf.py); the loops, the forwards and the warnings are real."""

import warnings

import pytest
import torch
import torchdoctor.checks.host_device_sync as hds
import torchdoctor.checks.tensor_cores_idle as tci
from torch import nn

import torchdoctor


def _setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def read(t):
    """Stands for a CUDA .item(): the warning torch's sync debug mode gives, then the value."""
    warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
    return t.item()


@pytest.fixture
def fake_cuda(monkeypatch):
    modes = []
    monkeypatch.setattr(hds, "on_cuda", lambda model: True)
    monkeypatch.setattr(hds, "debug_mode", modes.append)
    return modes


def _loop(model, opt, checks, steps=8, each=lambda step, loss: None, **kwargs):
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    with torchdoctor.watch(model, opt, checks=checks, on_finding=lambda f: None, report=False, **kwargs) as s:
        for step in range(steps):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            each(step, loss)
    return s


def test_host_device_sync_names_the_line_that_syncs_every_step(fake_cuda):
    model, opt = _setup()
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        s = _loop(model, opt, ["host-device-sync"], each=lambda step, loss: read(loss))
    [finding] = s.findings
    assert finding.location.file == __file__ and finding.location.line == read.__code__.co_firstlineno + 2
    assert "steps 1-3" in finding.message and "warnings.warn" in finding.message
    assert fake_cuda == ["warn", "default"]  # on for three steps, then off again
    # the fake warns at every step; those of the 3 sampled steps are not shown to the user (outside them torch
    # would not warn at all)
    assert len([w for w in shown if "synchronizing" in str(w.message)]) == 8 - 3
    assert warnings.showwarning.__name__ != "_show"


def test_host_device_sync_quiet_when_the_loop_reads_every_n_steps(fake_cuda):
    model, opt = _setup()
    s = _loop(model, opt, ["host-device-sync"], each=lambda step, loss: step % 100 == 0 and read(loss))
    assert s.findings == [] and fake_cuda == ["warn", "default"]


def test_host_device_sync_leaves_syncs_inside_the_optimizer_step_out(fake_cuda):
    model, opt = _setup()
    opt.register_step_post_hook(lambda *args: read(torch.zeros(())))  # as an optimizer reading a flag in step()
    assert _loop(model, opt, ["host-device-sync"]).findings == []


def test_host_device_sync_off_without_cuda(monkeypatch):
    modes = []
    monkeypatch.setattr(hds, "debug_mode", modes.append)
    model, opt = _setup()
    assert _loop(model, opt, ["host-device-sync"], each=lambda step, loss: read(loss)).findings == []
    assert modes == []


@pytest.fixture
def ampere(monkeypatch):
    monkeypatch.setattr(tci, "device_of", lambda model: ("cpu", (8, 0)))


def test_tensor_cores_idle_on_a_float32_linear_model(ampere):
    model, opt = _setup()
    [finding] = _loop(model, opt, ["tensor-cores-idle"]).findings
    assert "TF32 is off" in finding.message and 'set_float32_matmul_precision("high")' in finding.fix.code


def test_tensor_cores_idle_quiet_under_autocast_tf32_and_before_ampere(ampere, monkeypatch):
    model, opt = _setup()
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    with torchdoctor.watch(model, opt, checks=["tensor-cores-idle"], report=False) as s:
        for _ in range(6):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
    assert s.findings == []
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        assert _loop(*_setup(), ["tensor-cores-idle"]).findings == []
    finally:
        torch.set_float32_matmul_precision(precision)
    monkeypatch.setattr(tci, "device_of", lambda model: ("cpu", (7, 0)))
    assert _loop(*_setup(), ["tensor-cores-idle"]).findings == []
    conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten())
    assert _loop(conv, torch.optim.SGD(conv.parameters(), lr=0.1), ["tensor-cores-idle"], steps=0).findings == []
