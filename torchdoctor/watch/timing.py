"""The step clock: where each training step's time goes (data wait, forward, backward, optimizer, other).

A session whose checks ask for it (``RuntimeCheck.uses_clock``) keeps one `StepClock`. It takes a
``time.perf_counter()`` reading at events watch already sees — a watched model's forward returning, an
optimizer's ``step()`` starting and returning — plus the start and end of every ``torch.autograd.backward``
call and of every ``__next__`` of a ``DataLoader`` iterator (`NextPatch`: patches shared by live sessions,
like `torchdoctor.watch.patches.LoaderPatch`; a wrapper costs two clock readings, where a hook on each
step's graph made the autograd engine call back into Python three times per step). The time between two
readings goes to one phase:

=================  ==============================================================================
data               inside the loader's ``__next__`` (the loop waited for its batch), and starting a
                   multi-process iterator's workers
forward            from the previous reading to the end of a watched forward (moving the batch to the
                   device and ``zero_grad()`` before it), and on to the start of its backward (the loss)
backward           inside ``torch.autograd.backward`` (``loss.backward()``, and the final callbacks the
                   engine runs before it returns, such as DDP's wait for the gradient all-reduce);
                   several under gradient accumulation. Where no backward is seen: from the forward's
                   end to ``step()`` or to the next batch
optimizer          from the backward's end to the end of ``step()`` (unscaling, clipping, the step)
other              from ``step()`` returning to the next batch (logging, metrics, checkpoints)
=================  ==============================================================================

A step ends when the first watched optimizer's ``step()`` returns; steps are numbered by the completed steps
before them (0, 1, ...). The clock times a sample of them, never a periodic step (multiples of ``every``, 10
by default, and of 100), where the checks do their own work, which would bias the breakdown: in the first
``DENSE_STEPS`` (32, which watch observes in full anyway) all but the multiples of `SKIP` (5) (steps 1-4, 6-9,
...: a short run gets its verdicts), after them one step in `SAMPLE` (10), those numbered ``OFFSET`` (3) modulo
`SAMPLE` (33, 43, 53, ...). On the other steps the hooks skip the readings (``timing``
is False: the event hub looks at it before calling, and ``torch.autograd.backward`` is wrapped only while some
clock times its step, `_arm_backward`), except that every ``step()``
of the first optimizer still counts the step, and every loader ``__next__`` still counts toward its pass
(`LoaderWait`: waits, batches, start-up), so the loader's facts are exact. The warm-up (step 0) is
left out. The last `WINDOW` timed steps are kept in preallocated arrays (no allocation per step),
and the whole run as blocks of `BLOCK` steps (at most `MAX_BLOCKS`, merged pairwise when full), each the
median of its timed steps and the CPU time per step (over all its steps) of the thread that steps, for
trends. Host time only: with CUDA, kernels run asynchronously and the time shows up where the host waits
for them.
"""

from __future__ import annotations

import functools
import statistics
import threading
import time
from array import array
from typing import Any, Callable, Optional

from .context import DENSE_STEPS
from .run_delay import AVAILABLE, run_delay

PHASES = ("data", "forward", "backward", "optimizer", "other")
DATA, FORWARD, BACKWARD, OPTIMIZER, OTHER = range(5)
WINDOW = 512  # steps kept for the breakdown
BLOCK = 16  # steps per block of the run's history
MAX_BLOCKS = 128
_ZEROS = [0.0] * len(PHASES)
IDLE, FORWARD_DONE, IN_BACKWARD, BACKWARD_DONE = range(4)  # where the step is, for the next reading
WARMUP = 1  # the first steps (allocations, compilation, worker start) are left out of the statistics
SKIP = 5  # in the first DENSE_STEPS, every step but the multiples of SKIP (periodic steps) is timed
SAMPLE = 10  # after them one step in SAMPLE: a timed step costs about 20 us more than another (a 1 ms step's 2%)
OFFSET = 3  # ... those numbered OFFSET modulo SAMPLE: never a multiple of 2 or 5, so never a periodic step


