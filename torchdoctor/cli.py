"""The `torchdoctor` command line: env, checks, explain (and the other front doors' commands)."""
from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, Optional

import click
from rich.markdown import Markdown
from rich.table import Table

from torchdoctor import __version__, registry
from torchdoctor.report import FAIL_ON_CHOICES, Report, exit_code, make_console, render_console, to_json

USAGE_ERROR = 2


class InputError(click.ClickException):
    """Bad input from the user (a missing file, a bad option value): one line on stderr, exit 2."""

    exit_code = USAGE_ERROR


def report_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The options every front door shares: --format, --select, --ignore, --fail-on."""

    @click.option("--format", "fmt", type=click.Choice(["console", "json"]), default="console",
                  show_default=True, help="Rich console report or one JSON document on stdout.")
    @click.option("--select", multiple=True, metavar="NAME|CODE",
                  help="Run only these checks (repeatable or comma-separated).")
    @click.option("--ignore", multiple=True, metavar="NAME|CODE",
                  help="Skip these checks (repeatable or comma-separated).")
    @click.option("--fail-on", type=click.Choice(FAIL_ON_CHOICES), default="error", show_default=True,
                  help="Exit 1 when a finding is at or above this severity.")
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    return wrapper


def selected_checks(scope: registry.Scope, select: tuple[str, ...], ignore: tuple[str, ...]) -> list[registry.CheckInfo]:
    """Resolve --select/--ignore, turning an unknown name into a one-line usage error."""
    try:
        return registry.select(scope, select, ignore)
    except registry.RegistryError as exc:
        raise click.UsageError(str(exc)) from None


def emit(report: Report, fmt: str, fail_on: str, facts_view: Optional[Callable[[dict], Any]] = None) -> None:
    """Print the report in the chosen format and exit with the report's exit code."""
    for message in registry.load_errors():
        click.echo(f"torchdoctor: warning: {message}", err=True)
    if fmt == "json":
        click.echo(to_json(report))
    else:
        render_console(report, make_console(), fail_on=fail_on, facts_view=facts_view)
    sys.exit(exit_code(report.findings, fail_on))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="torchdoctor")
def cli() -> None:
    """Diagnose PyTorch environments, checkpoints and training loops."""


@cli.command()
@report_options
@click.option("--timeout", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="Seconds to wait for the torch probe subprocess before calling it hung.")
def env(fmt: str, select: tuple[str, ...], ignore: tuple[str, ...], fail_on: str, timeout: float) -> None:
    """Examine this machine: torch build, CUDA, driver, GPUs, OS resources, environment variables."""
    from torchdoctor.env.doctor import diagnose_env
    from torchdoctor.env.view import facts_view

    checks = selected_checks(registry.Scope.ENV, select, ignore)
    report = diagnose_env(checks=checks, probe_timeout=timeout)
    emit(report, fmt, fail_on, facts_view)


@cli.command("checks")
@click.option("--scope", type=click.Choice([s.value for s in registry.Scope]), default=None,
              help="Only list checks of this scope.")
@click.option("--format", "fmt", type=click.Choice(["console", "json"]), default="console", show_default=True)
def list_checks(scope: Optional[str], fmt: str) -> None:
    """List every check: code, name, scope, severity, origin."""
    checks = registry.all_checks(scope)
    if fmt == "json":
        import json

        rows = [
            {"code": c.code, "name": c.name, "scopes": [str(s) for s in c.scopes],
             "severity": str(c.severity), "origin": c.origin, "summary": c.summary}
            for c in checks
        ]
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(box=None, pad_edge=False)
    for column in ("code", "name", "scope", "severity", "origin"):
        table.add_column(column, no_wrap=True)
    table.add_column("summary", overflow="fold")
    for c in checks:
        table.add_row(c.code, c.name, ",".join(str(s) for s in c.scopes), str(c.severity), c.origin, c.summary)
    make_console().print(table)


@cli.command()
@click.argument("check")
def explain(check: str) -> None:
    """Print the docs page of CHECK (a name such as cpu-only-build, or its code)."""
    try:
        info = registry.get(check)
    except registry.RegistryError as exc:
        raise click.UsageError(str(exc)) from None
    page = info.docs_page()
    console = make_console()
    if console.is_terminal:
        console.print(Markdown(page))
    else:
        click.echo(page.rstrip("\n"))


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: usage and input errors become one line on stderr and exit code 2."""
    try:
        cli.main(args=argv, prog_name="torchdoctor", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"torchdoctor: error: {exc.format_message()}", err=True)
        sys.exit(USAGE_ERROR if isinstance(exc, click.UsageError) else exc.exit_code)
    except click.Abort:
        click.echo("torchdoctor: aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # a torchdoctor bug: one line, traceback only on request
        if os.environ.get("TORCHDOCTOR_DEBUG"):
            raise
        click.echo(f"torchdoctor: internal error: {type(exc).__name__}: {exc} "
                   "(set TORCHDOCTOR_DEBUG=1 for the traceback)", err=True)
        sys.exit(USAGE_ERROR)
    sys.exit(0)


