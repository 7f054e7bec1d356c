"""Helpers of the run tests: the findings of a run, and a plain training loop to plant pitfalls in."""

from __future__ import annotations

from torchdoctor.findings import Severity
from torchdoctor.run.doctor import RunResult


def problems(result: RunResult) -> list[str]:
    """Names of the warning/error findings of a run."""
    return sorted({f.name for f in result.report.findings if (f.severity or Severity.INFO) >= Severity.WARNING})


# A plain loop: setup code is prepended; {step} is the body of one step.
LOOP = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = [(torch.randn(16, 8), torch.randint(0, 3, (16,))) for _ in range(6)]
for x, y in data:
{step}
"""
GOOD_STEP = """\
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
"""
