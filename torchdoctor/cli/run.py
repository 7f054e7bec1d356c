"""`torchdoctor run [OPTIONS] SCRIPT [ARGS...]` / `-m MODULE [ARGS...]`: the program with the runtime doctor."""

from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING, Optional

import click

from torchdoctor.cli.options import InputError, checks_for, settings_for
from torchdoctor.settings import ENV_FAIL_ON, FAIL_ON

if TYPE_CHECKING:
    from torchdoctor.run.script import Target


@click.command(context_settings={"allow_interspersed_args": False})
@click.option("-m", "as_module", is_flag=True, help="Run the first argument as a module, as `python -m MODULE` does.")
@click.option(
    "--select",
    multiple=True,
    metavar="NAME|CODE",
    help="Run only these checks (repeatable or comma-separated); replaces the project's select.",
)
@click.option(
    "--ignore",
    multiple=True,
    metavar="NAME|CODE",
    help="Skip these checks (repeatable or comma-separated); adds to the project's ignore.",
)
@click.option(
    "--fail-on",
    type=click.Choice(FAIL_ON),
    default=None,
    help=f"Exit 1 when a finding is at or above this severity and the program itself succeeded "
    f"[default: ${ENV_FAIL_ON}, else fail-on in [tool.torchdoctor], else error].",
)
@click.option(
    "--report",
    "report_file",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Also write the JSON report (scope `run`) to this file.",
)
@click.argument("target", metavar="SCRIPT|MODULE")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(
    as_module: bool,
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    fail_on: Optional[str],
    report_file: Optional[str],
    target: str,
    args: tuple[str, ...],
) -> None:
    """Run a training script exactly as `python SCRIPT ARGS` would, with the runtime doctor attached.

    Every optimizer the program steps is watched, with the models it trains (found from the parameters
    it steps), with no change to the script; a crash is explained from what the doctor saw. The report
    goes to stderr when the program ends (stdout stays the program's). Exit status: the program's own when
    it failed, else 1 when a finding is at or above --fail-on, else 0. Options go before SCRIPT; everything
    after it is the program's. Under torchrun: `torchrun ... -m torchdoctor run train.py`.
    """
    from torchdoctor import selection
    from torchdoctor.run.script import Target

    settings = settings_for(None, select, ignore, fail_on)
    checks_for(selection.WATCH, settings)  # an unknown or other door's check: a usage error before anything runs
    program = Target(module=target, args=list(args)) if as_module else Target(path=target, args=list(args))
    problem = program.problem()
    if problem:
        raise InputError(problem)
    _run(program, select, ignore, fail_on, report_file)


def _run(
    program: "Target",
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    fail_on: Optional[str],
    report_file: Optional[str],
) -> None:
    from torchdoctor.report import make_console, render_console, to_json
    from torchdoctor.run.doctor import run_script
    from torchdoctor.run.script import print_traceback
    from torchdoctor.run.view import facts_view

    result = run_script(program, select=select, ignore=ignore, fail_on=fail_on)
    outcome, report = result.outcome, result.report
    sys.stdout.flush()
    if report_file:
        try:
            with open(report_file, "w", encoding="utf-8") as out:
                out.write(to_json(report) + "\n")
        except OSError as exc:
            click.echo(f"torchdoctor: warning: could not write the report to {report_file}: {exc}", err=True)
    if result.print_here:  # under torchrun, rank 0 prints every rank's findings
        render_console(report, make_console(stderr=True), fail_on=report.fail_on, facts_view=facts_view)
    if outcome.exit_message is not None:
        click.echo(outcome.exit_message, err=True)
    if outcome.exception is not None:
        print_traceback(outcome.exception)
    sys.stderr.flush()
    if isinstance(outcome.exception, KeyboardInterrupt):  # die of SIGINT, as Python does
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    sys.exit(result.exit_status)
