"""iterable-dataset-duplication: an IterableDataset read by several workers that does not shard yields it N times."""

from __future__ import annotations

from typing import Any

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import LoaderEvent, Restore, RuntimeCheck

_CSV_FILE = """
import itertools
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

Path("data.csv").write_text("".join(f"{i},{i + 1},{i + 2},{i + 3}\\n" for i in range(64)))
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
"""

ITERABLE_DATASET_DUPLICATION = Pitfall(
    code="TD312",
    name="iterable-dataset-duplication",
    severity="error",
    summary="An IterableDataset read by several workers that does not shard: every worker yields all of it.",
    why="""
        With `num_workers=N`, each worker process gets its own copy of the dataset and calls `__iter__` on it.
        Unless `__iter__` uses `torch.utils.data.get_worker_info()` to take only its share, every sample arrives
        N times per epoch: epochs are N times longer, the model sees duplicated batches, and metrics computed
        over an epoch are wrong.
    """,
    fix="Shard inside `__iter__` by worker id (or split the list of files or shards between workers).",
    bad=Example(
        """
        class Rows(IterableDataset):
            def __iter__(self):
                for line in open("data.csv"):
                    yield torch.tensor([float(v) for v in line.split(",")])

        for x in DataLoader(Rows(), batch_size=8, num_workers=2):
            optimizer.zero_grad()
            model(x).pow(2).mean().backward()
            optimizer.step()
        """,
        setup=_CSV_FILE,
    ),
    good=Example(
        """
        class Rows(IterableDataset):
            def __iter__(self):
                for line in open("data.csv"):
                    yield torch.tensor([float(v) for v in line.split(",")])

        class Rows(Rows):  # each worker takes every num_workers-th item, from its own id on
            def __iter__(self):
                info = torch.utils.data.get_worker_info()
                items = super().__iter__()
                return itertools.islice(items, info.id, None, info.num_workers) if info else items

        for x in DataLoader(Rows(), batch_size=8, num_workers=2):
            optimizer.zero_grad()
            model(x).pow(2).mean().backward()
            optimizer.step()
        """,
        setup=_CSV_FILE,
    ),
    details={
        "runtime": """
            When any `DataLoader` over an `IterableDataset` with two or more workers starts a pass during the
            session, `watch` fingerprints (sums, not copies) the first 2 × N batches. Workers deliver batches in
            turn, so batches 0..N-1 are the first batch of each worker: when they are all identical while the next
            round differs, it reports an error. A dataset whose batches are all the same is left alone, and nothing
            is read outside the normal iteration.
        """,
    },
)


def _dataset_name(loader: Any) -> str:
    return type(getattr(loader, "dataset", None)).__name__


class _Sniffer:
    """Fingerprints the first 2 × num_workers batches of one pass, then removes itself."""

    def __init__(self, check: "IterableDatasetDuplication", loader: Any, iterator: Any, workers: int) -> None:
        self.check, self.workers = check, workers
        self.dataset = _dataset_name(loader)
        self.dataset_type = type(getattr(loader, "dataset", None))  # a class, not the user's data
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
            from torchdoctor.sdk.runtime import fingerprint

            self.prints.append(fingerprint(batch))
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


def _shard_fix(cls: type) -> Fix:
    """A subclass under the same name that shards the class's own stream by worker: pasted right below the
    class, every `Rows()` built after it shards (a fix that works whatever `__iter__` does inside)."""
    name = cls.__name__
    try:
        import inspect

        _, line = inspect.getsourcelines(cls)
        at = f" ({inspect.getsourcefile(cls)}:{line})"
    except (OSError, TypeError):
        at = ""
    return Fix(
        f"Shard `{name}` by worker: paste this right below `class {name}`{at} (or put the first lines of its "
        "`__iter__` at the top of yours)",
        "import itertools\n\n"
        f"class {name}({name}):  # each worker takes every num_workers-th item, from its own id on\n"
        "    def __iter__(self):\n"
        "        info = torch.utils.data.get_worker_info()\n"
        "        items = super().__iter__()\n"
        "        return itertools.islice(items, info.id, None, info.num_workers) if info else items",
    )


@ITERABLE_DATASET_DUPLICATION.runtime
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
        first, second = prints[:n], prints[n : 2 * n]
        if len(first) < n or len(set(map(repr, first))) != 1:
            return
        if len(second) == n and len(set(map(repr, second))) == 1 and repr(second[0]) == repr(first[0]):
            return  # the data itself is constant: nothing to conclude
        self.reported = True
        self.ctx.emit(
            self,
            Finding(
                f"The DataLoader over {sniffer.dataset} (an IterableDataset) runs {n} workers and their first batches "
                f"are identical: the dataset does not shard by worker, so every worker yields the whole dataset and "
                f"each sample is seen {n} times per epoch.",
                fix=_shard_fix(sniffer.dataset_type),
                location=Location(key=sniffer.dataset, step=self.ctx.step),
            ),
        )
