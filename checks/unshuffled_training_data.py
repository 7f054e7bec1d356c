"""unshuffled-training-data: a map-style training loader without shuffling whose batches come in an order
that follows the labels (each batch one class), so every epoch ends on one class and the model forgets the rest."""

from __future__ import annotations

import weakref
from typing import Any, Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import LoaderEvent, RuntimeCheck, StepEvent

_SETUP = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x_all = torch.randn(512, 8)
y_all = (x_all[:, :4] * torch.tensor([1.0, -1.0, 2.0, 0.5])).argmax(dim=1)
order = y_all.argsort(stable=True)                         # the files were stored class by class
dataset = TensorDataset(x_all[order], y_all[order])
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
criterion = nn.CrossEntropyLoss()
"""

_LOOP = """
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""

UNSHUFFLED_TRAINING_DATA = Pitfall(
    code="TD323",
    name="unshuffled-training-data",
    severity="warning",
    summary="The training loader does not shuffle and its batches follow the labels (each batch one class), so "
    "every epoch ends on one class and the model forgets the others.",
    why="""
        A `DataLoader` without `shuffle=True` serves the dataset in its stored order, every epoch the same. Data
        stored class by class (folders read in order, a CSV sorted by label, datasets concatenated per class)
        then gives batches of one class at a time: each stretch of steps pulls the model towards the current
        class, the last class of the epoch wins, and the loss curve looks fine batch by batch while accuracy
        stays poor. Batch statistics (BatchNorm) are skewed the same way.
    """,
    fix="""
        Shuffle the training data: `DataLoader(dataset, batch_size=..., shuffle=True)` (or a shuffling sampler,
        `DistributedSampler(dataset, shuffle=True)` under DDP). Keep validation and test loaders unshuffled.
    """,
    bad=Example("loader = DataLoader(dataset, batch_size=32)" + _LOOP, setup=_SETUP),
    good=Example("loader = DataLoader(dataset, batch_size=32, shuffle=True)" + _LOOP, setup=_SETUP),
    details={
        "runtime": """
            When a `DataLoader` starts its first pass, it is examined if it is map-style (not an
            `IterableDataset`) and reads in a fixed order (`SequentialSampler`, or `DistributedSampler` with
            `shuffle=False`) with the default batch sampler, and its dataset declares integer class labels
            without reading any sample: the last tensor of a `TensorDataset`, a `targets` or `labels` attribute
            (torchvision datasets), through `Subset` and `ConcatDataset`. Its batches are suspect when their
            labels are far purer (share of the batch's most common label, at least 0.8) than the same labels
            shuffled would give. A suspect loader is reported once it fed three optimizer steps in a row (so a
            class-sorted validation loader is quiet). Time series (float targets), IterableDatasets, shuffling
            samplers, custom batch samplers and datasets whose labels can only be read by loading samples are not
            judged.
        """,
    },
)

_MAX_LABELS = 100_000
_MIN_PURITY = 0.8
_STEPS_IN_A_ROW = 3


def _labels(dataset: Any, depth: int = 0) -> Optional[Any]:
    """The dataset's integer class labels in index order, when it declares them (no sample is loaded)."""
    import torch
    from torch.utils.data import ConcatDataset, Subset, TensorDataset

    if depth > 4:
        return None
    if isinstance(dataset, Subset):
        parent = _labels(dataset.dataset, depth + 1)
        return None if parent is None else parent[torch.as_tensor(list(dataset.indices), dtype=torch.long)]
    if isinstance(dataset, ConcatDataset):
        parts = [_labels(d, depth + 1) for d in dataset.datasets]
        known = [p for p in parts if p is not None]
        return torch.cat(known) if known and len(known) == len(parts) else None
    if isinstance(dataset, TensorDataset):
        labels = dataset.tensors[-1] if len(dataset.tensors) > 1 else None
    else:
        labels = next(
            (getattr(dataset, a) for a in ("targets", "labels") if getattr(dataset, a, None) is not None), None
        )
    try:
        labels = torch.as_tensor(labels) if labels is not None and not isinstance(labels, torch.Tensor) else labels
    except (TypeError, ValueError, RuntimeError):
        return None
    if labels is None or labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        return None
    labels = labels.reshape(len(labels), -1) if labels.dim() else labels
    if labels.dim() != 2 or labels.shape[1] != 1 or len(labels) != len(dataset):
        return None
    return labels[:, 0].detach().cpu()


