"""input-bound: the training loop spends most of each step waiting for its next batch."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import LoaderEvent

from ._perf import ClockCheck, ms, phase_share
from ._user_names import LoaderCall
from ._worker_time import PerBatch, WorkerTimes

if TYPE_CHECKING:
    from torchdoctor.sdk.runtime import LoaderWait, StepClock

THRESHOLD = 0.5  # the median step waits for data at least this share of its time
WORKERS = 4  # what the fix proposes for a loader without workers
KEEP_UP = 0.75  # workers keep up when the worker time per batch over the workers is at most this much of the
# loop's own time per step (the rest of the step); then the waits come in bursts
MAX_PREFETCH = 16

_SETUP = """
import time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

class Images(Dataset):
    def __len__(self):
        return 160
    def __getitem__(self, i):
        time.sleep(0.003)  # stands for decoding and augmenting one image: 24 ms a batch of 8
        return torch.randn(32), i % 4

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 4)
    def forward(self, x):
        time.sleep(0.012)  # stands for the accelerator's 12 ms of work per step
        return self.fc(x)

torch.manual_seed(0)
torch.set_num_threads(1)  # a tiny model: one thread keeps its steps steady on a busy machine
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.CrossEntropyLoss()
dataset = Images()
"""

INPUT_BOUND = Pitfall(
    code="TD340",
    name="input-bound",
    severity="warning",
    summary="The training loop waits for its next batch for most of every step: the accelerator idles.",
    why="""
        A `DataLoader` with `num_workers=0` (the default) loads, decodes and collates every batch in the
        training process, between two steps: while it does, the GPU has nothing to do. When that takes longer
        than the step's own compute, the run is *input-bound*: a faster GPU, a bigger model or mixed precision
        change nothing, and the GPU sits at 30%. With workers, batches are prepared in other processes while
        the step runs, `prefetch_factor` batches ahead per worker; if even then the loop waits, every worker is
        busy and the per-sample work in `Dataset.__getitem__` itself is the cost. Non-persistent workers are
        started again at every epoch, which on short epochs can cost as much as the epoch.
    """,
    fix="""
        Load in parallel with the step: give the `DataLoader` `num_workers` (a few, up to the CPU cores you
        have), `persistent_workers=True` so that they survive the epoch, and `pin_memory=True` when the model
        is on a GPU. When the workers keep up on average but some batches take far longer, a larger
        `prefetch_factor` keeps more batches ready. When the workers are already all busy, make `__getitem__`
        cheaper: decode once and cache, store preprocessed tensors, or run the augmentation on the GPU.
    """,
    bad=Example(
        """
        loader = DataLoader(dataset, batch_size=8)
        for x, y in loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        loader = DataLoader(dataset, batch_size=8, num_workers=4, persistent_workers=True)
        for x, y in loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
        """,
        setup=_SETUP,
    ),
    details={
        "runtime": """
            `watch` times every `DataLoader` iterator's `__next__` and a sample of the steps (see the step-time
            breakdown in the report: in the first 32 steps all but every fifth, then one step in 10, never a
            periodic step). It reports when, over the timed steps (the first is left out, at least
            8; steps whose time outside `__next__` is over 5 times the median's, which also validated or saved
            a checkpoint, are left out too), half of the time or more was spent inside `__next__`: a share of the
            measured steps, so a
            slower or busier machine gives the same verdict, and a sum rather than a per-step median, since
            workers that cannot keep up make every few steps wait long and the others not at all. For a loader
            without workers, which loads in the training thread, the time that thread waited for a CPU while the
            machine ran something else (its run delay, from Linux's per-thread scheduler statistics) is taken off
            both the `__next__` calls and the steps: what is left is the thread's own work and its voluntary
            waits (reading files, a sleep, a blocking GPU synchronisation), which a busy neighbour does not
            change. Measured on this project's 2-core VM: the wall-time share of one 0.35 ms loop went from 0.35
            to 0.60 between runs (a few steps preempted inside `__next__`), and under four busy loops a loop
            decoding for 2.3 ms of its 3.5 ms fell to 0.15-0.24 (the preemptions fell on the rest of each step);
            less the run delay, a third and two thirds. Where the kernel keeps no such statistics, the wall time
            is used. With workers, the loop's wait is its own wall time, but whether the workers are to blame
            is asked of the workers themselves where they were timed (below): when one batch takes a worker,
            less its run delay, at most 3/4 of the loop's own time per step once spread over the workers, and
            no batch outlasts the queue ahead of it (prefetch_factor times the workers' steps), the workers keep
            up on a machine of their own, and the wait was the machine's load (measured: the Good example's
            workers, 24 ms of sleep a batch, took 156 ms a batch under four busy loops on 2 cores): quiet. The
            fix is the
            user's own DataLoader line (the assignment in their file that builds the loader the loop iterates,
            else a call rebuilt from the loader's settings, in the names their code gives the loader and its
            dataset) with what that loader lacks: workers; `persistent_workers` when the first and last
            `__next__` of each pass (the workers starting and stopping) is most of the wait; `pin_memory` when
            the model is on a GPU; a deeper `prefetch_factor` when the workers keep up on average but deliver
            in bursts; else more workers, or, every core running one, a cheaper `__getitem__`. Bursts are told
            from workers that cannot keep up by the time one batch takes a worker, measured inside the workers
            (the dataset fetcher's `fetch` is timed while a session runs, in workers forked after it started):
            when that time spread over the workers is at most 3/4 of the loop's own time per step, the workers
            keep up and a slow batch stalls the queue; the proposed `prefetch_factor` keeps enough batches
            ready per worker to cover the longest wait. Workers not forked from the session (spawn, or started
            before it) give no such time, and the fix does not propose it.
            Quiet: loops whose data is cheap next to their compute, loaders whose workers keep up, and loops
            that take their batches from anything other than a `DataLoader` (not timed).
        """,
    },
)


@INPUT_BOUND.runtime
class InputBound(ClockCheck):
    """Once enough steps were timed: does the median step wait for its batch half of its time or more?"""

    def on_start(self) -> None:
        super().on_start()
        self.calls: dict[int, tuple[LoaderCall, list[int]]] = {}  # id(iterator) -> its line, its workers' pids
        self.worker_times: Optional[WorkerTimes] = None
        try:
            self.worker_times = WorkerTimes()
            for handle in self.worker_times.handles:
                self.ctx.hooks.add(handle)
        except Exception as exc:  # without the workers' own times, the verdict goes on without bursts
            self.ctx.fault(self, exc)

    def on_loader_iter(self, event: LoaderEvent) -> None:
        """A pass starts, in the user's loop: read there how the user builds this loader (names, not objects),
        and which processes are its workers."""
        if len(self.calls) >= 8:
            self.calls.clear()
        pids = [w.pid for w in getattr(event.iterator, "_workers", ()) if getattr(w, "pid", None)]
        self.calls[id(event.iterator)] = (LoaderCall(event.loader), pids)

    def judge(self, clock: "StepClock") -> Iterator[Finding]:
        from torchdoctor.sdk.runtime import DATA

        loader = clock.data_loader()
        share = phase_share(clock, DATA, ready_time=loader is not None and loader.workers == 0)
        if share is None or share < THRESHOLD or loader is None:
            return
        rows = clock.rows()
        step = sorted(r[-1] for r in rows)[len(rows) // 2]
        wait = sorted(r[DATA] for r in rows)[len(rows) // 2]
        said = (
            f"the training loop waited for its next batch {100 * share:.0f}% of the time of {len(rows)} steps "
            f"(median step {ms(step)}, median wait {ms(wait)} inside the {loader.label} DataLoader's __next__)"
        )
        call, pids = self._call(clock, loader)
        bursts = None
        measured = self._measured(clock, loader, pids)
        if measured is not None:
            per, own = measured
            if per.ready / loader.workers <= KEEP_UP * own:  # on a machine of their own the workers keep up
                if per.longest <= (loader.prefetch or 2) * loader.workers * own:
                    return  # and no batch outlasts the queue ahead of it: the waits were the machine's load
                bursts = self._bursts(clock, loader, per.ready, own)
        yield Finding(
            f"{said}; {self._cause(clock, loader, step, bursts)}",
            fix=self._fix(loader, call, bursts),
            location=Location(module=loader.label),
        )

    def _call(self, clock: "StepClock", loader: "LoaderWait") -> tuple[LoaderCall, list[int]]:
        """How the user builds the loader waited for, and its workers (read when its pass started)."""
        for key, wait in clock.loaders.items():
            if wait is loader and key in self.calls:
                return self.calls[key]
        return next(reversed(self.calls.values()), None) or (LoaderCall(None), [])

    def _measured(self, clock: "StepClock", loader: "LoaderWait", pids: list[int]) -> Optional[tuple[PerBatch, float]]:
        """What one batch takes the loader's workers, measured in the workers, and the loop's own time per step
        (None where the workers were not timed, or the wait is their start-up)."""
        from torchdoctor.sdk.runtime import DATA

        if loader.workers == 0 or self.worker_times is None or self._startup_bound(clock):
            return None
        measured = self.worker_times.per_batch(pids)
        if measured is None or measured.batches < 2 * loader.workers:
            return None
        rows = clock.rows()
        own = sorted(r[-1] - r[DATA] for r in rows)[len(rows) // 2]  # the loop's own time per step
        return (measured, own) if own > 0 else None

    def _bursts(self, clock: "StepClock", loader: "LoaderWait", per_batch: float, own: float) -> "_Bursts":
        """The workers keep up on average — the time one batch takes a worker, spread over the workers, is well
        below the loop's own time per step — but a batch outlasts the queue: the waits come in bursts (a slow
        batch holds the queue), which more batches ready ahead absorb."""
        from torchdoctor.sdk.runtime import DATA

        longest = max(r[DATA] for r in clock.rows())
        prefetch = loader.prefetch or 2
        ahead = math.ceil(longest / (own * loader.workers))  # batches per worker the longest wait would need
        return _Bursts(per_batch, own, longest, min(MAX_PREFETCH, max(2 * prefetch, prefetch + ahead)))

    def _cause(self, clock: "StepClock", loader: "LoaderWait", step: float, bursts: Optional["_Bursts"]) -> str:
        if bursts is not None:
            return (
                f"its {loader.workers} workers keep up on average (one batch takes a worker "
                f"{ms(bursts.per_batch)}, {ms(bursts.per_batch / loader.workers)} a step across them, while the "
                f"loop's own work takes {ms(bursts.own)} a step) but deliver in bursts: some batches take far "
                f"longer, and with {loader.prefetch or 2} batches ready per worker the loop waits up to "
                f"{ms(bursts.longest)} for one."
            )
        if loader.workers == 0:
            per = f", about {ms(step / loader.batch_size)} per sample" if loader.batch_size else ""
            return f"it has num_workers=0, so every batch is loaded in the training process between two steps{per}."
        if self._startup_bound(clock):
            return (
                f"most of that wait is at the start and end of each pass: its {loader.workers} workers are "
                "started again at every epoch and stopped at its end (persistent_workers=False)."
            )
        batch = step * loader.workers  # steady state: the workers together deliver one batch per step
        per = (
            (
                f" (about {ms(batch / loader.batch_size)} per sample: __getitem__, collating and the transfer to "
                "the training process)"
            )
            if loader.batch_size
            else ""
        )
        return (
            f"its {loader.workers} workers cannot keep up: at this pace one batch takes a worker about "
            f"{ms(batch)}{per}."
        )

    def _startup_bound(self, clock: "StepClock") -> bool:
        passes = [w for w in clock.loaders.values() if w.workers > 0 and w.batches > 1]
        return (
            bool(passes)
            and not passes[0].persistent
            and sum(w.edge_wait for w in passes) >= 0.5 * sum(w.wait for w in passes)
        )

    def _fix(self, loader: "LoaderWait", call: LoaderCall, bursts: Optional["_Bursts"]) -> Fix:
        """The user's DataLoader line with what this loader lacks added (see the definition's details)."""
        changes: dict[str, str] = {}
        if bursts is not None:
            changes["prefetch_factor"] = str(bursts.prefetch)
            what = (
                f"Keep more batches ready per worker ({bursts.prefetch} instead of {loader.prefetch or 2}), so that "
                "a slow batch does not stall the loop"
            )
            if not loader.persistent:
                changes["persistent_workers"] = "True"
        elif loader.workers == 0:
            changes.update(num_workers=str(WORKERS), persistent_workers="True")
            what = "Load batches in worker processes while the step runs, and keep them across epochs"
        elif not loader.persistent and self._startup_bound(self.ctx.clock):
            changes["persistent_workers"] = "True"
            what = "Keep the workers alive across epochs instead of starting them at every pass"
        else:
            cores = os.cpu_count() or 1
            more = min(max(2 * loader.workers, loader.workers + 1), cores)
            if more > loader.workers:
                changes["num_workers"] = str(more)
                what = (
                    f"Give the loader more workers (up to the {cores} CPU cores), or make "
                    f"{loader.label}.__getitem__ cheaper (decode once and cache, augment on the GPU)"
                )
            else:
                what = (
                    f"Every CPU core already runs a worker: make {loader.label}.__getitem__ cheaper "
                    "(preprocess once and store tensors, cache decoded samples, augment on the GPU)"
                )
            if not loader.persistent:
                changes["persistent_workers"] = "True"
        if self._on_cuda() and not loader.pin_memory:
            changes["pin_memory"] = "True"
        return call.fix(what, changes)

    def _on_cuda(self) -> bool:
        return any(p.is_cuda for wm in self.ctx.models for p in list(wm.inner.parameters())[:1])


class _Bursts:
    """What shows the waits come in bursts: seconds per batch in a worker, the loop's own seconds per step, the
    longest wait, and the prefetch_factor that would keep enough batches ready."""

    def __init__(self, per_batch: float, own: float, longest: float, prefetch: int) -> None:
        self.per_batch, self.own, self.longest, self.prefetch = per_batch, own, longest, prefetch
