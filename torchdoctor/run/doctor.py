"""The runtime doctor attached to a whole program: a watch session that adopts every optimizer the program
steps and the models those optimizers train (`torchdoctor.watch.follow`), around `run_target`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from torchdoctor.report import Report
from torchdoctor.run.ranks import exchange
from torchdoctor.run.script import Outcome, Target, run_target


class RunReport(Report):
    """A run's report (scope ``run``); as every runtime report, the findings that explain a crash come first."""


@dataclass
class RunResult:
    """What `run_script` returns: the program's outcome, and the report of the session around it."""

    outcome: Outcome
    report: RunReport
    print_here: bool = True  # False on a rank whose findings went to rank 0's report

    @property
    def exit_status(self) -> int:
        """The program's own status when it failed; else 1 when a finding reaches fail-on; else 0."""
        return self.outcome.status if self.outcome.status != 0 else self.report.exit_code()


def run_script(
    target: Target,
    *,
    select: Sequence[str] = (),
    ignore: Sequence[str] = (),
    fail_on: Optional[str] = None,
    on_finding: Any = "warn",
) -> RunResult:
    """Run `target` under a watch session that follows every optimizer and model; the session's report
    (scope ``run``) is built once the program ended, whichever way it ended."""
    from torchdoctor.settings import load_settings
    from torchdoctor.watch.session import WatchSession

    settings = load_settings(select=select, ignore=ignore, fail_on=fail_on)
    session = WatchSession(
        [], None, checks=list(select) or None, ignore=list(ignore) or None, on_finding=on_finding, report=False
    )
    session.discover_models = True
    session.start()
    outcome = Outcome(1)
    try:
        outcome = run_target(target)
    finally:
        session.stop(outcome.exception if not isinstance(outcome.exception, KeyboardInterrupt) else None)
    facts = dict(session.facts)
    facts["program"] = {
        "target": target.label,
        "args": list(target.args),
        "exit_status": outcome.status,
        **({"exception": _one_line(outcome.exception)} if outcome.exception is not None else {}),
    }
    rank = os.environ.get("RANK")
    if rank is not None and os.environ.get("WORLD_SIZE", "1") != "1":
        facts["program"]["rank"] = int(rank) if rank.isdigit() else rank
    findings = session.findings if session.rank_findings is None else session.rank_findings
    subject = target.label + (f" (rank {rank})" if "rank" in facts["program"] else "")
    answer = exchange(findings, outcome.status) if "rank" in facts["program"] else None
    if answer is not None and answer.get("sent"):
        report = RunReport(scope="run", findings=findings, facts=facts, subject=subject, fail_on=settings.fail_on)
        return RunResult(outcome, report, print_here=False)
    if answer is not None:  # rank 0 of several: every rank's findings, folded
        from torchdoctor.watch.distributed import merge_ranks

        findings = merge_ranks(answer["received"])
        facts["ranks"] = {
            "reported": sorted(answer["received"]),
            "missing": answer["missing"],
            "exit_status": answer["status"],
        }
        subject = (
            f"{target.label} ({len(answer['received'])} of {len(answer['received']) + len(answer['missing'])} ranks)"
        )
    report = RunReport(scope="run", findings=findings, facts=facts, subject=subject, fail_on=settings.fail_on)
    return RunResult(outcome, report)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return line if len(line) <= 160 else line[:157] + "..."
