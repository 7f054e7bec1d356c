"""How long one batch takes a DataLoader worker, measured in the worker itself: input-bound tells workers that
cannot keep up (more workers, a cheaper `__getitem__`) from workers that keep up on average but deliver in
bursts (a deeper `prefetch_factor`), which the training process alone cannot see.

While a session runs, the dataset fetchers' ``fetch`` (one batch: the `__getitem__` calls and the collation)
is timed inside worker processes — in the training process it is only called through. Workers forked after
the session started inherit the patch and add their time to a table in shared memory, one slot per process;
workers started otherwise (spawn, or before the session) leave it empty, and nothing is concluded. Each
batch's time is also kept less the time the worker waited for a CPU (its run delay, where Linux says): what
the batch would take on a machine of its own, which a busy neighbour does not stretch.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any, Callable, NamedTuple, Optional

SLOTS = 256  # processes: a slot by pid modulo SLOTS, holding FIELDS numbers
FIELDS = 5  # pid, seconds, batches, seconds less the run delay, the longest batch less its run delay


class WorkerTimes:
    """The shared table and the patches that fill it (`handles`: what the session removes at its end)."""

    def __init__(self) -> None:
        import multiprocessing

        from torch.utils.data._utils import fetch

        from torchdoctor.sdk.runtime import Restore

        self.table: Any = multiprocessing.RawArray("d", FIELDS * SLOTS)
        self.handles = []
        for cls in (fetch._MapDatasetFetcher, fetch._IterableDatasetFetcher):
            original = cls.__dict__["fetch"]
            patched = _timed(original, self.table)
            cls.fetch = patched  # type: ignore[method-assign]
            self.handles.append(Restore(cls, "fetch", patched, original))

    def per_batch(self, pids: list[int]) -> Optional["PerBatch"]:
        """What one batch took the workers `pids`, None before any of them timed a batch."""
        seconds = ready = longest = 0.0
        batches = 0
        for pid in pids:
            slot = FIELDS * (pid % SLOTS)
            if int(self.table[slot]) == pid:
                seconds += self.table[slot + 1]
                batches += int(self.table[slot + 2])
                ready += self.table[slot + 3]
                longest = max(longest, self.table[slot + 4])
        return PerBatch(seconds / batches, batches, ready / batches, longest) if batches else None


class PerBatch(NamedTuple):
    """Seconds per batch in the workers, batches timed, seconds per batch less the run delay (the time on a
    machine of their own), and the longest batch less its run delay."""

    seconds: float
    batches: int
    ready: float
    longest: float


def _timed(original: Callable[..., Any], table: Any) -> Callable[..., Any]:
    from torch.utils.data import get_worker_info

    from torchdoctor.sdk.runtime import run_delay

    @functools.wraps(original)
    def fetch(self: Any, index: Any) -> Any:
        if get_worker_info() is None:  # the training process (num_workers=0): not a worker's time
            return original(self, index)
        delay = run_delay()
        start = time.perf_counter()
        batch = original(self, index)
        try:
            seconds = time.perf_counter() - start
            after = run_delay() if delay >= 0.0 else -1.0
            ready = seconds - (after - delay) if after >= 0.0 else seconds
            pid = os.getpid()
            slot = FIELDS * (pid % SLOTS)
            if int(table[slot]) != pid:
                table[slot : slot + FIELDS] = [pid, 0.0, 0.0, 0.0, 0.0]
            table[slot + 1] += seconds
            table[slot + 2] += 1
            table[slot + 3] += ready
            table[slot + 4] = max(table[slot + 4], ready)
        except Exception:  # a measurement never breaks the user's data loading
            pass
        return batch

    return fetch
