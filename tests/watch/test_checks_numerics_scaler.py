"""nonfinite-values under GradScaler: a loss that stays NaN only shows as skipped steps."""
from __future__ import annotations

import torch
from torch import nn

from conftest import mlp, session

SKIPPED_STEPS = 50  # the check's threshold: 50 halvings take any usual GradScaler scale below 1


def _scaled_loop(steps: int, nan_from: int, nan_until: int):
    """A GradScaler loop (CPU) whose loss is NaN on the steps in [nan_from, nan_until)."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    with session(model, opt, checks="nonfinite-values") as s:
        for i in range(steps):
            opt.zero_grad()
            loss = model(torch.randn(4, 8)).square().mean()
            scaler.scale(loss * float("nan") if nan_from <= i < nan_until else loss).backward()
            scaler.step(opt)
            scaler.update()
    return s, opt


def test_a_loss_that_stays_nan_is_reported_after_the_skipped_steps():
    s, opt = _scaled_loop(SKIPPED_STEPS + 5, nan_from=3, nan_until=10**6)
    first, where = s.findings
    assert f"SGD.step() was skipped {SKIPPED_STEPS} times in a row" in first.message
    assert first.location.step == 3  # the steps before the NaN ran; none after
    assert "NaN/Inf localisation" in where.message


def test_a_few_skipped_steps_then_training_resumes_is_quiet():
    s, _ = _scaled_loop(2 * SKIPPED_STEPS, nan_from=3, nan_until=3 + SKIPPED_STEPS - 1)
    assert s.findings == []
