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


def phase_share(clock: "StepClock", phase: int) -> Optional[float]:
    """`phase`'s share of the time of the timed steps, leaving out the steps whose time outside `phase` is an
    outlier (a step that also ran a validation pass or saved a checkpoint). A sum, not a median of per-step
    shares, and outliers judged without `phase`: loader workers that cannot keep up make every few steps wait
    long and the others not at all (two workers started together deliver their batches in pairs)."""
    kept = [row for row, _ in _kept(clock, phase)]
    return sum(r[phase] for r in kept) / sum(r[-1] for r in kept) if kept else None


def typical_share(clock: "StepClock", phase: int) -> Optional[float]:
    """The median over the steps `phase_share` keeps of `phase`'s share of each step: a wait that comes with
    every step (a sleep, I/O) moves it; the machine running something else for a few steps does not."""
    kept = [row for row, _ in _kept(clock, phase)]
    return statistics.median(r[phase] / r[-1] for r in kept) if kept else None


def data_cpu_share(clock: "StepClock") -> Optional[float]:
    """The share of the training thread's CPU time spent inside an in-process loader's ``__next__``, over the
    steps `phase_share` keeps (None where the clock did not measure it): loading in the training process is
    that thread's own work, which a busier machine does not add to, where it stretches the wall time of
    whatever phase it interrupts."""
    from torchdoctor.sdk.runtime import DATA

    cpu = [c for _, c in _kept(clock, DATA) if c[1] > 0]
    total = sum(step for _, step in cpu)
    return sum(data for data, _ in cpu) / total if cpu and total > 0 else None


def _kept(clock: "StepClock", phase: int) -> list[tuple[tuple[float, ...], tuple[float, float]]]:
    """The timed steps (each its row and its CPU times), less those whose time outside `phase` is an outlier."""
    steps = [(r, c) for r, c in zip(clock.rows(), clock.cpu_rows()) if r[-1] > 0]
    if not steps:
        return []
    typical = statistics.median(r[-1] - r[phase] for r, _ in steps)
    return [(r, c) for r, c in steps if r[-1] - r[phase] <= OUTLIER * typical] or steps


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
