"""`torchdoctor env`: examine this machine (and, under torchrun, compare every rank's)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
from typing import Any, Callable, Iterator, Optional, Sequence

import click

from torchdoctor import selection
from torchdoctor.cli.options import InputError, checks_for, emit, report_options, settings_for

AREAS = {  # -v groups the checks that passed by what they look at
    "torch install": (
        "torch-import-failure",
        "torch-copy-hidden",
        "slow-torch-import",
        "cpu-only-build",
        "companion-version-mismatch",
        "numpy-problem",
        "module-shadowing",
        "unmet-requirement",
        "duplicate-openmp",
    ),
    "GPU, driver, CUDA": (
        "gpu-arch-unsupported",
        "driver-too-old",
        "cuda-toolkit-mismatch",
        "cuda-visible-devices",
        "gpu-memory-held",
        "gpu-health",
    ),
    "machine": ("shm-too-small", "low-resources", "open-files-limit", "thread-oversubscription"),
    "settings and launch": (
        "env-var-misconfigured",
        "determinism-settings",
        "rank-env-mismatch",
        "local-rank-argument",
    ),
}


@click.command()
@report_options(
    formats=("console", "json", "markdown"),
    format_help="Rich console report, one JSON document, or Markdown to paste into a bug report "
    "(covers everything `python -m torch.utils.collect_env` reports).",
)
@click.option("-v", "--verbose", is_flag=True, help="Also list every check that passed, by area.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="Seconds to wait for the torch probe subprocess (and, under torchrun, for the other ranks).",
)
@click.option(
    "--distributed",
    is_flag=True,
    help="Compare every rank's environment on rank 0 (automatic when launched by torchrun).",
)
@click.pass_obj
def env(
    obj: dict[str, Any],
    fmt: str,
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    fail_on: Optional[str],
    verbose: bool,
    timeout: float,
    distributed: bool,
) -> None:
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
    # Launch variables left in a shell are not a launch: compare ranks only when a launcher started us
    # (torchrun sets TORCHELASTIC_RUN_ID, torch.distributed.launch passes --local-rank) or when asked to.
    multi_rank = problem is None and (distributed or dist.launched_by_launcher(launch))
    with FactCollection(probe_timeout=timeout, exchange_timeout=timeout if multi_rank else None) as collection:
        details = _Details() if fmt == "markdown" else None
        settings = settings_for(None, select, ignore, fail_on)  # the torch probe is already running
        checks = checks_for(selection.ENV, settings)
        with _spinner(fmt) as progress:
            facts = collection.finish(progress)
        facts.launch = launch
        if details is not None:
            facts.report_details = details.result()
        report = diagnose_env(checks=checks, facts=facts)
        if multi_rank:
            assert launch is not None and launch.world_size is not None  # multi_rank_problem() checked both
            summary = dist.rank_summary(facts, report.findings)
            answer = collection.exchange(summary)
            if answer is None and not facts.torch.ok:  # its probe never got to the exchange: report without torch
                answer = dist.exchange_without_torch(summary, facts, timeout)
            if launch.rank != 0 and answer is not None:
                sys.exit(0)  # rank 0 reports for everyone (this rank's errors included)
            if launch.rank != 0:  # its summary never reached rank 0: say so, and report locally
                click.echo(
                    f"torchdoctor: rank {launch.rank} could not report to rank 0 "
                    f"({collection.probe.unreachable or 'its torch probe did not finish'}); "
                    "this rank's own report follows",
                    err=True,
                )
                if dist.launched_by_launcher(launch):  # an error exit would make torchrun stop rank 0's report
                    with contextlib.suppress(SystemExit):
                        _emit(report, fmt, settings.fail_on, checks if verbose else None)
                    sys.exit(0)
                _emit(report, fmt, settings.fail_on, checks if verbose else None)
            facts.ranks, facts.missing_ranks = dist.parse_ranks(answer, launch.world_size)
            facts.missing_doing = dict(answer.get("doing", {})) if answer else {}
            report = diagnose_env(checks=checks, facts=facts)
            report.findings = dist.fold_ranks(report.findings, facts.ranks)
    _emit(report, fmt, settings.fail_on, checks if verbose else None)


class _Details:
    """The markdown report's extra facts (compilers, lscpu, conda), gathered in a thread meanwhile."""

    def __init__(self) -> None:
        self._box: list[dict[str, str]] = []
        self._thread = threading.Thread(target=self._run, name="torchdoctor-details", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from torchdoctor.env.markdown import collect_details

        self._box.append(collect_details())

    def result(self) -> dict[str, str]:
        self._thread.join(30)
        return self._box[0] if self._box else {}


@contextlib.contextmanager
def _spinner(fmt: str) -> Iterator[Callable[[str], None]]:
    """On a terminal, a spinner on stderr saying what is being probed; elsewhere nothing."""
    if fmt != "console" or not sys.stderr.isatty():
        yield lambda step: None
        return
    from torchdoctor.report import make_console

    with make_console(stderr=True).status("examining this machine…") as status:
        yield lambda step: status.update(step + "…")


def _emit(report: Any, fmt: str, fail_on: str, passed_of: Optional[Sequence[Any]]) -> None:
    """Print the report: markdown here; console (with the checks that passed under -v) and JSON by `emit`."""
    if fmt == "markdown":
        from torchdoctor.env.markdown import render_markdown

        report = dataclasses.replace(report, fail_on=fail_on)
        click.echo(render_markdown(report))
        sys.exit(report.exit_code())
    from torchdoctor.env.view import facts_view, passed_view

    if passed_of is None:
        emit(report, fmt, fail_on, facts_view)
    fired = {f.name for f in report.findings}
    passed = [c.name for c in passed_of if c.name not in fired]
    emit(report, fmt, fail_on, lambda facts: passed_view(facts_view(facts), passed, AREAS))
