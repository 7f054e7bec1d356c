"""`torchdoctor lint PATH...`: find training-loop pitfalls in source, with ruff's conventions: --fix/--diff apply or
show the safe rewrites, --add-noqa silences what is there, --watch lints again on every change."""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import TYPE_CHECKING, Optional

import click

from torchdoctor import selection
from torchdoctor.cli.options import InputError, checks_for, report_options, settings_for
from torchdoctor.report import exit_code

if TYPE_CHECKING:
    from torchdoctor.lint.command import Linter


@click.command()
@report_options(
    formats=("console", "json", "text", "sarif"),
    format_help="Rich console report, one JSON document, one `path:line:col: CODE name message` "
    "line per finding (text), or SARIF 2.1.0 for code-scanning UIs.",
)
@click.argument("paths", nargs=-1, type=click.Path())
@click.option(
    "--exclude",
    multiple=True,
    metavar="PATTERN",
    help="Skip files and folders matching this gitignore-style pattern (repeatable).",
)
@click.option(
    "--fix",
    is_flag=True,
    help="Apply the safe rewrites in place: local-rank-argument, "
    "prefix-strip-by-slicing, and unsafe-torch-load where the loaded object only goes to "
    "load_state_dict (the findings marked [*]).",
)
@click.option(
    "--diff",
    is_flag=True,
    help="Print the safe rewrites as a unified diff and change nothing (exit 1 when there is one).",
)
@click.option(
    "--add-noqa",
    is_flag=True,
    help="Add a `# noqa: CODE` comment to every line with a finding (as "
    "ruff's --add-noqa), to adopt torchdoctor on an existing code base; change nothing else.",
)
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when there are findings (as ruff's --exit-zero).")
@click.option(
    "--watch", is_flag=True, help="Lint, then lint again whenever a Python file under the paths changes (until Ctrl-C)."
)
@click.option(
    "--statistics", is_flag=True, help="Print how many findings each check has (most first) instead of the findings."
)
@click.option(
    "--no-cache",
    is_flag=True,
    help="Check every file, ignoring and not updating the results cache "
    "(kept in $TORCHDOCTOR_CACHE_DIR, default ~/.cache/torchdoctor).",
)
def lint(
    fmt: str,
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    fail_on: Optional[str],
    paths: tuple[str, ...],
    exclude: tuple[str, ...],
    fix: bool,
    diff: bool,
    add_noqa: bool,
    exit_zero: bool,
    watch: bool,
    statistics: bool,
    no_cache: bool,
) -> None:
    """Find training-loop pitfalls in Python source (files or folders; default: the current folder).

    Silence one line with `# noqa: TD301` (or `# noqa` for all) or `# torchdoctor: ignore[name]`; project
    defaults and per-file-ignores go in `[tool.torchdoctor]` of the nearest pyproject.toml above the paths.
    A file that cannot be read or parsed is an error (source-unreadable), never reported clean.
    Unchanged files are not checked again: their results come from a cache (see --no-cache).
    """
    from torchdoctor.lint.command import Linter

    if sum((fix, diff, add_noqa)) > 1:
        raise click.UsageError("--fix, --diff and --add-noqa are exclusive: pick one")
    if watch and (diff or add_noqa or fmt == "sarif"):
        raise click.UsageError(
            "--watch lints and reports again on each change: not with --diff, --add-noqa or --format sarif"
        )
    settings = settings_for(paths or ["."], select, ignore, fail_on, exclude)
    threshold = "never" if exit_zero else settings.fail_on
    try:
        linter = Linter(paths, settings, checks_for(selection.LINT, settings), use_cache=not no_cache)
    except selection.SelectionError as exc:
        raise InputError(str(exc)) from None
    if not watch:
        sys.exit(_once(linter, fmt, threshold, fix, diff, add_noqa, statistics))

    from torchdoctor.lint.watching import snapshot
    from torchdoctor.lint.watching import watch as watch_loop

    project = [settings.project] if settings.project else []
    click.echo("torchdoctor: watching for changes (Ctrl-C to stop)", err=True)
    watch_loop(
        lambda: _once(linter, fmt, threshold, fix, False, False, statistics),
        lambda: snapshot(linter.paths, linter.excludes, project),
        announce=lambda message: click.echo(f"\ntorchdoctor: {message}", err=True),
    )


def _once(linter: "Linter", fmt: str, fail_on: str, fix: bool, diff: bool, add_noqa: bool, statistics: bool) -> int:
    """One lint run and its output; returns the exit code."""
    from torchdoctor.lint.command import apply_rewrites, counted, rewrites

    try:
        result = linter.run(cached=not (fix or diff), show_progress=fmt == "console")
        fixed = 0
        if diff or fix:
            changes = rewrites(result)
            if diff:
                from torchdoctor.lint.fixes import unified_diff

                for path, (before, after, _) in changes.items():
                    click.echo(unified_diff(path, before, after), nl=False)
                if not changes:
                    click.echo(
                        f"torchdoctor: nothing to fix: none of the {counted(len(result.findings), 'finding')}"
                        " has a safe rewrite"
                        if result.findings
                        else "torchdoctor: nothing to fix",
                        err=True,
                    )
                return 1 if changes else 0
            if changes:
                fixed = apply_rewrites(changes)
                click.echo(
                    f"torchdoctor: fixed {counted(fixed, 'finding')} in {counted(len(changes), 'file')}", err=True
                )
                result = linter.run()
            else:
                click.echo("torchdoctor: nothing to fix", err=True)
        if add_noqa:
            from torchdoctor.lint.command import add_noqa_comments

            added, files, refused = add_noqa_comments(result)
            click.echo(f"torchdoctor: added {counted(added, 'noqa directive')} in {counted(files, 'file')}", err=True)
            for where in refused:
                click.echo(
                    f"torchdoctor: {where}: no comment can go at the end of this line (inside a string or "
                    "after a backslash); silence it by hand",
                    err=True,
                )
            return 0
    except FileNotFoundError as exc:
        raise InputError(f"no such file or directory: {exc.args[0]}") from None
    if not result.files and fmt != "console":  # the console report says so itself
        click.echo(f"torchdoctor: warning: no Python files found under {', '.join(linter.paths)}", err=True)
    if statistics:
        from torchdoctor.lint.command import statistics as statistics_lines

        for line in statistics_lines(result.findings):
            click.echo(line)
        return exit_code(result.findings, fail_on)
    from torchdoctor import registry

    for message in registry.load_errors():
        click.echo(f"torchdoctor: warning: {message}", err=True)
    if fmt == "console":
        from torchdoctor.lint.command import render_console

        render_console(linter.report(result, fixed), fail_on)
    elif fmt == "text":
        from torchdoctor.lint.output import text_entry

        if result.findings:  # one write, not one per finding
            click.echo("\n".join(text_entry(f) for f in result.findings))
    elif fmt == "sarif":
        from torchdoctor.lint.output import to_sarif
        from torchdoctor.lint.program import find_root

        click.echo(to_sarif(result.findings, linter.checks, linter.root or find_root(os.getcwd())))
    else:
        from torchdoctor.report import to_json

        click.echo(to_json(dataclasses.replace(linter.report(result, fixed), fail_on=fail_on)))
    return exit_code(result.findings, fail_on)
