"""How long one batch takes a DataLoader worker, measured in the worker itself: input-bound tells workers that
cannot keep up (more workers, a cheaper `__getitem__`) from workers that keep up on average but deliver in
bursts (a deeper `prefetch_factor`), which the training process alone cannot see.

While a session runs, the dataset fetchers' ``fetch`` (one batch: the `__getitem__` calls and the collation)
is timed inside worker processes — in the training process it is only called through. Workers forked after
the session started inherit the patch and add their time to a table in shared memory, one slot per process;
workers started otherwise (spawn, or before the session) leave it empty, and nothing is concluded.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any, Callable, Optional

SLOTS = 256  # processes: a slot by pid modulo SLOTS, holding (pid, seconds, batches)


class WorkerTimes:
    """The shared table and the patches that fill it (`handles`: what the session removes at its end)."""

    def __init__(self) -> None:
        import multiprocessing

        from torch.utils.data._utils import fetch

        from torchdoctor.sdk.runtime import Restore

        self.table: Any = multiprocessing.RawArray("d", 3 * SLOTS)
        self.handles = []
        for cls in (fetch._MapDatasetFetcher, fetch._IterableDatasetFetcher):
            original = cls.__dict__["fetch"]
            patched = _timed(original, self.table)
            cls.fetch = patched  # type: ignore[method-assign]
            self.handles.append(Restore(cls, "fetch", patched, original))

    def per_batch(self, pids: list[int]) -> Optional[tuple[float, int]]:
        """(seconds per batch, batches) over the workers `pids`, None before any of them timed a batch."""
        seconds, batches = 0.0, 0
        for pid in pids:
            slot = 3 * (pid % SLOTS)
            if int(self.table[slot]) == pid:
                seconds += self.table[slot + 1]
                batches += int(self.table[slot + 2])
        return (seconds / batches, batches) if batches else None


def _timed(original: Callable[..., Any], table: Any) -> Callable[..., Any]:
    from torch.utils.data import get_worker_info

    @functools.wraps(original)
    def fetch(self: Any, index: Any) -> Any:
        if get_worker_info() is None:  # the training process (num_workers=0): not a worker's time
            return original(self, index)
        start = time.perf_counter()
        batch = original(self, index)
        try:
            pid = os.getpid()
            slot = 3 * (pid % SLOTS)
            if int(table[slot]) != pid:
                table[slot], table[slot + 1], table[slot + 2] = pid, 0.0, 0.0
            table[slot + 1] += time.perf_counter() - start
            table[slot + 2] += 1
        except Exception:  # a measurement never breaks the user's data loading
            pass
        return batch

    return fetch
