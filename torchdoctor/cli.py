"""The `torchdoctor` command line: env, checks, explain (and the other front doors' commands)."""
from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, Optional

import click
from click.core import ParameterSource

from torchdoctor import __version__, registry
from torchdoctor.config import ConfigError, ProjectConfig, load_project_config
from torchdoctor.report import FAIL_ON_CHOICES, Report, exit_code, make_console, render_console, to_json

USAGE_ERROR = 2


class InputError(click.ClickException):
    """Bad input from the user (a missing file, a bad option value): one line on stderr, exit 2."""

    exit_code = USAGE_ERROR


def report_options(func: Optional[Callable[..., Any]] = None, *,
                   formats: tuple[str, ...] = ("console", "json"),
                   format_help: str = "Rich console report or one JSON document on stdout.") -> Any:
    """The options every front door shares: --format, --select, --ignore, --fail-on.

    Use bare (`@report_options`) or with the formats a front door adds
    (`@report_options(formats=..., format_help=...)`).
    Defaults for --select/--ignore/--fail-on come from `[tool.torchdoctor]` in pyproject.toml
    (see `selected_checks` and `emit`).
    """
    if func is None:
        return functools.partial(report_options, formats=formats, format_help=format_help)

    options = [
        click.option("--format", "fmt", type=click.Choice(list(formats)), default="console",
                     show_default=True, help=format_help),
        click.option("--select", multiple=True, metavar="NAME|CODE",
                     help="Run only these checks (repeatable or comma-separated)."),
        click.option("--ignore", multiple=True, metavar="NAME|CODE",
                     help="Skip these checks (repeatable or comma-separated)."),
        click.option("--fail-on", type=click.Choice(FAIL_ON_CHOICES), default="error", show_default=True,
                     help="Exit 1 when a finding is at or above this severity."),
    ]
    for option in reversed(options):  # the same order in --help as written here
        func = option(func)
    return func


def project_config() -> ProjectConfig:
    """The `[tool.torchdoctor]` defaults of the working directory's project (a bad table is an input error)."""
    try:
        return load_project_config()
    except ConfigError as exc:
        raise InputError(str(exc)) from None


def selected_checks(scope: registry.Scope, select: tuple[str, ...], ignore: tuple[str, ...]) -> list[registry.CheckInfo]:
    """Resolve --select/--ignore (plus the project's defaults), turning an unknown name into a one-line usage error.

    The project's `select` counts only for the checks of this front door's scope, so one list can
    name checks of several front doors.
    """
    config = project_config()
    try:
        if not select:
            select = tuple(n for n in config.select if scope in registry.get(n).impls)
        return registry.select(scope, select, (*ignore, *config.ignore))
    except registry.RegistryError as exc:
        where = f" (in {config.path})" if config.path and (config.select or config.ignore) else ""
        raise click.UsageError(f"{exc}{where}") from None


def resolve_fail_on(fail_on: str) -> str:
    """--fail-on as given, or the project's `fail-on` when the option was left at its default."""
    ctx = click.get_current_context(silent=True)
    given = ctx is not None and ctx.get_parameter_source("fail_on") not in (None, ParameterSource.DEFAULT)
    if given:
        return fail_on
    return project_config().fail_on or fail_on


def emit(report: Report, fmt: str, fail_on: str, facts_view: Optional[Callable[[dict], Any]] = None) -> None:
    """Print the report in the chosen format and exit with the report's exit code."""
    fail_on = resolve_fail_on(fail_on)
    for message in registry.load_errors():
        click.echo(f"torchdoctor: warning: {message}", err=True)
    if fmt == "json":
        click.echo(to_json(report))
    else:
        render_console(report, make_console(), fail_on=fail_on, facts_view=facts_view)
    sys.exit(exit_code(report.findings, fail_on))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="torchdoctor")
@click.option("--local-rank", "local_rank_dash", hidden=True, default=None,
              help="Passed by torch.distributed.launch before the command; accepted and reported by `env`.")
@click.option("--local_rank", "local_rank_underscore", hidden=True, default=None)
@click.pass_context
def cli(ctx: click.Context, local_rank_dash: Optional[str], local_rank_underscore: Optional[str]) -> None:
    """Diagnose PyTorch environments, checkpoints and training loops."""
    ctx.obj = {"local_rank_arg": "--local-rank" if local_rank_dash is not None
               else "--local_rank" if local_rank_underscore is not None else None}


@cli.command()
@report_options
@click.option("--timeout", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="Seconds to wait for the torch probe subprocess (and, under torchrun, for the other ranks).")
@click.option("--distributed", is_flag=True,
              help="Compare every rank's environment on rank 0 (automatic when launched by torchrun).")
