"""`torchdoctor lint PATH...`: find training-loop pitfalls in source; --fix/--diff apply or show the safe rewrites."""
from __future__ import annotations

import os
import sys
from typing import Optional

import click

from torchdoctor import selection
from torchdoctor.cli.options import InputError, checks_for, emit, report_options, settings_for
from torchdoctor.report import exit_code


@click.command()
@report_options(formats=("console", "json", "text", "sarif"),
                format_help="Rich console report, one JSON document, one `path:line:col: CODE name message` "
                            "line per finding (text), or SARIF 2.1.0 for code-scanning UIs.")
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--exclude", multiple=True, metavar="PATTERN",
              help="Skip files and folders matching this gitignore-style pattern (repeatable).")
@click.option("--fix", is_flag=True, help="Apply the safe rewrites (local-rank-argument, unsafe-torch-load, "
              "prefix-strip-by-slicing) in place.")
@click.option("--diff", is_flag=True,
              help="Print the safe rewrites as a unified diff and change nothing (exit 1 when there is one).")
@click.option("--statistics", is_flag=True, help="Print how many findings each check has (most first) instead "
              "of the findings.")
@click.option("--no-cache", is_flag=True, help="Check every file, ignoring and not updating the results cache "
              "(kept in $TORCHDOCTOR_CACHE_DIR, default ~/.cache/torchdoctor).")
def lint(fmt: str, select: tuple[str, ...], ignore: tuple[str, ...], fail_on: Optional[str], paths: tuple[str, ...],
         exclude: tuple[str, ...], fix: bool, diff: bool, statistics: bool, no_cache: bool) -> None:
    """Find training-loop pitfalls in Python source (files or folders; default: the current folder).

    Silence one line with `# torchdoctor: ignore[name]`; project defaults go in `[tool.torchdoctor]` of the
    nearest pyproject.toml above the paths. A file that cannot be read is always reported (source-unreadable).
    Unchanged files are not checked again: their results come from a cache (see --no-cache).
    """
    from torchdoctor.lint.command import Linter, apply_rewrites, counted, facts_view, render_console, rewrites

    settings = settings_for(paths or ["."], select, ignore, fail_on, exclude)
    linter = Linter(paths, settings, checks_for(selection.LINT, settings), use_cache=not no_cache)
    try:
        result = linter.run(cached=not (fix or diff), show_progress=fmt == "console")
        fixed = 0
        if diff or fix:
            changes = rewrites(result)
            if diff:
                from torchdoctor.lint.fixes import unified_diff

                for path, (before, after, _) in changes.items():
                    click.echo(unified_diff(path, before, after), nl=False)
                sys.exit(1 if changes else 0)
            if changes:
                fixed = apply_rewrites(changes)
                click.echo(f"torchdoctor: fixed {counted(fixed, 'finding')} in {counted(len(changes), 'file')}",
                           err=True)
                result = linter.run()
    except FileNotFoundError as exc:
        raise InputError(f"no such file or directory: {exc.args[0]}") from None
    if statistics:
        from torchdoctor.lint.command import statistics as statistics_lines

        for line in statistics_lines(result.findings):
            click.echo(line)
        sys.exit(exit_code(result.findings, settings.fail_on))
    if fmt == "console":
        from torchdoctor import registry

        for message in registry.load_errors():
            click.echo(f"torchdoctor: warning: {message}", err=True)
        render_console(linter.report(result, fixed), settings.fail_on)
        sys.exit(exit_code(result.findings, settings.fail_on))
    if fmt in ("text", "sarif"):
        from torchdoctor.lint.output import text_entry, to_sarif
        from torchdoctor.lint.program import find_root

        if fmt == "text":
            if result.findings:  # one write, not one per finding
                click.echo("\n".join(text_entry(f) for f in result.findings))
        else:
            click.echo(to_sarif(result.findings, linter.checks, settings.root or find_root(os.getcwd())))
        sys.exit(exit_code(result.findings, settings.fail_on))
    emit(linter.report(result, fixed), fmt, settings.fail_on, facts_view)

