"""`torchdoctor lint PATH...`: find files, run the source checks, rewrite (--fix/--diff), report."""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Optional, Sequence

import click

from torchdoctor import registry
from torchdoctor.cli import InputError, emit, project_config, resolve_fail_on, selected_checks
from torchdoctor.lint.cache import LintCache, default_cache_dir
from torchdoctor.lint.files import Pattern, compile_pattern
from torchdoctor.lint.fixes import apply_edits, file_edits, unified_diff
from torchdoctor.lint.output import text_line, to_sarif
from torchdoctor.lint.runner import LintResult, lint_paths, read_source
from torchdoctor.report import Report, exit_code

if TYPE_CHECKING:
    from rich.text import Text


def facts_view(facts: dict[str, Any]) -> "Text":
    """The one-line structure view of a lint run for the console report."""
    from rich.text import Text  # console output only: text, json and sarif runs skip importing rich

    files = facts.get("files", 0)
    text = Text(f"Checked {counted(files, 'Python file')} in {facts.get('seconds', 0):.2f} s", style="dim")
    reused = files - facts.get("checked", files)
    if reused:
        text.append(f" ({reused} unchanged, results from the cache)", style="dim")
    if facts.get("unreadable"):
        text.append(f"; {len(facts['unreadable'])} could not be read", style="dim")
    if facts.get("fixed"):
        text.append(f"; fixed {counted(facts['fixed'], 'finding')}", style="dim")
    return text


def counted(n: int, noun: str) -> str:
    """`1 file`, `2 files`."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def run_lint(paths: Sequence[str], fmt: str, select: tuple[str, ...], ignore: tuple[str, ...], fail_on: str,
             exclude: tuple[str, ...], fix: bool, diff: bool, use_cache: bool = True) -> None:
    """Lint `paths`, apply or show the safe rewrites, print the report and exit with its code."""
    checks = selected_checks(registry.Scope.SOURCE, select, ignore)
    config = project_config()
    root = os.path.dirname(config.path) if config.path else None
    excludes = [*(compile_pattern(e, root or "") for e in config.exclude), *exclude]  # the table's patterns: from its folder
    cache = LintCache(default_cache_dir(), root or os.getcwd(), checks) if use_cache else None
    # Cached results carry no rewrites: --fix and --diff check every file afresh.
    result = _lint(paths or ["."], checks, excludes, None if fix or diff else cache)
    fixed = 0
    if diff or fix:
        changes = _rewrites(result)
        if diff:
            for path, (before, after, _) in changes.items():
                click.echo(unified_diff(path, before, after), nl=False)
            sys.exit(1 if changes else 0)
        for path, (_, after, count) in changes.items():
            with open(path, "w", encoding="utf-8", newline="") as fh:
                fh.write(after)
            fixed += count
        if changes:
            click.echo(f"torchdoctor: fixed {counted(fixed, 'finding')} in {counted(len(changes), 'file')}", err=True)
            result = _lint(paths or ["."], checks, excludes, cache)
    fail_on = resolve_fail_on(fail_on)
    if fmt == "text":
        for f in result.findings:
            click.echo(text_line(f))
        sys.exit(exit_code(result.findings, fail_on))
    if fmt == "sarif":
        click.echo(to_sarif(result.findings, checks))
        sys.exit(exit_code(result.findings, fail_on))
    facts = result.facts()
    if fixed:
        facts["fixed"] = fixed
    subject = ", ".join(paths) if paths else "."
    emit(Report(scope="source", findings=result.findings, facts=facts, subject=subject), fmt, fail_on, facts_view)


def _lint(paths: Sequence[str], checks: list, excludes: Sequence["str | Pattern | None"],
          cache: Optional[LintCache]) -> LintResult:
    try:
        return lint_paths(paths, checks, [e for e in excludes if e is not None], cache=cache)
    except FileNotFoundError as exc:
        raise InputError(f"no such file or directory: {exc.args[0]}") from None


def _rewrites(result: LintResult) -> dict[str, tuple[str, str, int]]:
    """display path -> (text before, text after, findings fixed) for every file with applicable edits."""
    changes = {}
    for path, edits in file_edits(result.findings).items():
        if not _plain_utf8(path):
            continue  # rewriting would change its encoding (a BOM, or a declared `coding:`)
        src = read_source(os.path.abspath(path), path)
        after = apply_edits(src.text, edits) if src.tree is not None else None
        if after is not None and after != src.text:
            count = sum(1 for f in result.findings if getattr(f, "edits", ()) and f.location and f.location.file == path)
            changes[path] = (src.text, after, count)
    return changes


def _plain_utf8(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
        data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return not data.startswith(b"\xef\xbb\xbf")
