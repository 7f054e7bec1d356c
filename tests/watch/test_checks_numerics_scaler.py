"""nonfinite-values under GradScaler: a loss that stays NaN only shows as skipped steps."""

from __future__ import annotations

import torch
from conftest import mlp, session

SKIPPED_STEPS = 50  # the check's threshold: 50 halvings take any usual GradScaler scale below 1


def _scaled_loop(
    steps: int, nan_steps, init_scale: float = 2.0**16, checks="nonfinite-values", gain: float = 1.0, lr: float = 0.1
):
    """A GradScaler loop (CPU) whose loss is NaN on the steps in `nan_steps`."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    with session(model, opt, checks=checks) as s:
        for i in range(steps):
            opt.zero_grad()
            loss = model(torch.randn(4, 8)).square().mean() * gain
            scaler.scale(loss * float("nan") if i in nan_steps else loss).backward()
            scaler.step(opt)
            scaler.update()
    return s, opt


def test_a_loss_that_stays_nan_is_reported_once_the_scale_is_down_to_one():
    s, opt = _scaled_loop(SKIPPED_STEPS + 5, nan_steps=range(3, 10**6))
    first, where = s.findings
    assert (  # 2**16 halved at each skip: the 17th skip ran at scale 1
        "GradScaler skipped 17 of 20 SGD.step() calls (the first at step 3) and still skips at scale 1: the "
        "gradients are NaN/Inf without any scaling, first at step 3 in `0.weight`" in first.message
    )
    assert first.location.step == 3 and first.location.param == "0.weight"  # the steps before the NaN ran
    assert "NaN/Inf localisation" in where.message


def test_a_scaler_that_skips_most_but_not_all_steps_is_found():
    nan_steps = {i for i in range(60) if i % 5}  # 48 of 60 steps NaN: never 50 skips in a row
    s, opt = _scaled_loop(60, nan_steps=nan_steps)
    first = s.findings[0]
    assert first.name == "nonfinite-values" and "GradScaler skipped 17 of 22 " in first.message
    assert first.location.step == 1


def test_a_few_skipped_steps_then_training_resumes_is_quiet():
    s, _ = _scaled_loop(2 * SKIPPED_STEPS, nan_steps=range(3, 3 + 9))
    assert s.findings == []


def test_overflow_skips_while_the_scale_calibrates_are_quiet():
    s, _ = _scaled_loop(40, nan_steps=(), init_scale=2.0**127, checks=None, gain=10.0)  # Inf gradients at first
    assert 34 <= s.facts["optimizers"][0]["steps"] <= 38  # a few steps were skipped
    assert s.findings == []


def test_many_overflow_skips_from_a_huge_init_scale_are_quiet():
    """From init_scale 2**127 a loss of ~2**24 overflows (Inf, then NaN in the matmul gradients) for ~24 steps
    in a row: every step so far skipped, yet only calibration."""
    s, opt = _scaled_loop(30, nan_steps=(), init_scale=2.0**127, checks=None, gain=2.0**24, lr=1e-12)
    assert s.facts["optimizers"][0]["steps"] <= 30 - 10  # 10 or more steps skipped in a row
    assert s.findings == []
