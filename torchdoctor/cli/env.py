"""`torchdoctor env`: examine this machine (and, under torchrun, compare every rank's)."""
from __future__ import annotations

import os
import sys
from typing import Any, Optional

import click

from torchdoctor import selection
from torchdoctor.cli.options import InputError, checks_for, emit, report_options, settings_for


@click.command()
@report_options
@click.option("--timeout", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="Seconds to wait for the torch probe subprocess (and, under torchrun, for the other ranks).")
@click.option("--distributed", is_flag=True,
              help="Compare every rank's environment on rank 0 (automatic when launched by torchrun).")
@click.pass_obj
def env(obj: dict[str, Any], fmt: str, select: tuple[str, ...], ignore: tuple[str, ...], fail_on: Optional[str],
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
    # Launch variables left in a shell are not a launch: compare ranks only when a launcher started us
    # (torchrun sets TORCHELASTIC_RUN_ID, torch.distributed.launch passes --local-rank) or when asked to.
    multi_rank = problem is None and (distributed or dist.launched_by_launcher(launch))
    with FactCollection(probe_timeout=timeout, exchange_timeout=timeout if multi_rank else None) as collection:
        settings = settings_for(None, select, ignore, fail_on)  # the torch probe is already running
        checks = checks_for(selection.ENV, settings)
        facts = collection.finish()
        facts.launch = launch
        report = diagnose_env(checks=checks, facts=facts)
        if multi_rank:
            assert launch is not None and launch.world_size is not None  # multi_rank_problem() checked both
            answer = collection.exchange(dist.rank_summary(facts, report.findings))
            if launch.rank != 0 and answer is not None:
                sys.exit(0)  # rank 0 reports for everyone
            if launch.rank != 0:  # its summary never reached rank 0: say so, and report locally
                click.echo(f"torchdoctor: rank {launch.rank} could not report to rank 0 "
                           f"({collection.probe.unreachable or 'its torch probe did not finish'}); "
                           "this rank's own report follows", err=True)
                emit(report, fmt, settings.fail_on, _facts_view())
            facts.ranks, facts.missing_ranks = dist.parse_ranks(answer, launch.world_size)
            facts.missing_doing = dict(answer.get("doing", {})) if answer else {}
            report = diagnose_env(checks=checks, facts=facts)
            report.findings = dist.fold_ranks(report.findings, facts.ranks)
    emit(report, fmt, settings.fail_on, _facts_view())


def _facts_view() -> Any:
    from torchdoctor.env.view import facts_view

    return facts_view
