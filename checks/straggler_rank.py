"""straggler-rank: under DDP one rank is consistently slower and every other rank waits for it each step."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any, Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import RuntimeCheck, StepEvent

from ._ddp_examples import DDP_SETUP, UNSEEN
from ._perf import MIN_STEPS, ms

if TYPE_CHECKING:
    from torchdoctor.sdk.runtime import RankExchange

GAP = 0.25  # the slow rank's own work exceeds the others' by this share of the step
RATIO = 1.5  # ... and is this many times theirs

STRAGGLER_RANK = Pitfall(
    code="TD410",
    name="straggler-rank",
    severity="warning",
    summary="Under DDP one rank is consistently slower than the others, and they all wait for it at every step.",
    why="""
        DistributedDataParallel averages the gradients of all ranks with an all-reduce during `backward()`, so
        every step runs at the pace of the slowest rank: the others finish their forward early and wait in the
        all-reduce. One slow rank — a loader that reads from slow storage or has fewer workers, a data shard
        with longer samples, extra work (logging, evaluation, checkpointing) done every step on rank 0 only, a
        GPU that is throttled or shared with another job — slows the whole job down by its gap, times the
        number of ranks.
    """,
    fix="""
        Make the ranks do the same work: the same `DataLoader` settings on every rank, shards of equal cost
        (sort or bucket by length before sharding), and rank-0-only work outside the step or every N steps
        (`if rank == 0 and step % 100 == 0`). Check the slow rank's device (`nvidia-smi`: clocks, temperature,
        other processes).
    """,
    bad=Example(
        """
        loader = DataLoader(dataset, batch_size=16, sampler=DistributedSampler(dataset))
        model = DDP(model.to(device))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step, (x, y) in enumerate(loader):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
            if dist.get_rank() == 0:
                torch.save(model.module.state_dict(), "last.pt")  # the other ranks wait for it
        """,
        setup=DDP_SETUP,
        unseen=UNSEEN,
    ),
    good=Example(
        """
        loader = DataLoader(dataset, batch_size=16, sampler=DistributedSampler(dataset))
        model = DDP(model.to(device))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step, (x, y) in enumerate(loader):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
            if dist.get_rank() == 0 and step % 100 == 0:
                torch.save(model.module.state_dict(), "last.pt")  # the other ranks wait for it
        """,
        setup=DDP_SETUP,
        unseen=UNSEEN,
    ),
    details={
        "distributed": """
            For a model wrapped in `DistributedDataParallel` over every rank, each rank sends, with the
            exchanges `watch` already makes every `every` steps on its own side group, the median over its
            timed steps of its own work before the gradient all-reduce: the time from one step's
            `optimizer.step()` to the end of the next forward (data wait, forward, and whatever the loop does
            between steps), and of its whole step. The all-reduce makes every rank's step as long as the
            slowest's, so the ranks that wait show it as a longer backward; the one they wait for shows it
            before. A rank is reported when its own work exceeds the median of the other ranks' by a quarter
            of the step or more and is 1.5 times theirs, after 8 timed steps: shares of the measured step, so
            a slower machine gives the same verdict. Quiet: ranks doing equal work. Host time only: on a GPU,
            a rank slowed inside its kernels shows where its host waits for them.
        """,
    },
)


@STRAGGLER_RANK.distributed
class StragglerRank(RuntimeCheck):
    """Each rank's median own work per step, exchanged at PERIODIC; a rank far above the others is reported."""

    uses_clock = True

    def on_start(self) -> None:
        self.reported = False
        self.ex: Optional["RankExchange"] = None
        if self.ctx.world_size > 1:
            from torchdoctor.sdk.runtime import exchange_for

            ex = exchange_for(self.ctx)
            self.ex = ex if ex.provide("steps", self, self._mine) else None

    def _mine(self) -> Optional[list[float]]:
        """[timed steps, median own work, median step] of this rank (None before enough steps)."""
        from torchdoctor.sdk.runtime import BACKWARD, OPTIMIZER

        clock = self.ctx.clock
        rows = clock.rows() if clock is not None else []
        if len(rows) < MIN_STEPS:
            return None
        own = statistics.median(r[-1] - r[BACKWARD] - r[OPTIMIZER] for r in rows)
        return [len(rows), own, statistics.median(r[-1] for r in rows)]

    def on_periodic(self, event: StepEvent) -> Iterator[Finding]:
        if self.ex is None or self.reported:
            return
        rnd = self.ex.round(event)
        if rnd is None:
            return
        mine: list[Any] = [p.get("steps") for p in rnd.payloads]
        if any(not isinstance(m, list) or len(m) != 3 for m in mine):
            return  # some rank has not timed enough steps yet
        step = statistics.median(m[2] for m in mine)
        slow = max(range(len(mine)), key=lambda r: mine[r][1])
        others = statistics.median(m[1] for r, m in enumerate(mine) if r != slow)
        own = mine[slow][1]
        if step <= 0 or own - others < GAP * step or own < RATIO * others:
            return
        self.reported = True
        yield Finding(
            f"rank {slow} is the straggler: its own work before the gradient all-reduce (data wait, forward, and "
            f"whatever the loop does between steps) takes {ms(own)} per step against {ms(others)} on the other "
            f"ranks (medians over {int(mine[slow][0])} steps, at step {event.step}), so every rank waits about "
            f"{ms(own - others)} of its {ms(step)} step ({100 * (own - others) / step:.0f}%) in the all-reduce "
            "for it.",
            fix=Fix(
                title=f"Give rank {slow} the same work as the others: move rank-only work out of the step, e.g.:",
                code="if dist.get_rank() == 0 and step % 100 == 0:",
            ),
            location=Location(rank=slow),
            key="straggler",
        )
