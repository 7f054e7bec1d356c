"""Helpers of the real-framework tests: import a framework or skip (never when the installed torchdoctor's
`test` extra declares it: then a missing library is an error), and quiet sessions."""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from types import ModuleType

import pytest

from torchdoctor.findings import Severity


def _extra(requirements: list[str], extra: str) -> set[str]:
    """Distribution names (lower case, with any [extras] kept) that `extra` requires."""
    marker = re.compile(rf"""extra\s*==\s*["']{extra}["']""")
    return {re.split(r"[<>=!~;\s]", r, maxsplit=1)[0].lower() for r in requirements if marker.search(r)}


def declared_for_tests(distribution: str) -> bool:
    """The installed torchdoctor's `test` extra requires `distribution` (directly, or via its own
    `integrations` extra)."""
    try:
        requirements = importlib.metadata.requires("torchdoctor") or []
    except importlib.metadata.PackageNotFoundError:
        return False
    test = _extra(requirements, "test")
    if "torchdoctor[integrations]" in test:
        test |= _extra(requirements, "integrations")
    return distribution in test


def need(module: str) -> ModuleType:
    """Import `module`, or skip the test; an error where the `test` extra declares it."""
    if declared_for_tests(module):
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"{module} is not installed (pip install -e '.[integrations]')")


def problems(session) -> list[str]:
    """Warning/error findings and internal errors: what a correct loop must not produce."""
    return [
        f.name
        for f in session.findings
        if (f.severity or Severity.INFO) >= Severity.WARNING or "failed internally" in f.message
    ]


def quiet(**kwargs):
    """watch() keyword arguments that collect findings without warnings or a printed report."""
    return {"on_finding": lambda f: None, "report": False, **kwargs}
