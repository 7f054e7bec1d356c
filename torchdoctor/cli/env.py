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
    multi_rank = problem is None
    with FactCollection(probe_timeout=timeout, exchange_timeout=timeout if multi_rank else None) as collection:
        settings = settings_for(None, select, ignore, fail_on)  # the torch probe is already running
        checks = checks_for(selection.ENV, settings)
        facts = collection.finish()
        facts.launch = launch
        report = diagnose_env(checks=checks, facts=facts)
        if multi_rank:
            assert launch is not None and launch.world_size is not None  # multi_rank_problem() checked both
            answer = collection.exchange(dist.rank_summary(facts, report.findings))
            if launch.rank != 0:
                sys.exit(0)  # rank 0 reports for everyone
            facts.ranks, facts.missing_ranks = dist.parse_ranks(answer, launch.world_size)
            report = diagnose_env(checks=checks, facts=facts)
            report.findings = dist.fold_ranks(report.findings, facts.ranks)
    from torchdoctor.env.view import facts_view

    emit(report, fmt, settings.fail_on, facts_view)
