"""step-time-drift: each step takes longer than the one before; the run slows down as it goes."""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Iterator

from torchdoctor.sdk import Example, Finding, Fix, Pitfall

from ._perf import ClockCheck, ms

if TYPE_CHECKING:
    from torchdoctor.watch.timing import StepClock

GROWTH = 1.5  # the last third of the run's steps take this many times as long as the first third
SHIFT = 1.5  # one jump between two levels is taken when it fits the blocks this many times better than a climb
WORK_SHARE = 0.15  # of the time added per step, at least this much is the thread's CPU time
MIN_BLOCKS = 6  # blocks of steps (16 steps each at first) before a verdict

_SETUP = """
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)  # a tiny model: one thread keeps its steps steady on a busy machine
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.CrossEntropyLoss()
batches = [(torch.randn(8, 16), torch.randint(0, 4, (8,))) for _ in range(4)]
"""

STEP_TIME_DRIFT = Pitfall(
    code="TD341",
    name="step-time-drift",
    severity="warning",
    summary="Steps get slower and slower through the run: something grows with the step count.",
    why="""
        A training step does the same work every time, so its time should stay flat after the first few
        steps. When it keeps growing, something in the loop grows with the number of steps: a Python list
        appended every step and then concatenated, stacked or summed every step (quadratic in the run's length),
        tensors kept with their autograd graph, a cache or a metric history that is never cleared, or, on a
        GPU, memory fragmentation as the caching allocator splits its blocks. A run that should take a day
        takes a week, and often ends out of memory.
    """,
    fix="""
        Find what grows with the step: keep running totals instead of lists of every step's values
        (`total += loss.item()`), store `.item()` or `.detach()` values rather than tensors with graphs, clear
        caches; on a GPU, `torch.cuda.memory_summary()` shows fragmentation
        (`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`).
    """,
    bad=Example(
        """
        losses = []
        for step in range(1000):
            x, y = batches[step % 4]
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
            mean_loss = sum(losses) / len(losses)
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        losses = []
        for step in range(1000):
            x, y = batches[step % 4]
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            mean_loss = sum(losses) / len(losses)
        """,
        setup=_SETUP,
    ),
    details={
        "runtime": """
            `watch` keeps the median step time of every block of 16 steps for the whole run (of its timed
            steps, a sample: see the step-time breakdown; blocks merge pairwise past 128 of them), with the
            training thread's CPU time per step in each block, over all its steps. Once it has six
            blocks or more, it compares the first third of them with the last third: it reports when the CPU
            time the training thread spends per step grew 1.5 times or more, with the middle third in between (a
            steady climb, not one jump), the last third's lower quartile above the first third's upper quartile
            (not noise around one level: the CPU time of a sub-millisecond step swings by half between blocks)
            and 1.5 times the first third's lower quartile (the least disturbed blocks grew too: a neighbour
            sharing the core's caches only adds CPU time to a thread, in bursts), that CPU time added is at least
            15% of the time added per step, and the blocks' CPU times are a climb, not a jump: two flat levels
            with one break do not fit them 1.5 times better, by least squares, than a level followed by a
            straight rise to the end (starting at any block). Something that grows with the step count adds
            work to every step after it began, so the CPU time climbs; a neighbour that starts sharing the
            core's caches lifts it once, as a level shift (on this project's 2-core VM a correct 0.24 ms step
            went from 0.24 to 0.38 ms of CPU time when concurrent tests started, 1.6 times, which passed every
            other condition; under four busy loops its CPU time per block swung between 0.3 and 0.9 ms, and the
            median of its last third reached 1.67 times the first's, while the lower quartiles stayed within
            1.2 times; the Bad example's real climb scattered so that a shift fitted it up to 1.2 times better
            than a climb, hence the margin). It says by how much and from about which step. Ratios
            of the thread's CPU time, never a wall time: a slower or busier machine gives the same verdict, and a
            wait that grows (a sleep, I/O, other threads spinning) adds wall time with little CPU time to the
            thread that waits, so it stays quiet (a thread woken from ever longer sleeps does run slower, its
            caches cold: up to 1.5 times the CPU time on a 1-3 ms step, far less than the wait added). It cannot
            see a drift that lives only in GPU time while the host sleeps (blocking synchronisation).
        """,
    },
)


