#!/usr/bin/env python
"""Maintainer tasks for pitfall definitions.

    python scripts/pitfalls.py docs                      # regenerate docs/checks/*.md from the definitions
    python scripts/pitfalls.py new NAME --door runtime   # allocate the next code, write definition + test stubs

`new` picks the next free code in the door's family (TD1xx env, TD2xx checkpoint, TD3xx runtime, TD4xx
distributed, TD5xx source; ``--family`` overrides) and writes ``checks/<name>.py`` and
``tests/pitfalls/test_<name>.py``; fill in the documentation fields, the detector and the tests, then run
``docs``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
FAMILY = {"env": 1, "checkpoint": 2, "runtime": 3, "distributed": 4, "source": 5}

DETECTOR = {
    "env": (
        "from torchdoctor.sdk.env import EnvFacts\n",
        "@{const}.env\ndef {func}(facts: EnvFacts) -> Iterator[Finding]:\n"
        '    """What in the facts shows the pitfall; each finding gets a `Fix(title, code)`."""\n'
        "    return iter(())\n",
    ),
    "checkpoint": (
        "from torchdoctor.sdk.checkpoint import CheckpointInfo\n",
        "@{const}.checkpoint\ndef {func}(info: CheckpointInfo) -> Iterator[Finding]:\n"
        '    """What in the checkpoint shows the pitfall; each finding gets a `Fix(title, code)`."""\n'
        "    return iter(())\n",
    ),
    "runtime": (
        "from torchdoctor.sdk.runtime import RuntimeCheck, StepEvent\n",
        "@{const}.runtime\nclass {cls}(RuntimeCheck):\n"
        '    """What the check watches, and when it reports; each finding gets a `Fix(title, code)`."""\n\n'
        "    def on_step_pre(self, event: StepEvent) -> Iterator[Finding]:\n        return iter(())\n",
    ),
    "source": (
        "from torchdoctor.sdk.source import SourceFile\n",
        "@{const}.source\ndef {func}(src: SourceFile) -> Iterator[Finding]:\n"
        '    """What in the source shows the pitfall; each finding gets a `Fix(title, code)`."""\n'
        "    return iter(())\n",
    ),
}

DEFINITION = '''"""{name}: ONE LINE ON WHAT GOES WRONG."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Pitfall
{imports}
{const} = Pitfall(
    code="{code}",
    name="{name}",
    severity="warning",  # error: the run is wrong or will crash; warning: likely wrong or wasteful; info
    summary="ONE SENTENCE: WHAT GOES WRONG.",
    why="""WHY IT MATTERS (Markdown): the symptom users see, and the cause.""",
    fix="""HOW TO FIX IT (Markdown), with the code to paste.""",
    bad=Example(
        """THE CODE THAT HAS THE BUG (shown on the page; the contract test runs it: it must fire)""",
        setup="""HIDDEN CODE THAT MAKES IT A COMPLETE PROGRAM (a runtime example binds `model` and `optimizer`)""",
    ),
    good=Example(
        """THE BAD CODE WITH THE FIX PASTED IN (it must stay quiet)""",
        setup="""THE SAME SETUP""",
    ),
    details={{{details}}},
    silence="",  # anything beyond the standard ways of silencing a finding, or nothing
    since="{since}",
)


{detectors}'''

DETAIL = '        "{door}": """HOW THE {door} DETECTOR DECIDES, AND WHAT IT DELIBERATELY DOES NOT FLAG.""",'

# checks/ is installed as torchdoctor.checks, so ruff's import order counts it as third-party (with pytest)
TEST = '''"""{name} ({code}): fires on a real tiny program, stays quiet on correct code."""

import pytest
from torchdoctor.checks.{module} import {const}

from torchdoctor.sdk.testing import run_example

DOORS = [{doors}]


@pytest.mark.parametrize("door", DOORS)
def test_bad_example_fires(door: str) -> None:
    assert run_example({const}, {const}.bad, door)


@pytest.mark.parametrize("door", DOORS)
def test_good_example_is_quiet(door: str) -> None:
    assert run_example({const}, {const}.good, door) == []


def test_quiet_on_what_it_must_not_flag() -> None:
    raise AssertionError("write the must-NOT-flag cases: the correct code that looks most like the bug")
'''


@click.group()
def main() -> None:
    """Maintainer tasks for pitfall definitions."""
    sys.path.insert(0, str(ROOT))


@main.command()
def docs() -> None:
    """Regenerate docs/checks/ and the checks' scope index (checks/_scopes.py) from the pitfall definitions."""
    from torchdoctor.docs import pages

    from torchdoctor.registry import scope_index

    index = ROOT / "checks" / "_scopes.py"
    if not index.exists() or index.read_text(encoding="utf-8") != scope_index():
        index.write_text(scope_index(), encoding="utf-8")
        click.echo(f"wrote {index.relative_to(ROOT)}")

    folder = ROOT / "docs"
    wanted = pages()
    for stale in (folder / "checks").glob("*.md"):
        if f"checks/{stale.name}" not in wanted:
            stale.unlink()
            click.echo(f"removed {stale.relative_to(ROOT)}")
    for rel, text in wanted.items():
        path = folder / rel
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            click.echo(f"wrote {path.relative_to(ROOT)}")


@main.command()
@click.argument("name")
@click.option(
    "--door",
    "doors",
    multiple=True,
    required=True,
    type=click.Choice(sorted(DETECTOR)),
    help="A front door that detects it (repeatable).",
)
@click.option("--family", type=click.IntRange(1, 9), default=None, help="Code family (the first digit).")
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=ROOT,
    show_default=True,
    help="The repository to write into.",
)
def new(name: str, doors: tuple[str, ...], family: "int | None", root: Path) -> None:
    """Allocate the next code and write the definition and test stubs for pitfall NAME."""
    from torchdoctor import __version__, registry

    if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name):
        raise click.UsageError(f"{name!r} must be kebab-case, e.g. train-mode-not-restored")
    if any(p.name == name for p in registry.all_checks()):
        raise click.UsageError(f"{name} already exists")
    first = family or FAMILY[doors[0]]
    used = {int(p.code[2:]) for p in registry.all_checks() if p.code.startswith(f"TD{first}")}
    code = f"TD{max(used, default=first * 100) + 1}"
    module = name.replace("-", "_")
    const = module.upper()
    cls = "".join(part.title() for part in name.split("-"))
    functions = [d for d in doors if d != "runtime"]  # a runtime detector is a class
    definition = root / "checks" / f"{module}.py"
    test = root / "tests" / "pitfalls" / f"test_{module}.py"
    for path in (definition, test):
        if path.exists():
            raise click.UsageError(f"{path} already exists")
        path.parent.mkdir(parents=True, exist_ok=True)
    definition.write_text(
        DEFINITION.format(
            name=name,
            code=code,
            const=const,
            since=__version__,
            imports="".join(sorted(DETECTOR[d][0] for d in doors)),
            details="\n" + "\n".join(DETAIL.format(door=d) for d in doors) + "\n    ",
            detectors="\n\n".join(
                DETECTOR[d][1].format(const=const, func=module if len(functions) < 2 else f"{module}_{d}", cls=cls)
                for d in doors
            ),
        ),
        encoding="utf-8",
    )
    test.write_text(
        TEST.format(name=name, code=code, module=module, const=const, doors=", ".join(f'"{d}"' for d in doors)),
        encoding="utf-8",
    )
    click.echo(f"{code} {name}: wrote {definition} and {test}")


if __name__ == "__main__":
    main()
