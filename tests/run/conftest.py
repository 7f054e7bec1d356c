"""Programs run in-process under the doctor (`run_script`), with sys.argv and sys.path restored afterwards."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from torchdoctor.run.doctor import RunResult, run_script
from torchdoctor.run.script import Target


@pytest.fixture(autouse=True)
def _restore_interpreter_state(monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def run_program(tmp_path):
    """Write `source` to tmp_path/<name> and run it under the doctor, findings collected (no warnings)."""

    def run(source: str, *args: str, name: str = "train.py", **options) -> RunResult:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source))
        options.setdefault("on_finding", lambda f: None)
        return run_script(Target(path=str(path), args=list(args)), **options)

    return run
