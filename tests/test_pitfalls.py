"""The contract every pitfall keeps: a complete definition, a fresh generated page, and examples that its
own detectors judge right (Bad fires, Good stays quiet) in every door that can see them."""

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from torchdoctor.docs import pages

from torchdoctor import findings, registry
from torchdoctor.cli import cli
from torchdoctor.sdk import Scope
from torchdoctor.sdk.testing import paste_problems, run_example

DOCS = Path(__file__).resolve().parents[1] / "docs"
BUILTINS = [c for c in registry.all_checks() if c.origin == registry.BUILTIN_ORIGIN]
RUNNABLE = [(p, scope) for p in BUILTINS for scope in p.scopes]


def test_generated_pages_are_fresh():
    wanted = pages()
    stale = sorted(
        rel
        for rel, text in wanted.items()
        if not (DOCS / rel).is_file() or (DOCS / rel).read_text(encoding="utf-8") != text
    )
    orphans = sorted(f"checks/{p.name}" for p in (DOCS / "checks").glob("*.md") if f"checks/{p.name}" not in wanted)
    assert (stale, orphans) == ([], []), "run `python scripts/pitfalls.py docs` and commit the result"


def test_scope_index_is_fresh():
    index = Path(__file__).resolve().parents[1] / "checks" / "_scopes.py"
    assert index.read_text(encoding="utf-8") == registry.scope_index(), (
        "run `python scripts/pitfalls.py docs` and commit the result"
    )


@pytest.mark.parametrize("pitfall", BUILTINS, ids=lambda p: p.name)
def test_every_door_either_sees_the_examples_or_says_why(pitfall):
    for example in (pitfall.bad, pitfall.good):
        for scope in pitfall.scopes:
            assert example.runnable(scope) or example.unseen.get(str(scope), "").strip(), (
                f"{pitfall.name}: the {scope} detector can't run this {example.language} example; "
                f"say why in Example(unseen={{'{scope}': ...}})"
            )
        assert set(example.unseen) <= {str(s) for s in pitfall.scopes}


@pytest.mark.parametrize(("pitfall", "scope"), RUNNABLE, ids=lambda v: v.name if hasattr(v, "name") else str(v))
def test_bad_example_fires_and_good_example_is_quiet(pitfall, scope, text_fixes):
    if pitfall.bad.runnable(scope):
        assert run_example(pitfall, pitfall.bad, scope), f"{pitfall.name}: the Bad example passes {scope} unflagged"
        checks = [m.removeprefix("torchdoctor.checks.") for m in text_fixes if m.startswith("torchdoctor.checks.")]
        assert checks == [], f"{pitfall.name}: a built-in check gave a fix as text, not as Fix(title, code)"
    if pitfall.good.runnable(scope):
        found = run_example(pitfall, pitfall.good, scope)
        assert found == [], f"{pitfall.name}: the Good example is flagged in {scope}: {found[0].message}"


@pytest.fixture
def text_fixes(monkeypatch):
    """`module:line` of each finding given its fix as text while the test runs (the path `Fix.parse` takes)."""
    made = []
    parse = findings._parsed_fix

    def record(text):
        frame = sys._getframe(1)
        while frame.f_back is not None and frame.f_code.co_name in ("__set__", "__init__", "__post_init__"):
            frame = frame.f_back
        made.append(f"{frame.f_globals.get('__name__', '?')}:{frame.f_lineno}")
        return parse(text)

    monkeypatch.setattr(findings, "_parsed_fix", record)
    return made


@pytest.mark.parametrize(
    ("pitfall", "scope"),
    [(p, s) for p, s in RUNNABLE if p.bad.runnable(s)],
    ids=lambda v: v.name if hasattr(v, "name") else str(v),
)
def test_the_fix_works_when_pasted_into_the_bad_example(pitfall, scope):
    """Good example = Bad example with the fix's code pasted in (so the test above proves that the pasted fix
    runs and silences the finding); a checkpoint fix runs when pasted after the Bad example."""
    assert paste_problems(pitfall, scope) == []


def test_some_example_runs_in_every_executable_door():
    doors = {scope for p, scope in RUNNABLE if p.bad.runnable(scope)}
    assert {Scope.SOURCE, Scope.RUNTIME, Scope.CHECKPOINT} <= doors


@pytest.mark.parametrize("pitfall", BUILTINS[:3], ids=lambda p: p.name)
def test_explain_prints_the_generated_page_by_name_and_code(pitfall):
    for key in (pitfall.name, pitfall.code.lower()):
        result = CliRunner().invoke(cli, ["explain", key])
        assert result.exit_code == 0
        assert f"# {pitfall.name} ({pitfall.code})" in result.output
