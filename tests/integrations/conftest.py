"""Real Lightning, transformers and accelerate loops (the `integrations` extra). Where a library is missing
its tests skip, except under CI (the CI variable set), where the extra is installed and a skip would hide
a failure."""
from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest
import torch

from torchdoctor.findings import Severity


def need(module: str) -> ModuleType:
    """Import `module`, or skip the test; under CI a missing library is an error, never a skip."""
    if os.environ.get("CI"):
        return importlib.import_module(module)
    return pytest.importorskip(module)


def problems(session) -> list[str]:
    """Warning/error findings and internal errors: what a correct loop must not produce."""
    return [f.name for f in session.findings
            if (f.severity or Severity.INFO) >= Severity.WARNING or "failed internally" in f.message]


def quiet(**kwargs):
    """watch() keyword arguments that collect findings without warnings or a printed report."""
    return {"on_finding": lambda f: None, "report": False, **kwargs}


@pytest.fixture(autouse=True)
def _one_thread_and_seeded():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)
