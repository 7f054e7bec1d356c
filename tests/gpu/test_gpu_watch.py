"""`torchdoctor.watch` on a real CUDA GPU: optimizer state on the wrong device, a retained graph with the
CUDA allocator trend, DataParallel placement, NaN under fp16/bf16 autocast (with GradScaler), cuDNN
determinism, and no host sync in a step where no check is due (run with ``pytest -m gpu``)."""

from __future__ import annotations

import os
import re

import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor.findings import Severity

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

EVERY = 10  # watch()'s default: the steps 0, 10, 20, ... run the periodic checks


def session(model, opt=None, **kwargs):
    kwargs.setdefault("on_finding", lambda f: None)
    kwargs.setdefault("report", False)
    return torchdoctor.watch(model, opt, **kwargs)


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(64 * 16, 10),
    )


def batch(n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 3, 32, 32, device="cuda"), torch.randint(0, 10, (n,), device="cuda")


def problems(s) -> list[str]:
    return [
        f"{f.name}: {f.message}"
        for f in s.findings
        if (f.severity or Severity.INFO) >= Severity.WARNING or "failed internally" in f.message
    ]


@pytest.fixture(autouse=True)
def _restore_cuda_flags():
    flags = (
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.are_deterministic_algorithms_enabled(),
    )
    yield
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = flags[:2]
    torch.use_deterministic_algorithms(flags[2])
    torch.cuda.set_sync_debug_mode(0)


def test_optimizer_state_loaded_before_model_to_cuda():
    model = cnn()
    opt = torch.optim.Adam(model.parameters())
    x, y = (t.cpu() for t in batch())
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    saved = opt.state_dict()
    model2 = cnn()
    opt2 = torch.optim.Adam(model2.parameters())
    opt2.load_state_dict(saved)  # the state takes the parameters' device now: the CPU
    model2.cuda()
    with session(model2, opt2, checks="optimizer-state-device") as s:
        x, y = batch()
        nn.functional.cross_entropy(model2(x), y).backward()
        with pytest.raises(RuntimeError):  # what the user sees without torchdoctor
            opt2.step()
    [f] = s.findings
    assert f.name == "optimizer-state-device" and "cpu" in f.message and "cuda:0" in f.message


def test_state_loaded_after_model_to_cuda_is_quiet():
    model = cnn().cuda()
    opt = torch.optim.Adam(model.parameters())
    with session(model, opt, checks="optimizer-state-device") as s:
        for _ in range(EVERY + 1):
            x, y = batch()
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    assert s.findings == []


def test_a_retained_graph_reports_the_cuda_allocator_slope():
    model = cnn().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    with session(model, opt, checks="graph-retention-leak") as s:
        for _ in range(60):  # the check compares the live graphs over a window of 50 steps
            x, y = batch()
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward(retain_graph=True)
            opt.step()
            losses.append(loss)  # keeps every step's graph and saved activations alive
    [f] = s.findings
    assert f.name == "graph-retention-leak"
    assert re.search(r"CUDA allocated memory grows by [\d.]+ MiB per step", f.message), f.message


def test_dataparallel_whose_module_left_cuda0():
    dp = nn.DataParallel(cnn())  # moves the module to cuda:0 ...
    dp.cpu()  # ... and this moves it back
    opt = torch.optim.SGD(dp.parameters(), lr=0.01)
    with session(dp, opt, checks="dataparallel-device") as s:
        pass
    [f] = s.findings
    assert f.name == "dataparallel-device" and str(f.severity) == "error"
    with pytest.raises(RuntimeError, match="cuda:0"):  # the claim: its forward fails
        dp(batch()[0])


def test_dataparallel_on_cuda0_is_quiet():
    dp = nn.DataParallel(cnn().cuda())
    opt = torch.optim.SGD(dp.parameters(), lr=0.01)
    with session(dp, opt, checks="dataparallel-device") as s:
        x, y = batch()
        nn.functional.cross_entropy(dp(x), y).backward()
        opt.step()
    assert s.findings == []


def _scaled_fp16_loop(steps: int, nan_from: int, init_scale: float = 2.0**16):
    model = cnn().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cuda", init_scale=init_scale)
    with session(model, opt) as s:
        for i in range(steps):
            x, y = batch()
            opt.zero_grad()
            with torch.autocast("cuda", dtype=torch.float16):
                loss = nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss * float("nan") if i >= nan_from else loss).backward()
            scaler.step(opt)
            scaler.update()
    return s, scaler


def test_fp16_gradscaler_nan_loss_is_reported_once_the_scaler_has_skipped_50_steps():
    s, _ = _scaled_fp16_loop(60, nan_from=5)
    first, where = [f for f in s.findings if f.name == "nonfinite-values"]
    assert (  # 2**16 halved at each skip: the 17th skip ran at scale 1
        "GradScaler skipped 17 of 22 SGD.step() calls (the first at step 5) and still skips at scale 1" in first.message
    )
    assert first.location.step == 5
    assert "finite outputs everywhere" in where.message  # the forward is fine: the NaN is in the loss


def test_fp16_gradscaler_overflow_skips_are_quiet():
    s, scaler = _scaled_fp16_loop(60, nan_from=10**6, init_scale=2.0**40)  # ~25 first steps overflow
    assert scaler.get_scale() < 2.0**40  # the scaler did skip steps
    assert problems(s) == []


def test_bf16_nan_between_periodic_checks_is_dated_to_its_step():
    model = cnn().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with session(model, opt) as s:
        for i in range(2 * EVERY + 1):
            x, y = batch()
            opt.zero_grad()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(model(x), y)
            (loss * float("nan") if i == 13 else loss).backward()
            opt.step()
    first = next(f for f in s.findings if f.name == "nonfinite-values")
    assert first.location.step == 13 and "at step 13" in first.message
    assert "on a GPU these flags are read at the periodic steps" in first.message


@pytest.mark.parametrize("dtype", [None, torch.float16, torch.bfloat16])
def test_no_host_sync_in_a_step_where_no_check_is_due(dtype):
    model = cnn().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with session(model, opt) as s:  # every default check
        for i in range(3 * EVERY):
            x, y = batch()
            torch.cuda.set_sync_debug_mode("error" if i % EVERY else 0)  # a sync raises inside the check
            opt.zero_grad()
            with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            torch.cuda.set_sync_debug_mode(0)
    assert problems(s) == []  # an internal error would name the check that synchronised


def test_cudnn_benchmark_under_deterministic_is_a_warning_and_the_recipe_is_quiet(monkeypatch):
    model = cnn().cuda()
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    with session(model, deterministic=True, checks="nondeterministic-settings") as s:
        pass
    [f] = [f for f in s.findings if "cudnn.benchmark=True" in f.message]
    assert str(f.severity) == "warning"
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True)
    monkeypatch.setitem(os.environ, "CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    with session(model, deterministic=True, checks="nondeterministic-settings") as s:
        model(batch()[0])  # (adaptive pooling has no deterministic CUDA backward)
    assert s.findings == []
