"""Shared by the performance pitfalls (input-bound, step-time-drift, straggler-rank): judging a check once
enough steps were timed, and the numbers their messages quote.

Verdicts read shares of the measured step (the median over steps of one phase's share of that step),
never absolute times, so a slower or busier machine gives the same verdict.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Iterator, Optional

from torchdoctor.sdk import Finding
from torchdoctor.sdk.runtime import RuntimeCheck, StepEvent

if TYPE_CHECKING:
    from torchdoctor.watch.timing import StepClock

MIN_STEPS = 8  # timed steps before a verdict


OUTLIER = 5.0  # a step whose own work is this many times the median's also did something else (validation)


def phase_share(clock: "StepClock", phase: int, ready_time: bool = False) -> Optional[float]:
    """`phase`'s share of the time of the timed steps, leaving out the steps whose time outside `phase` is an
    outlier (a step that also ran a validation pass or saved a checkpoint). A sum, not a median of per-step
    shares, and outliers judged without `phase`: loader workers that cannot keep up make every few steps wait
    long and the others not at all (two workers started together deliver their batches in pairs).
    `ready_time`: the data phase and the steps less the time the training thread waited for a CPU, where the
    clock measured it (an in-process loader): the time the loop would take on a machine of its own."""
    rows = _ready_rows(clock) if ready_time else clock.rows()
    rows = [r for r in rows if r[-1] > 0]
    if not rows:
        return None
    typical = statistics.median(r[-1] - r[phase] for r in rows)
    kept = [r for r in rows if r[-1] - r[phase] <= OUTLIER * typical] or rows
    return sum(r[phase] for r in kept) / sum(r[-1] for r in kept)


def _ready_rows(clock: "StepClock") -> list[tuple[float, ...]]:
    """The timed steps (phase seconds..., total) with the run delay taken off the data phase and the total."""
    from torchdoctor.sdk.runtime import DATA

    rows = []
    for row, (data_delay, step_delay) in zip(clock.rows(), clock.delay_rows()):
        if step_delay >= 0.0:
            data = max(row[DATA] - data_delay, 0.0)
            row = (*row[:DATA], data, *row[DATA + 1 : -1], max(row[-1] - step_delay, data))
        rows.append(row)
    return rows


def ms(seconds: float) -> str:
    """Milliseconds, three significant digits."""
    return f"{seconds * 1e3:.3g} ms"


class ClockCheck(RuntimeCheck):
    """A check judged from the step clock at periodic points once `MIN_STEPS`, then twice as many, ... steps
    were timed, and at the end; it reports once."""

    uses_clock = True

    def on_start(self) -> None:
        self.reported = False
        self.due = MIN_STEPS  # judged at periodic points after 8, 16, 32, ... steps: a vanishing cost per step

    def on_periodic(self, event: StepEvent) -> Iterator[Finding]:
        clock = self.ctx.clock
        if clock is not None and clock.timed >= self.due:
            self.due = 2 * clock.timed
            yield from self._judge_once()

    def on_stop(self) -> Iterator[Finding]:
        yield from self._judge_once()

    def _judge_once(self) -> Iterator[Finding]:
        clock = self.ctx.clock
        if self.reported or clock is None or clock.broken or clock.timed < MIN_STEPS:
            return
        for finding in self.judge(clock):
            self.reported = True
            yield finding

    def judge(self, clock: "StepClock") -> Iterator[Finding]:
        """The findings the clock shows now (empty when all is well)."""
        raise NotImplementedError
