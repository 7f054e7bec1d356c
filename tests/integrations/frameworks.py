"""Helpers of the real-framework tests: import a framework or skip (never under CI), and quiet sessions."""
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