@STEP_TIME_DRIFT.runtime
class StepTimeDrift(ClockCheck):
    """Once six blocks of steps were timed: did the step time and the CPU time per step climb steadily?"""

    def judge(self, clock: "StepClock") -> Iterator[Finding]:
        blocks, cpu = list(clock.blocks), list(clock.block_cpu)
        if len(blocks) < MIN_BLOCKS:
            return
        third = len(blocks) // 3
        early, late = statistics.median(blocks[:third]), statistics.median(blocks[-third:])
        cpu_early, cpu_middle, cpu_late = (
            statistics.median(cpu[:third]),
            statistics.median(cpu[third:-third]),
            statistics.median(cpu[-third:]),
        )
        # judged on the CPU time the stepping thread spends per step, never on wall times: a machine that gets
        # busier stretches the wall time of every step (unevenly) but not the work the loop does, and a wait
        # that grows (a sleep, I/O, other threads) adds little CPU time to the thread that waits (caches gone cold
        # after a long sleep slow its next step, so the added CPU time must be a fair part of the added time)
        if not (
            cpu_early > 0
            and cpu_late >= GROWTH * cpu_early
            and cpu_early < cpu_middle < cpu_late
            and _quartile(cpu[-third:], 0) > _quartile(cpu[:third], 2)  # apart: a climb, not noise around a level
            and _quartile(cpu[-third:], 0) >= GROWTH * _quartile(cpu[:third], 0)  # the least disturbed blocks too
            and cpu_late - cpu_early >= WORK_SHARE * max(late - early, 0.0)
            and not _level_shift(cpu)  # a growing cause, not a neighbour that arrived and stayed
        ):
            return
        size, start = clock.block_size, clock.blocks_start
        since = next(i for i, b in enumerate(cpu) if b >= 1.25 * cpu_early)
        yield Finding(
            f"steps keep getting slower: the training thread spent {ms(cpu_early)} of CPU time per step over steps "
            f"{start + 1}-{start + third * size} and {ms(cpu_late)} over steps "
            f"{start + (len(blocks) - third) * size + 1}-{start + len(blocks) * size} ({cpu_late / cpu_early:.1f}x; "
            f"median step {ms(early)}, then {ms(late)}), rising since about step {start + since * size + 1}: it is "
            "the loop's own work that grows, not a busier machine or a longer wait. Something grows with the step "
            "count: a list appended every step and then concatenated or summed every step, tensors kept with "
            "their graphs, a cache never cleared.",
            fix=Fix(
                "Keep numbers, not tensors, in what the loop accumulates every step (or keep a running total): "
                "replace the `.append(loss)` or `.append(loss.detach())` of your loop with",
                "losses.append(loss.item())",
            ),
        )


def _level_shift(values: list[float]) -> bool:
    """Whether the blocks' CPU times are far better described as one jump between two flat levels than as a
    climb (flat, then rising in a line to the end: a "hinge", the line starting at any block, the first
    included): least squares of both, each at its best break, `SHIFT` times apart. Something that grows with the
    step count adds work to every step after it began; a neighbour that starts sharing the core's caches lifts
    the level once. The margin: on a busy machine a real climb's blocks scatter, and a shift can fit them a
    little better (measured: up to 1.2 times)."""
    return len(values) >= 3 and SHIFT * _step_sse(values) < _hinge_sse(values)


def _step_sse(values: list[float]) -> float:
    """Squared error of the best fit by two flat levels (before and after one break)."""
    best = math.inf
    for k in range(1, len(values)):
        before, after = values[:k], values[k:]
        mean_before, mean_after = statistics.fmean(before), statistics.fmean(after)
        err = sum((v - mean_before) ** 2 for v in before) + sum((v - mean_after) ** 2 for v in after)
        best = min(best, err)
    return best


def _hinge_sse(values: list[float]) -> float:
    """Squared error of the best fit by a level followed by a straight line from block `k` on (any `k`)."""
    n, mean = len(values), statistics.fmean(values)
    best = math.inf
    for k in range(n - 1):
        xs = [max(0, i - k) for i in range(n)]
        mean_x = statistics.fmean(xs)
        sxx = sum((x - mean_x) ** 2 for x in xs)
        sxy = sum((x - mean_x) * (v - mean) for x, v in zip(xs, values))
        slope = sxy / sxx
        best = min(best, sum((v - mean - slope * (x - mean_x)) ** 2 for x, v in zip(xs, values)))
    return best


def _quartile(values: list[float], which: int) -> float:
    """The lower (0), middle (1) or upper (2) quartile of `values` (itself for one value)."""
    return statistics.quantiles(values, n=4)[which] if len(values) > 1 else values[0]
