"""Helpers for the lint tests: lint a snippet of source (or a small project) and look at the findings.

As ruff's `test_case(Rule::X, fixture)`: a rule's test names its rule with `@pytest.mark.rule("name")` and the
`lint` fixture runs only that rule, so a new rule never breaks another rule's tests. Whether any rule fires on
correct code is asked once, by the false-positive corpus (test_false_positive_corpus.py).
"""

import textwrap
from typing import Callable, Optional

import pytest

from torchdoctor import registry
from torchdoctor.findings import Finding
from torchdoctor.lint.runner import check_source, read_source
from torchdoctor.lint.source import ProjectFacts

SOURCE_CHECKS = registry.all_checks(registry.Scope.SOURCE)
# The rules the engine and command-line tests (cache, runner, program model, CLI) expect findings from: a rule
# added later does not run there, so a new rule cannot change what those tests see.
ENGINE_RULES = (
    "missing-zero-grad",
    "stale-optimizer-params",
    "optimizer-state-device",
    "eval-without-no-grad",
    "graph-retention-leak",
    "nondeterministic-settings",
    "sampler-epoch-not-set",
    "local-rank-argument",
    "to-result-discarded",
    "shuffle-with-sampler",
    "unsafe-torch-load",
    "prefix-strip-by-slicing",
    "dataparallel-optimizer",
    "deprecated-api",
    "source-unreadable",
)
ENGINE_CHECKS = [registry.get(name) for name in ENGINE_RULES]


def pytest_configure(config):
    config.addinivalue_line("markers", "rule(*names): the lint rules a test asks about (the only ones it runs)")


@pytest.fixture(autouse=True)
def _command_line_runs_the_engine_rules(monkeypatch):
    """`torchdoctor lint` invoked by a test selects ENGINE_RULES (through the environment layer, which an
    explicit --select replaces)."""
    monkeypatch.setenv("TORCHDOCTOR_SELECT", ",".join(ENGINE_RULES))


def asked_rules(request) -> list:
    """The checks the current test names with `@pytest.mark.rule(...)`; a test that names none is a mistake."""
    marker = request.node.get_closest_marker("rule")
    if marker is None or not marker.args:
        pytest.fail(f'{request.node.name} lints without naming its rule: add @pytest.mark.rule("name")')
    return [registry.get(name) for name in marker.args]


@pytest.fixture
def rule_checks(request) -> list:
    return asked_rules(request)


@pytest.fixture
def lint(tmp_path, rule_checks) -> Callable[..., list[Finding]]:
    """lint(code, name="train.py", others={"utils.py": "..."}) -> the findings of the test's rule(s) for `name`
    (others only inform)."""
    return lambda code, name="train.py", others=None: lint_snippet(tmp_path, code, rule_checks, name, others)


def lint_snippet(folder, code: str, checks, name: str = "train.py", others: Optional[dict] = None) -> list[Finding]:
    """Write `code` (and `others`) under `folder` and lint `name` with `checks`."""
    project = ProjectFacts()
    files = {name: code, **(others or {})}
    sources = {}
    for fname, text in files.items():
        path = folder / fname
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
        sources[fname] = read_source(str(path), fname, project)
    return check_source(sources[name], checks)


def names(findings: list[Finding]) -> list[str]:
    return sorted(f.name for f in findings)


@pytest.fixture
def fired():
    """fired(findings, name) -> the findings of that check."""
    return lambda findings, name: [f for f in findings if f.name == name]
