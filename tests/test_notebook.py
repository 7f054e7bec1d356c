"""Notebook use through IPython's own shell, in this process: warnings once per cell run, reports as HTML."""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path
from typing import Iterator

import pytest

pytest.importorskip("IPython", reason="IPython is in the test extra")
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402

import torchdoctor  # noqa: E402
from torchdoctor.errors import TorchDoctorWarning  # noqa: E402

SETUP = """
import torch
from torch import nn
import torchdoctor

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
session = torchdoctor.watch(model, opt, report=False).start()
"""
TRAIN = """
for _ in range(5):
    nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,))).backward()
    opt.step()
"""


@pytest.fixture
def shell() -> Iterator[InteractiveShell]:
    shell = InteractiveShell.instance()
    yield shell
    shell.run_cell("session.stop()", store_history=True)
    InteractiveShell.clear_instance()  # later tests run outside a notebook again


def _cell(shell: InteractiveShell, code: str) -> list[str]:
    """Run one cell as Jupyter does; the torchdoctor warnings shown, under Python's default filter."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        result = shell.run_cell(code, store_history=True)
    result.raise_error()
    return [str(w.message).split(":")[0] for w in caught if issubclass(w.category, TorchDoctorWarning)]


def test_watch_warns_once_per_cell_run_not_per_step(shell: InteractiveShell) -> None:
    assert _cell(shell, SETUP) == []
    assert _cell(shell, TRAIN) == ["TD301 missing-zero-grad"]  # 4 steps without zero_grad, one warning
    assert _cell(shell, TRAIN) == ["TD301 missing-zero-grad"]  # the cell run again: said again, once
    assert (
        _cell(shell, "opt.zero_grad()\n" + TRAIN.replace("    opt.step()", "    opt.step()\n    opt.zero_grad()")) == []
    )
    [finding] = shell.user_ns["session"].findings
    assert finding.count == 9  # every repeat is counted for the report: 4, then 5 (the first step adds to cell 2's)


def test_reports_render_as_rich_notebook_output(shell: InteractiveShell, tmp_path: Path) -> None:
    _cell(shell, SETUP)
    _cell(shell, TRAIN)
    data, _ = shell.display_formatter.format(shell.user_ns["session"])  # what a cell ending in `session` shows
    html = data["text/html"]
    assert html.startswith('<pre style="white-space:pre;overflow-x:auto') and 'style="color:' in html
    assert "TD301" in html and "missing-zero-grad" in html and "optimizer" in html  # findings and the facts view
    assert "TD301 missing-zero-grad" in data["text/plain"] and "<" not in data["text/plain"].split("\n")[0]

    class Payload:
        def __reduce__(self) -> tuple:
            return (os.system, ("echo pwned",))

    path = tmp_path / "evil.pth"
    path.write_bytes(pickle.dumps(Payload()))
    data, _ = shell.display_formatter.format(torchdoctor.check_checkpoint(str(path)))
    assert "TD201" in data["text/html"] and "posix.system" in data["text/html"] and "evil.pth" in data["text/plain"]
