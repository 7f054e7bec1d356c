"""Loops whose model is never called as a whole (Lightning's training_step) and closure optimizers (LBFGS,
Lightning's automatic optimization): the checks see the real forwards and the real gradients."""

from __future__ import annotations

import torch
from conftest import batches, names, problems, session
from torch import nn


class LitStyle(nn.Module):
    """Written as in Lightning's docs: training_step calls the submodules, never self(x)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.1))
        self.head = nn.Linear(16, 3)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.head(self.encoder(x)), y)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return self.training_step(batch)


def _fit(model: LitStyle, opt: torch.optim.Optimizer, steps: int = 4, keep: list | None = None) -> None:
    for batch in batches(steps):
        opt.zero_grad()
        loss = model.training_step(batch)
        loss.backward()
        opt.step()
        if keep is not None:
            keep.append(loss)


def test_a_model_driven_through_training_step_is_seen_through_its_last_child():
    model = LitStyle()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with session(model, opt) as s:
        _fit(model, opt)
        with torch.no_grad():  # validation without model.eval()
            for batch in batches(4):
                model.validation_step(batch)
    assert names(s) == ["train-mode-in-eval"]
    assert s.facts["models"][0]["forward_seen_through"] == "Linear"


def test_eval_without_no_grad_and_graph_leaks_under_training_step():
    model = LitStyle()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept: list[torch.Tensor] = []
    with session(model, opt) as s:
        _fit(model, opt, steps=60, keep=kept)
        model.eval()
        for batch in batches(3):
            model.validation_step(batch).item()  # grad on: graphs built and dropped
    assert names(s) == ["graph-retention-leak", "eval-without-no-grad"]


def test_a_correct_training_step_loop_is_quiet():
    model = LitStyle()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with session(model, opt, every=1) as s:
        _fit(model, opt, steps=8)
        model.eval()
        with torch.no_grad():
            for batch in batches(3):
                model.validation_step(batch)
        model.train()
        _fit(model, opt, steps=2)
    assert problems(s) == []


def _lbfgs_run(zero: bool, nan_at: int | None = None, steps: int = 4):
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    with session(model, opt) as s:
        for i, (x, y) in enumerate(batches(steps)):

            def closure(x: torch.Tensor = x, y: torch.Tensor = y, i: int = i) -> torch.Tensor:
                if zero:
                    opt.zero_grad()
                out = model(x)
                if i == nan_at:
                    out = out * float("nan")
                loss = nn.functional.cross_entropy(out, y)
                loss.backward()
                return loss

            opt.step(closure)
    return s


def test_lbfgs_with_zero_grad_in_the_closure_is_quiet():
    assert problems(_lbfgs_run(zero=True)) == []


def test_lbfgs_without_zero_grad_in_the_closure_is_missing_zero_grad():
    s = _lbfgs_run(zero=False)
    assert names(s) == ["missing-zero-grad"]
    assert s.findings[0].location.step == 1


def test_lbfgs_nan_is_reported_at_the_step_that_produced_it():
    s = _lbfgs_run(zero=True, nan_at=2)
    first = s.findings[0]
    assert (first.name, first.location.step) == ("nonfinite-values", 2)
    assert "all 4 parameters have non-finite gradients" in first.message
