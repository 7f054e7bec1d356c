"""nondeterministic-settings and dataparallel-device at session start."""

from __future__ import annotations

import pytest
import torch
from conftest import mlp, names, session
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


@pytest.fixture
def cudnn_flags():
    saved = torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
    yield torch.backends.cudnn
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved


def test_default_settings_are_quiet_unless_reproducibility_is_asked_for():
    with session(mlp()) as s:
        pass
    assert s.findings == []


def test_deterministic_true_lists_what_is_missing(monkeypatch):
    monkeypatch.setattr(torch, "initial_seed", lambda: 2**63 - 25)  # as when manual_seed was never called
    loader = DataLoader(TensorDataset(torch.zeros(4, 1)), num_workers=2)
    with session(mlp(), loader=loader, deterministic=True) as s:
        pass
    messages = [f.message for f in s.findings]
    assert names(s) == ["nondeterministic-settings"] * 3
    assert all(str(f.severity) == "warning" for f in s.findings)
    assert any("deterministic algorithms are off" in m for m in messages)
    assert any("torch.manual_seed() was not called" in m for m in messages)
    assert any("uses 2 workers without generator=" in m for m in messages)
    assert "use_deterministic_algorithms(True)" in s.findings[0].fix.code


def test_benchmark_overriding_deterministic_is_an_info_note_even_by_default(cudnn_flags):
    cudnn_flags.benchmark, cudnn_flags.deterministic = True, True
    with session(mlp()) as s:
        pass
    [f] = s.findings
    assert (f.code, str(f.severity)) == ("TD310", "info") and "overrides cudnn.deterministic" in f.message


def test_settings_changed_during_the_run_are_seen_at_a_periodic_check(cudnn_flags, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what deterministic cuBLAS needs on a GPU machine
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.use_deterministic_algorithms(True)
    try:
        with session(model, opt, every=2, deterministic=True) as s:
            for step in range(4):
                if step == 1:
                    cudnn_flags.benchmark = True
                opt.zero_grad()
                model(torch.randn(2, 8)).sum().backward()
                opt.step()
    finally:
        torch.use_deterministic_algorithms(False)
    [f] = s.findings
    assert "cudnn.benchmark=True picks" in f.message and f.location.step == 2


def test_dataparallel_whose_module_is_not_on_device_ids_0(monkeypatch):
    dp = nn.DataParallel(mlp()).cpu()  # with a GPU it moved the module to cuda:0: move it back; without one,
    dp.device_ids, dp.src_device_obj = [0], torch.device("cuda", 0)  # pretend it was built with device_ids=[0]
    with session(dp) as s:
        pass
    [f] = s.findings
    assert (f.name, f.code, str(f.severity)) == ("dataparallel-device", "TD313", "error")
    assert "device_ids=[0]" in f.message and "`0.weight` on cpu" in f.message
    assert f.location.param == "0.weight"


def test_dataparallel_without_devices_and_an_optimizer_in_dataparallel():
    with session(nn.DataParallel(mlp())) as s:  # CPU: DataParallel just calls the module
        pass
    assert s.findings == []
    with pytest.raises(TypeError, match="wrap the model, not the optimizer"):
        session(mlp(), nn.DataParallel(mlp()))
