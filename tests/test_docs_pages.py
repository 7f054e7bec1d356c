"""Docs pages and the registry stay in step: one page per check, each with the same sections."""
from pathlib import Path

import pytest
from click.testing import CliRunner

from torchdoctor import registry
from torchdoctor.cli import cli

DOCS = Path(__file__).resolve().parents[1] / "docs" / "checks"
SECTIONS = ("## Why it matters", "## How to fix", "## Bad", "## Good")
BUILTINS = [c for c in registry.all_checks() if c.origin == registry.BUILTIN_ORIGIN]


def test_every_page_belongs_to_a_check():
    names = {c.name for c in BUILTINS}
    orphans = sorted(p.stem for p in DOCS.glob("*.md") if p.stem not in names)
    assert orphans == []


@pytest.mark.parametrize("info", BUILTINS, ids=lambda c: c.name)
def test_every_check_has_a_complete_page(info):
    page = DOCS / f"{info.name}.md"
    assert page.is_file(), f"docs/checks/{info.name}.md is missing"
    text = page.read_text(encoding="utf-8")
    assert text.splitlines()[0] == f"# {info.name} ({info.code})"
    for section in SECTIONS:
        assert section in text, f"{page.name} lacks '{section}'"
    assert text.count("```") >= 4, f"{page.name} needs a bad and a good code example"


@pytest.mark.parametrize("info", BUILTINS[:3], ids=lambda c: c.name)
def test_explain_prints_the_page_by_name_and_code(info):
    for key in (info.name, info.code.lower()):
        result = CliRunner().invoke(cli, ["explain", key])
        assert result.exit_code == 0
        assert f"# {info.name} ({info.code})" in result.output
