"""What the subcommands share: the report options, settings and selection as usage errors, and output."""

from __future__ import annotations

import dataclasses
import functools
import sys
from typing import Any, Callable, NoReturn, Optional, Sequence

import click

from torchdoctor import registry
from torchdoctor.report import Report, make_console, render_console, to_json
from torchdoctor.selection import Door, SelectionError, select_checks
from torchdoctor.settings import ENV_FAIL_ON, FAIL_ON, Settings, SettingsError, load_settings

USAGE_ERROR = 2


class InputError(click.ClickException):
    """Bad input from the user (a missing file, a bad setting): one line on stderr, exit 2."""

    exit_code = USAGE_ERROR


def report_options(
    func: Optional[Callable[..., Any]] = None,
    *,
    formats: tuple[str, ...] = ("console", "json"),
    format_help: str = "Rich console report or one JSON document on stdout.",
) -> Any:
    """The options every front door shares: --format, --select, --ignore, --fail-on.

    Use bare (`@report_options`) or with the formats a front door adds
    (`@report_options(formats=..., format_help=...)`). --select, --ignore and --fail-on are the last layer
    of the settings (see `torchdoctor.settings`).
    """
    if func is None:
        return functools.partial(report_options, formats=formats, format_help=format_help)

    options = [
        click.option(
            "--format", "fmt", type=click.Choice(list(formats)), default="console", show_default=True, help=format_help
        ),
        click.option(
            "--select",
            multiple=True,
            metavar="NAME|CODE",
            help="Run only these checks (repeatable or comma-separated); replaces the project's select.",
        ),
        click.option(
            "--ignore",
            multiple=True,
            metavar="NAME|CODE",
            help="Skip these checks (repeatable or comma-separated); adds to the project's ignore.",
        ),
        click.option(
            "--fail-on",
            type=click.Choice(FAIL_ON),
            default=None,
            help=f"Exit 1 when a finding is at or above this severity [default: ${ENV_FAIL_ON}, "
            "else fail-on in [tool.torchdoctor], else error].",
        ),
    ]
    for option in reversed(options):  # the same order in --help as written here
        func = option(func)
    return func


def settings_for(
    targets: Optional[Sequence[str]],
    select: Sequence[str],
    ignore: Sequence[str],
    fail_on: Optional[str],
    exclude: Sequence[str] = (),
) -> Settings:
    """The run's settings for `targets` (None: the working directory); a malformed one is an input error."""
    try:
        return load_settings(targets, select=select, ignore=ignore, fail_on=fail_on, exclude=exclude)
    except SettingsError as exc:
        raise InputError(str(exc)) from None


def checks_for(door: Door, settings: Settings) -> list[registry.Pitfall]:
    """The checks `door` runs; an unknown name or another door's check is a usage error."""
    try:
        return select_checks(door, settings)
    except SelectionError as exc:
        raise click.UsageError(str(exc)) from None


def emit(
    report: Report,
    fmt: str,
    fail_on: str,
    facts_view: Optional[Callable[[dict[str, Any]], Any]] = None,
    plain: Optional[Callable[[Report, str], Optional[list[str]]]] = None,
) -> NoReturn:
    """Print the report in the chosen format and exit with its exit code under `fail_on`. Off a terminal, a
    door's `plain(report, fail_on)` lines (`torchdoctor.plainreport`) stand in for rich's same output."""
    report = dataclasses.replace(report, fail_on=fail_on)
    for message in registry.load_errors():
        click.echo(f"torchdoctor: warning: {message}", err=True)
    if fmt == "json":
        click.echo(to_json(report))
    else:
        lines = None
        if plain is not None:
            from torchdoctor.plainreport import off_terminal

            lines = plain(report, fail_on) if off_terminal(sys.stdout) else None
        if lines is None:
            render_console(report, make_console(), fail_on=fail_on, facts_view=facts_view)
        else:
            from torchdoctor.pasteable import PasteableStream

            out = PasteableStream(sys.stdout)
            out.write("\n".join(lines) + "\n")
            out.flush()
    sys.exit(report.exit_code())