@click.pass_obj
def env(obj: dict[str, Any], fmt: str, select: tuple[str, ...], ignore: tuple[str, ...], fail_on: str,
        timeout: float, distributed: bool) -> None:
    """Examine this machine: torch build, CUDA, driver, GPUs, OS resources, environment variables.

    Under torchrun (`torchrun --nproc-per-node N -m torchdoctor env`) every rank examines its own machine
    and rank 0 prints one report that compares them.
    """
    from torchdoctor.env import distributed as dist
    from torchdoctor.env.doctor import FactCollection, diagnose_env

    launch = dist.launch_facts(os.environ, obj["local_rank_arg"])
    problem = dist.multi_rank_problem(launch)
    if distributed and problem:
        raise InputError(f"--distributed: {problem}")
    multi_rank = problem is None
    with FactCollection(probe_timeout=timeout, exchange_timeout=timeout if multi_rank else None) as collection:
        checks = selected_checks(registry.Scope.ENV, select, ignore)  # the torch probe is already running
        facts = collection.finish()
        facts.launch = launch
        report = diagnose_env(checks=checks, facts=facts)
        if multi_rank:
            assert launch is not None and launch.world_size is not None, "multi_rank_problem checked both"
            answer = collection.exchange(dist.rank_summary(facts, report.findings))
            if launch.rank != 0:
                sys.exit(0)  # rank 0 reports for everyone
            facts.ranks, facts.missing_ranks = dist.parse_ranks(answer, launch.world_size)
            report = diagnose_env(checks=checks, facts=facts)
            report.findings = dist.fold_ranks(report.findings, facts.ranks)
    from torchdoctor.env.view import facts_view

    emit(report, fmt, fail_on, facts_view)


@cli.command()
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
@click.option("--no-cache", is_flag=True, help="Check every file, ignoring and not updating the results cache "
              "(kept in $TORCHDOCTOR_CACHE_DIR, default ~/.cache/torchdoctor).")
def lint(fmt: str, select: tuple[str, ...], ignore: tuple[str, ...], fail_on: str, paths: tuple[str, ...],
         exclude: tuple[str, ...], fix: bool, diff: bool, no_cache: bool) -> None:
    """Find training-loop pitfalls in Python source (files or folders; default: the current folder).

    Silence one line with `# torchdoctor: ignore[name]`; project defaults go in `[tool.torchdoctor]`.
    Unchanged files are not checked again: their results come from a cache (see --no-cache).
    """
    from torchdoctor.lint.command import run_lint

    run_lint(paths, fmt, select, ignore, fail_on, exclude, fix, diff, use_cache=not no_cache)


@cli.command("check-ckpt")
@report_options
@click.argument("files", nargs=-1, required=True, metavar="FILE [FILE...]")
@click.option("--model", "model_spec", metavar="SPEC", default=None,
              help="Compare with a model: path/to/file.py:factory or package.module:factory (imports torch).")
@click.option("--fix", "fix_out", metavar="OUT", default=None,
              help="Write a weights-only, CPU, prefix-free state_dict copy to OUT (imports torch; unsafe files refused).")
@click.option("--scan-values", is_flag=True, help="Stream the tensor bytes to look for NaN/Inf (bounded memory).")
def check_ckpt(fmt: str, select: tuple[str, ...], ignore: tuple[str, ...], fail_on: str, files: tuple[str, ...],
               model_spec: Optional[str], fix_out: Optional[str], scan_values: bool) -> None:
    """Explain checkpoint FILEs without executing them: structure, safety, keys, devices, size."""
    from torchdoctor.ckpt.cli import facts_view, run_check_ckpt

    checks = selected_checks(registry.Scope.CHECKPOINT, select, ignore)
    try:
        report = run_check_ckpt(files, checks, model_spec=model_spec, fix_out=fix_out, scan_values=scan_values)
    except ValueError as exc:  # CheckpointError, a bad --model spec, a refused --fix
        raise InputError(str(exc)) from None
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
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for column in ("code", "name", "scope", "severity", "origin"):
        table.add_column(column, no_wrap=True)
    table.add_column("summary", overflow="fold")
    for c in checks:
        table.add_row(c.code, c.name, ",".join(str(s) for s in c.scopes), str(c.severity), c.origin, c.summary)
    console = make_console()
    if not console.is_terminal:
        console.width = 400  # piped: one line per check, for grep and scripts
    console.print(table)


@cli.command()
@click.argument("check")
def explain(check: str) -> None:
    """Print the docs page of CHECK (a name such as cpu-only-build, or its code)."""
    try:
        info = registry.get(check)
    except registry.RegistryError as exc:
        raise click.UsageError(str(exc)) from None
    from rich.markdown import Markdown

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


