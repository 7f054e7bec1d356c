"""Helpers for the lint tests: lint a snippet of source (or a small project) and look at the findings."""
import textwrap
from typing import Callable, Optional

import pytest

from torchdoctor import registry
from torchdoctor.findings import Finding
from torchdoctor.lint.runner import check_source, read_source
from torchdoctor.lint.source import ProjectFacts

SOURCE_CHECKS = registry.all_checks(registry.Scope.SOURCE)


@pytest.fixture
def lint(tmp_path) -> Callable[..., list[Finding]]:
    """lint(code, name="train.py", others={"utils.py": "..."}) -> findings for `name` (others only inform)."""

    def run(code: str, name: str = "train.py", others: Optional[dict] = None) -> list[Finding]:
        project = ProjectFacts()
        files = {name: code, **(others or {})}
        sources = {}
        for fname, text in files.items():
            path = tmp_path / fname
            path.write_text(textwrap.dedent(text), encoding="utf-8")
            sources[fname] = read_source(str(path), fname, project)
        return check_source(sources[name], SOURCE_CHECKS)

    return run


def names(findings: list[Finding]) -> list[str]:
    return sorted(f.name for f in findings)


@pytest.fixture
def fired():
    """fired(findings, name) -> the findings of that check."""
    return lambda findings, name: [f for f in findings if f.name == name]