def _fixed_order(loader: Any) -> Optional[list[int]]:
    """The sample indices of one pass, when the loader reads the dataset in a fixed order; else None."""
    from torch.utils.data import BatchSampler, IterableDataset, SequentialSampler
    from torch.utils.data.distributed import DistributedSampler

    if isinstance(loader.dataset, IterableDataset) or type(loader.batch_sampler) is not BatchSampler:
        return None
    sampler = loader.sampler
    if isinstance(sampler, SequentialSampler) or (isinstance(sampler, DistributedSampler) and not sampler.shuffle):
        indices = []
        for i in sampler:
            indices.append(int(i))
            if len(indices) >= _MAX_LABELS:
                break
        return indices
    return None


def _purities(labels: Any, batch_size: int) -> tuple[float, float, int]:
    """(mean share of each batch's most common label as served, the same with the labels shuffled, classes)."""
    import torch

    n = len(labels) // batch_size * batch_size
    served = labels[:n].view(-1, batch_size)
    shuffled = labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))][:n].view(-1, batch_size)

    def purity(batches: Any) -> float:
        return float((batches == batches.mode(dim=1).values[:, None]).float().mean())

    return purity(served), purity(shuffled), int(labels[:n].unique().numel())


class _Suspect:
    """A loader whose batches follow the labels, and the steps its current iterator fed in a row."""

    def __init__(self, loader: Any, served: float, shuffled: float, classes: int) -> None:
        self.loader = weakref.ref(loader)
        self.served, self.shuffled, self.classes = served, shuffled, classes
        self.iterator: Optional["weakref.ReferenceType[Any]"] = None
        self.yielded = 0
        self.in_a_row = 0


@UNSHUFFLED_TRAINING_DATA.runtime
class UnshuffledTrainingData(RuntimeCheck):
    """Loaders in a fixed, label-sorted order, reported once they feed optimizer steps."""

    def on_start(self) -> None:
        self.judged: dict[int, Optional[_Suspect]] = {}
        self.reported: set[int] = set()

    def on_loader_iter(self, event: LoaderEvent) -> None:
        key = id(event.loader)
        suspect = self.judged.get(key)
        if key not in self.judged or (suspect is not None and suspect.loader() is not event.loader):
            suspect = self.judged[key] = self._judge(event.loader)
        if suspect is not None and key not in self.reported:
            suspect.iterator = _weak(event.iterator)
            suspect.yielded, suspect.in_a_row = _yielded(event.iterator), 0

    def _judge(self, loader: Any) -> Optional[_Suspect]:
        batch_size = getattr(loader, "batch_size", None)
        if not batch_size or batch_size < 2:
            return None
        indices = _fixed_order(loader)
        labels = _labels(loader.dataset) if indices else None
        if labels is None or len(labels) <= max(indices or [0]) or len(indices or []) < 2 * batch_size:
            return None
        import torch

        served, shuffled, classes = _purities(labels[torch.as_tensor(indices)], batch_size)
        if classes < 2 or served < _MIN_PURITY or served - shuffled < 0.5 * (1 - shuffled):
            return None
        return _Suspect(loader, served, shuffled, classes)

    def on_step_pre(self, event: StepEvent) -> Iterator[Finding]:
        for key, suspect in self.judged.items():
            if suspect is None or suspect.iterator is None or key in self.reported:
                continue
            iterator = suspect.iterator()
            yielded = -1 if iterator is None else _yielded(iterator)
            if yielded > suspect.yielded >= 0:
                suspect.in_a_row += 1
            else:
                suspect.in_a_row = 0
            suspect.yielded = yielded
            loader = suspect.loader()
            if suspect.in_a_row >= _STEPS_IN_A_ROW and loader is not None:
                self.reported.add(key)
                yield Finding(
                    f"The training DataLoader (batch_size={loader.batch_size}) reads its "
                    f"{type(loader.dataset).__name__} "
                    f"in a fixed order that follows the labels: its batches are {suspect.served:.0%} one class "
                    f"(shuffled they would be {suspect.shuffled:.0%}; {suspect.classes} classes), the same every "
                    "epoch, so each stretch of steps trains on one class and the epoch ends on the last one.",
                    fix=Fix(
                        title="Shuffle the training data:",
                        code=f"loader = DataLoader(dataset, batch_size={loader.batch_size}, shuffle=True)",
                    ),
                    location=Location(key=type(loader.dataset).__name__),
                )


def _weak(iterator: Any) -> Optional["weakref.ReferenceType[Any]"]:
    try:
        return weakref.ref(iterator)
    except TypeError:
        return None


def _yielded(iterator: Any) -> int:
    """How many batches a DataLoader iterator has served (-1 when it does not say)."""
    count = getattr(iterator, "_num_yielded", None)
    return count if isinstance(count, int) else -1
