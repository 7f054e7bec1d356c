"""Runtime checks on data loading: samplers whose epoch is never advanced, IterableDatasets every worker repeats."""
from __future__ import annotations

import weakref
from typing import Any, Iterator

from torchdoctor.findings import Finding, Location
from torchdoctor.registry import Scope, check
from torchdoctor.watch.contract import LoaderEvent, RuntimeCheck
from torchdoctor.watch.handles import Restore


def _samplers(loader: Any) -> list[Any]:
    """The loader's samplers that have an epoch to advance (``set_epoch`` and an ``epoch`` attribute)."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    found = [getattr(loader, "sampler", None), getattr(batch_sampler, "sampler", None), batch_sampler]
    unique = {id(s): s for s in found if s is not None}
    return [s for s in unique.values() if callable(getattr(s, "set_epoch", None)) and hasattr(s, "epoch")]


def _dataset_name(loader: Any) -> str:
    return type(getattr(loader, "dataset", None)).__name__


@check(code="TD311", name="sampler-epoch-not-set", scope=Scope.RUNTIME, severity="warning",
       summary="A shuffling sampler with set_epoch() (DistributedSampler) starts a new pass with the same epoch.")
class SamplerEpochNotSet(RuntimeCheck):
    """At each ``iter(loader)``: a shuffling sampler whose ``epoch`` did not change since its last pass."""

    def on_start(self) -> None:
        self.last: dict[int, tuple[Any, Any]] = {}  # id(sampler) -> (weakref, epoch at its last pass)
        self.reported: set[int] = set()

    def on_loader_iter(self, event: LoaderEvent) -> Iterator[Finding]:
        for sampler in _samplers(event.loader):
            if not getattr(sampler, "shuffle", True):
                continue  # a fixed order is what the user asked for (e.g. validation)
            key, epoch = id(sampler), sampler.epoch
            previous = self.last.get(key)
            self.last[key] = (weakref.ref(sampler), epoch)
            if previous is None or previous[0]() is not sampler or previous[1] != epoch or key in self.reported:
                continue
            self.reported.add(key)
            yield Finding(
                f"{type(sampler).__name__} of the DataLoader over {_dataset_name(event.loader)} started another pass "
                f"with epoch still {epoch}: set_epoch() was not called, so every epoch shuffles into the same order.",
                fix="Advance the sampler's epoch before each pass:\n"
                    "for epoch in range(epochs):\n"
                    "    sampler.set_epoch(epoch)\n"
                    "    for batch in loader:\n"
                    "        ...",
                location=Location(key=type(sampler).__name__, step=self.ctx.step))


def _fingerprint(batch: Any, depth: int = 0) -> Any:
    """A small value that differs between batches with different content (sums, not the data itself)."""
    import torch

    if isinstance(batch, torch.Tensor):
        t = batch.detach().reshape(-1)
        if t.is_complex():
            t = torch.view_as_real(t).reshape(-1)
        t = t.to(torch.float64)
        weights = torch.arange(1, t.numel() + 1, dtype=torch.float64, device=t.device)
        return (tuple(batch.shape), float(t.sum()), float((t * weights).sum()))
    if depth < 3 and isinstance(batch, dict):
        return tuple((k, _fingerprint(v, depth + 1)) for k, v in batch.items())
    if depth < 3 and isinstance(batch, (list, tuple)):
        return tuple(_fingerprint(v, depth + 1) for v in batch)
    return repr(batch)[:200]


class _Sniffer:
    """Fingerprints the first 2 × num_workers batches of one pass, then removes itself."""

    def __init__(self, check: "IterableDatasetDuplication", loader: Any, iterator: Any, workers: int) -> None:
        self.check, self.workers = check, workers
        self.dataset = _dataset_name(loader)
        self.prints: list[Any] = []
        self.original = iterator._next_data
        object.__setattr__(iterator, "_next_data", self)
        self.handle = check.ctx.hooks.add(Restore(iterator, "_next_data", self))

    def __call__(self) -> Any:
        try:
            batch = self.original()
        except StopIteration:
            self._done(verdict=True)
            raise
        try:
            self.prints.append(_fingerprint(batch))
            if len(self.prints) >= 2 * self.workers:
                self._done(verdict=True)
        except Exception as exc:  # never break the user's data loading
            self._done(verdict=False)
            self.check.ctx.fault(self.check, exc)
        return batch

    def _done(self, verdict: bool) -> None:
        self.check.ctx.hooks.remove(self.handle)
        if verdict:
            self.check.verdict(self)


@check(code="TD312", name="iterable-dataset-duplication", scope=Scope.RUNTIME, severity="error",
       summary="An IterableDataset read by several workers that does not shard: every worker yields all of it.")
class IterableDatasetDuplication(RuntimeCheck):
    """Workers take turns, so batches 0..n-1 are the first batch of each of the n workers: all equal (while
    the next round differs) means every worker yields the same stream."""

    def on_start(self) -> None:
        self.reported = False

    def on_loader_iter(self, event: LoaderEvent) -> None:
        from torch.utils.data import IterableDataset

        workers = getattr(event.loader, "num_workers", 0)
        if self.reported or workers < 2 or not isinstance(getattr(event.loader, "dataset", None), IterableDataset):
            return
        if not hasattr(event.iterator, "_next_data"):
            return
        _Sniffer(self, event.loader, event.iterator, workers)

    def verdict(self, sniffer: _Sniffer) -> None:
        n, prints = sniffer.workers, sniffer.prints
        first, second = prints[:n], prints[n:2 * n]
        if len(first) < n or len(set(map(repr, first))) != 1:
            return
        if len(second) == n and len(set(map(repr, second))) == 1 and repr(second[0]) == repr(first[0]):
            return  # the data itself is constant: nothing to conclude
        self.reported = True
        self.ctx.emit(self, Finding(
            f"The DataLoader over {sniffer.dataset} (an IterableDataset) runs {n} workers and their first batches "
            f"are identical: the dataset does not shard by worker, so every worker yields the whole dataset and "
            f"each sample is seen {n} times per epoch.",
            fix="Shard in __iter__ by worker:\n"
                "def __iter__(self):\n"
                "    info = torch.utils.data.get_worker_info()\n"
                "    start, step = (info.id, info.num_workers) if info else (0, 1)\n"
                "    return itertools.islice(self.source(), start, None, step)",
            location=Location(key=sniffer.dataset, step=self.ctx.step)))