class LoaderWait:
    """One pass over a loader: its settings (read once from the iterator) and the time waited in it."""

    __slots__ = (
        "label",
        "batch_size",
        "workers",
        "pin_memory",
        "persistent",
        "prefetch",
        "wait",
        "first_wait",
        "last_wait",
        "batches",
        "opened",
    )

    def __init__(self, iterator: Any) -> None:
        dataset = getattr(iterator, "_dataset", None)
        self.label = type(dataset).__name__ if dataset is not None else "DataLoader"
        sampler = getattr(iterator, "_index_sampler", None)
        self.batch_size: Optional[int] = getattr(sampler, "batch_size", None)
        self.workers: int = getattr(iterator, "_num_workers", 0)
        self.pin_memory: bool = bool(getattr(iterator, "_pin_memory", False))
        self.persistent: bool = bool(getattr(iterator, "_persistent_workers", False))
        self.prefetch: Optional[int] = getattr(iterator, "_prefetch_factor", None)
        self.wait = 0.0
        self.first_wait = 0.0  # the first batch of the pass: worker start-up
        self.last_wait = 0.0  # the last call (at the end of a pass: StopIteration, worker shut-down)
        self.batches = 0
        self.opened = False  # started by the iterator's __init__ (its workers), before its first batch

    @property
    def edge_wait(self) -> float:
        """The wait at the pass's first and last ``__next__``: starting and stopping non-persistent workers."""
        return self.first_wait + (self.last_wait if self.batches > 1 else 0.0)

    def facts(self) -> dict[str, Any]:
        return {
            "dataset": self.label,
            "batch_size": self.batch_size,
            "num_workers": self.workers,
            "pin_memory": self.pin_memory,
            "persistent_workers": self.persistent,
            "prefetch_factor": self.prefetch,
        }


