"""Tiny real training loops on the CPU, and a session factory that collects findings instead of warning."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor.findings import Severity


@pytest.fixture(autouse=True)
def _small_and_seeded():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)


def mlp(d_in: int = 8, hidden: int = 16, d_out: int = 3) -> nn.Module:
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))


def batches(n: int = 6, size: int = 16, d_in: int = 8, classes: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(size, d_in, generator=g), torch.randint(0, classes, (size,), generator=g)) for _ in range(n)]


def train_step(
    model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, zero: bool = True
) -> torch.Tensor:
    if zero:
        opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


def session(model, opt=None, **kwargs):
    """A watch session that records findings (no warnings, no printed report)."""
    kwargs.setdefault("on_finding", lambda f: None)
    kwargs.setdefault("report", False)
    return torchdoctor.watch(model, opt, **kwargs)


def problems(s) -> list[str]:
    """Names of warning/error findings plus any internal error: what a correct loop must not produce."""
    return [
        f.name
        for f in s.findings
        if (f.severity or Severity.INFO) >= Severity.WARNING or "failed internally" in f.message
    ]


def names(s) -> list[str]:
    return [f.name for f in s.findings]