class StepClock:
    """Per-phase time of each step of one session (see the module docstring)."""

    def __init__(self, first_optimizer: Any = None) -> None:
        # its id only (a finished session holds nothing); None: the first optimizer that steps (`torchdoctor run`
        # adopts optimizers as they step)
        self.first_optimizer = id(first_optimizer) if first_optimizer is not None else None
        self.acc = [0.0] * len(PHASES)
        self.last = time.perf_counter()
        self.state = IDLE
        self.broken = False  # a reading failed: the clock reads no more (the user's loop goes on)
        self.window = array("d", bytes(8 * WINDOW * (len(PHASES) + 1)))  # per step: phases, then the total
        self.steps = 0  # steps ended, warm-up included
        self.sample = SAMPLE  # one step in `sample` is timed (read at construction: tests may set SAMPLE)
        self.timing = self._timed_step(0)  # the current step is timed: the hooks read the time (cheap flag)
        self.next_timed = self._next_timed(0)  # the number of the next timed step
        self.count = 0  # timed steps ended (after the warm-up): the window's last row
        self.block: list[float] = []  # the current block's timed step times
        self.block_end = WARMUP + BLOCK  # the steps ended when the current block is full
        # until then an ended step only counts: the event hub adds it to `steps` without calling `step_post`
        self.wake = min(self.next_timed, self.block_end)
        self.blocks: list[float] = []  # medians of past blocks
        # CPU seconds per step of past blocks, of the thread that steps: the loop's own work, which neither a
        # busier machine nor a growing wait (a sleep, I/O, other threads spinning) adds to
        self.block_cpu: list[float] = []
        self.block_size = BLOCK  # steps per block (doubled when the blocks are merged)
        self.cpu_mark = time.thread_time()
        self.loaders: dict[int, LoaderWait] = {}  # id(iterator) -> its pass (the last few)
        self.wait_by: dict[int, float] = {}  # id(LoaderWait) -> wait in timed steps
        self.last_loader: Optional[LoaderWait] = None
        # per timed step, the time the training thread waited for a CPU (`run_delay`): inside an in-process
        # loader's __next__, and in the whole step (measured once such a loader feeds the loop)
        self.delay_window = array("d", bytes(8 * WINDOW * 2))
        self.data_delay = 0.0
        self.delay_from = -1.0  # the thread's run delay when the current step began (< 0: not measured)
        self.delay_thread = 0  # the thread that iterates the in-process loader

    # -- marks (called from the hooks; cheap) ------------------------------------------------------

    def data(
        self,
        iterator: Any,
        start: float,
        end: float,
        starting: bool = False,
        delayed: Optional[tuple[float, float]] = None,
    ) -> None:
        """One ``__next__`` of a loader iterator (or, `starting`, the start of its workers) ran from `start` to
        `end`; an in-process one gives `delayed`, the thread's run delay when it started and when it ended."""
        if self.timing:  # the phases of a timed step; the pass below counts every call
            if delayed is not None:
                thread = threading.get_ident()
                if self.delay_from < 0.0 or thread != self.delay_thread:  # the step began at this __next__
                    self.delay_thread, self.delay_from, self.data_delay = thread, delayed[0], 0.0
                self.data_delay += delayed[1] - delayed[0]
            acc = self.acc
            acc[BACKWARD if self.state == FORWARD_DONE else OTHER] += start - self.last
            acc[DATA] += end - start
            self.state = IDLE
            self.last = end
        key = id(iterator)
        wait = self.loaders.get(key)
        if starting or wait is None or (getattr(iterator, "_num_yielded", 0) == 1 and not wait.opened):
            if len(self.loaders) >= 8:
                self.loaders.clear()
            wait = self.loaders[key] = LoaderWait(iterator)  # a new pass (an iterator's id may be reused)
            wait.first_wait = end - start
            wait.opened = starting
        else:
            wait.opened = False
            if wait.batches == 0:
                wait.first_wait += end - start
        wait.wait += end - start
        wait.last_wait = end - start
        wait.batches += 0 if starting else 1
        self.last_loader = wait

    def forward_end(self) -> None:
        """A watched forward returned."""
        now = time.perf_counter()
        if self.state == IN_BACKWARD:  # a forward run again inside the backward (activation checkpointing)
            self.acc[BACKWARD] += now - self.last
        else:
            self.acc[FORWARD] += now - self.last
            self.state = FORWARD_DONE
        self.last = now

    def backward_start(self, start: float) -> None:
        """A backward pass starts (the loss before it is forward time)."""
        self.acc[BACKWARD if self.state == IN_BACKWARD else FORWARD] += start - self.last
        self.last = start
        self.state = IN_BACKWARD

    def backward_end(self, end: float) -> None:
        """The backward pass (and the engine's final callbacks) returned."""
        self.acc[BACKWARD] += end - self.last
        self.last = end
        self.state = BACKWARD_DONE

    def step_pre(self) -> None:
        """``step()`` starts: since the backward ended, the time went to preparing the step (unscaling,
        clipping); without a backward seen (a graph not from a watched forward), it is all backward."""
        now = time.perf_counter()
        self.acc[OPTIMIZER if self.state == BACKWARD_DONE else BACKWARD] += now - self.last
        self.state = IDLE
        self.last = now

    def _timed_step(self, step: int) -> bool:
        """Whether the step numbered `step` (completed steps before it) is timed: in the first `DENSE_STEPS`
        (observed in full anyway) those not a multiple of `SKIP`, then one in `sample`, never a periodic step."""
        if self.sample == 1:
            return True
        if step < DENSE_STEPS:
            return step % SKIP != 0
        return step % self.sample == OFFSET % self.sample

    def _next_timed(self, step: int) -> int:
        """The number of the first timed step after the step numbered `step`."""
        if step >= DENSE_STEPS and self._timed_step(step):
            return step + self.sample
        step += 1
        while not self._timed_step(step):
            step += 1
        return step

    def step_post(self, optimizer: Any) -> None:
        """An optimizer's ``step()`` returned: the first optimizer's ends the step (every step, timed or not)."""
        if self.first_optimizer is None:
            self.first_optimizer = id(optimizer)
        steps = self.steps + 1
        if self.timing:
            now = time.perf_counter()
            self.acc[OPTIMIZER] += now - self.last
            self.last = now
        if id(optimizer) != self.first_optimizer:
            return
        self.steps = steps
        if self.timing and steps > WARMUP:
            self._record()
        if steps >= self.block_end:
            self._close_block()
        timing = steps == self.next_timed
        if timing != self.timing:
            self.timing = timing
            _arm_backward()
        if timing:
            self._begin()

    def _begin(self) -> None:
        """The next step is timed: it starts now."""
        self.next_timed = self._next_timed(self.steps)
        self.wake = min(self.next_timed, self.block_end)
        self.acc[:] = _ZEROS
        self.data_delay = 0.0
        self.state = IDLE
        if self.delay_from >= 0.0 and threading.get_ident() == self.delay_thread:
            self.delay_from = run_delay()  # < 0 where it cannot be read: the next __next__ starts it
        self.last = time.perf_counter()

    def _record(self) -> None:
        """A timed step ended (`last`: when): its row of the window, its run delay, its loader wait, its block."""
        step_delay = -1.0
        if self.delay_from >= 0.0 and threading.get_ident() == self.delay_thread:
            delay = run_delay()
            step_delay, self.delay_from = (delay - self.delay_from, delay) if delay >= 0.0 else (-1.0, -1.0)
        acc = self.acc
        total = sum(acc)
        self.count += 1
        at = self.count % WINDOW
        row = at * (len(PHASES) + 1)
        self.window[row : row + len(PHASES) + 1] = array("d", [*acc, total])
        data = acc[DATA]
        self.delay_window[2 * at] = self.data_delay
        self.delay_window[2 * at + 1] = step_delay
        if data and self.last_loader is not None:
            key = id(self.last_loader)
            self.wait_by[key] = self.wait_by.get(key, 0.0) + data
        self.block.append(total)

    def _close_block(self) -> None:
        cpu = time.thread_time()
        block = self.block or (self.blocks[-1:] if self.blocks else [0.0])  # no timed step in it: as the last
        self.blocks.append(statistics.median(block))
        self.block_cpu.append((cpu - self.cpu_mark) / self.block_size)  # per step of the thread, timed or not
        self.cpu_mark = cpu
        self.block = []
        if len(self.blocks) >= MAX_BLOCKS:  # keep the whole run in bounded memory: halve the resolution
            self.blocks = [(a + b) / 2 for a, b in zip(self.blocks[::2], self.blocks[1::2])]
            self.block_cpu = [(a + b) / 2 for a, b in zip(self.block_cpu[::2], self.block_cpu[1::2])]
            self.block_size *= 2
        self.block_end += self.block_size
        self.wake = min(self.next_timed, self.block_end)

    # -- reading -----------------------------------------------------------------------------------

    @property
    def timed(self) -> int:
        """Timed steps in the window (after the warm-up)."""
        return min(self.count, WINDOW)

    @property
    def blocks_start(self) -> int:
        """The steps before the first block (the warm-up): block ``i`` holds steps ``blocks_start + i *
        block_size + 1`` to ``blocks_start + (i + 1) * block_size`` (counting from 1)."""
        return self.block_end - (len(self.blocks) + 1) * self.block_size

    def rows(self) -> list[tuple[float, ...]]:
        """The timed steps in the window, newest first, each (phase seconds..., total)."""
        width = len(PHASES) + 1
        rows = []
        for k in range(self.timed):
            row = ((self.count - k) % WINDOW) * width
            rows.append(tuple(self.window[row : row + width]))
        return rows

    def delay_rows(self) -> list[tuple[float, float]]:
        """For the steps of `rows()`, in its order: the seconds the training thread waited for a CPU inside an
        in-process loader's ``__next__``, and in the whole step (the latter < 0 where not measured)."""
        window = self.delay_window
        return [
            (window[2 * ((self.count - k) % WINDOW)], window[2 * ((self.count - k) % WINDOW) + 1])
            for k in range(self.timed)
        ]

    def shares(self) -> Optional[dict[str, float]]:
        """Each phase's share of the measured step time over the window (None before a timed step)."""
        rows = self.rows()
        total = sum(r[-1] for r in rows)
        if not rows or total <= 0:
            return None
        return {name: sum(r[i] for r in rows) / total for i, name in enumerate(PHASES)}

    def summary(self) -> Optional[dict[str, Any]]:
        """The breakdown for the report's facts: per phase median and p90 (ms) and share; steps/s (of the timed
        steps: "steps" counts them, one in "timed_every"); None before a timed step, or once a reading failed."""
        if self.broken:
            return None
        rows = self.rows()
        shares = self.shares()
        if shares is None:
            return None
        totals = sorted(r[-1] for r in rows)
        phases = {}
        for i, name in enumerate(PHASES):
            values = sorted(r[i] for r in rows)
            phases[name] = {
                "share": round(shares[name], 4),
                "median_ms": round(_quantile(values, 0.5) * 1e3, 3),
                "p90_ms": round(_quantile(values, 0.9) * 1e3, 3),
            }
        facts: dict[str, Any] = {
            "steps": len(rows),
            "warmup_steps": min(self.steps, WARMUP),
            "timed_every": self.sample,  # one step in this many is timed
            "step_median_ms": round(_quantile(totals, 0.5) * 1e3, 3),
            "step_p90_ms": round(_quantile(totals, 0.9) * 1e3, 3),
            "steps_per_s": round(len(totals) / sum(totals), 2),
            "phases": phases,
        }
        loader = self.data_loader()
        if loader is not None:
            facts["loader"] = loader.facts()
        return facts

    def data_loader(self) -> Optional[LoaderWait]:
        """The loader pass the timed steps waited for longest (None when they never waited for one)."""
        waits = {id(w): w for w in self.loaders.values()}
        best = max((k for k in self.wait_by if k in waits), key=self.wait_by.__getitem__, default=None)
        return waits[best] if best is not None else self.last_loader


def _quantile(values: list[float], q: float) -> float:
    """The q-quantile of sorted `values` (nearest rank)."""
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


# -- the shared patch of DataLoader iterators' __next__ ----------------------------------------------

_clocks: list[StepClock] = []
_originals: list[tuple[type, str, Callable[..., Any]]] = []


def _timed_next(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def timed_next(self: Any) -> Any:
        # loading in this thread, for a timed step: its run delay
        in_process = AVAILABLE and not getattr(self, "_num_workers", 0) and _timing()
        before = run_delay() if in_process else -1.0
        start = time.perf_counter()
        try:
            return original(self)
        finally:
            end = time.perf_counter()
            after = run_delay() if before >= 0.0 else -1.0
            delayed = (before, after) if after >= 0.0 else None
            for clock in _clocks:
                _read(clock, self, start, end, False, delayed)

    return timed_next


def _timing() -> bool:
    """Whether some clock times the current step."""
    for clock in _clocks:
        if clock.timing:
            return True
    return False


def _timed_start(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def timed_start(self: Any, *args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        try:
            original(self, *args, **kwargs)
        finally:
            end = time.perf_counter()
            for clock in _clocks:
                _read(clock, self, start, end, True)

    return timed_start


def _read(
    clock: StepClock,
    iterator: Any,
    start: float,
    end: float,
    starting: bool,
    delayed: Optional[tuple[float, float]] = None,
) -> None:
    """A clock's reading of a loader call; a failure stops that clock, never the user's data loading."""
    if clock.broken:
        return
    try:
        clock.data(iterator, start, end, starting, delayed)
    except Exception:
        clock.broken = True


_backward: list[Callable[..., Any]] = []  # torch.autograd.backward as found when last wrapped
_wrapper: list[Callable[..., Any]] = []  # our wrapper of it, made once
_depth = [0]  # backward calls running now: a backward inside another (reentrant checkpointing) is part of it


def _timed_backward(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        if _depth[0] or not _timing():  # inside another backward, or a step no clock times
            return original(*args, **kwargs)
        _depth[0] = 1
        _mark(StepClock.backward_start, time.perf_counter())
        try:
            return original(*args, **kwargs)
        finally:
            _depth[0] = 0
            _mark(StepClock.backward_end, time.perf_counter())

    return backward


def _arm_backward() -> None:
    """Wrap ``torch.autograd.backward`` while some clock times its step, and only then: the wrapper would cost a
    call at every other backward. Left alone when someone else replaced it since we wrapped it."""
    import torch.autograd

    want = False
    for clock in _clocks:  # a loop, not any() over a generator: no call per clock
        want = want or (clock.timing and not clock.broken)
    current = torch.autograd.backward
    ours = bool(_wrapper) and current is _wrapper[0]
    if want and not ours:
        if not _backward or current is not _backward[0]:
            _backward[:] = [current]
            _wrapper[:] = [_timed_backward(current)]
        torch.autograd.backward = _wrapper[0]
    elif not want and ours:
        torch.autograd.backward = _backward[0]


def _mark(mark: Callable[[StepClock, float], None], now: float) -> None:
    """The backward reading `mark` of every clock that times this step; a failure stops that clock, never the
    user's backward."""
    for clock in _clocks:
        if clock.timing and not clock.broken:
            try:
                mark(clock, now)
            except Exception:
                clock.broken = True


class NextPatch:
    """Handle of one clock listening to every ``DataLoader`` iterator's ``__next__`` (and to the start of a
    multi-process iterator's workers) and to ``torch.autograd.backward`` (which ``Tensor.backward`` calls);
    ``remove()`` stops it. Class-level patches: ``next()`` looks ``__next__`` up on the type."""

    def __init__(self, clock: StepClock) -> None:
        from torch.utils.data import dataloader

        self.clock = clock
        if not _originals:
            for cls, name, wrap in (
                (dataloader._BaseDataLoaderIter, "__next__", _timed_next),
                (dataloader._MultiProcessingDataLoaderIter, "__init__", _timed_start),
            ):
                original = cls.__dict__[name]
                _originals.append((cls, name, original))
                setattr(cls, name, wrap(original))
        _clocks.append(clock)
        _arm_backward()

    def remove(self) -> None:
        if self.clock in _clocks:
            _clocks.remove(self.clock)
        if not _clocks:
            while _originals:
                cls, name, original = _originals.pop()
                setattr(cls, name, original)
        _arm_backward()
