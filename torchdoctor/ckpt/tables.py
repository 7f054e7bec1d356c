"""The tensors of a checkpoint as columns, so files with 10^5 tensors are summed by C-level maps.

`TensorTable` holds what the structure walk found (one `TensorMeta` per reference). A well-formed
safetensors header needs no walk and no per-tensor objects at all: `HeaderTensors` is the archive root
(a read-only mapping that builds a `TensorMeta` only for a key that is looked up) and `HeaderTable`
answers the same column questions straight from the header's lists.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from functools import cached_property
from itertools import compress
from operator import attrgetter, floordiv, mul, sub
from typing import Any, Iterator, Mapping, Optional, Sequence

from torchdoctor.ckpt.dtypes import itemsizes
from torchdoctor.ckpt.objects import StorageRef, TensorMeta, contiguous_strides

Path = tuple[str, ...]


class TensorTable:
    """Every tensor reference in walk order: its path, placeholder and whether it sits in optimizer state.

    `runs` holds (start, stop, parent path) for each stretch of references that sit side by side in one
    container (each path is the parent plus one key).
    """

    def __init__(self) -> None:
        self.paths: list[Path] = []
        self.metas: list[TensorMeta] = []
        self.in_optimizer: list[bool] = []
        self.runs: list[tuple[int, int, Path]] = []

    def __len__(self) -> int:
        return len(self.metas)

    def add(self, paths: list[Path], metas: list[TensorMeta], in_optimizer: bool, parent: Path) -> None:
        """Append the tensors of one container."""
        start = len(self.metas)
        self.paths += paths
        self.metas += metas
        self.in_optimizer += [in_optimizer] * len(paths)
        self.runs.append((start, len(self.metas), parent))

    def path(self, i: int) -> Path:
        """The key path of reference `i` (from the root object)."""
        return self.paths[i]

    def meta(self, i: int) -> TensorMeta:
        """The `TensorMeta` of reference `i`."""
        return self.metas[i]

    @cached_property
    def first(self) -> Sequence[int]:
        """Index of the first reference to each distinct tensor object, in walk order."""
        ids = list(map(id, self.metas))
        if len(set(ids)) == len(ids):
            return range(len(ids))
        seen: dict[int, int] = {}
        for i, key in enumerate(ids):
            seen.setdefault(key, i)
        return sorted(seen.values())

    def unique(self, column: list[Any]) -> list[Any]:
        """`column` (one value per reference) restricted to the first reference of each tensor."""
        first = self.first
        return column if len(first) == len(column) else [column[i] for i in first]

    @cached_property
    def storages(self) -> list[Optional[StorageRef]]:
        """The storage of each reference (None for tensors without one, such as meta tensors)."""
        return list(map(attrgetter("storage"), self.metas))

    @cached_property
    def numels(self) -> list[int]:
        """Elements of each reference."""
        return list(map(math.prod, map(attrgetter("shape"), self.metas)))

    @cached_property
    def nbytes(self) -> list[int]:
        """Bytes of each reference (elements times item size)."""
        return list(map(mul, self.numels, itemsizes(map(attrgetter("dtype"), self.metas))))

    @cached_property
    def locations(self) -> list[str]:
        """The device each reference was saved on ("meta" for tensors without storage)."""
        return [s.location if s is not None else "meta" for s in self.storages]

    def device_counts(self) -> Counter[str]:
        """How many distinct tensors were saved on each device."""
        return Counter(self.unique(self.locations))

    def storage_totals(self) -> tuple[Counter[str], Counter[str]]:
        """Bytes of the distinct storages by dtype (of the first tensor viewing each) and by device."""
        metas, storages = self.unique(self.metas), self.unique(self.storages)
        first = dict(zip(reversed(storages), reversed(metas)))  # storage -> the first tensor viewing it
        distinct = [s for s in dict.fromkeys(storages) if s is not None]  # one object per key (readers cache them)
        sizes = list(map(mul, map(attrgetter("numel"), distinct), map(attrgetter("itemsize"), distinct)))
        return (
            _sums(sizes, [first[s].dtype for s in distinct]),
            _sums(sizes, list(map(attrgetter("location"), distinct))),
        )

    def storage_users(self, min_bytes: int) -> dict[str, list[int]]:
        """The references viewing each storage of at least `min_bytes` bytes, by storage key, in walk order."""
        users: dict[str, list[int]] = defaultdict(list)
        for i, s in enumerate(self.storages):
            if s is not None and s.numel * s.itemsize >= min_bytes:
                users[s.key].append(i)
        return users

    def storage_nbytes(self, i: int) -> int:
        """Bytes of the storage reference `i` views (0 when it has none)."""
        storage = self.storages[i]
        return storage.nbytes if storage is not None else 0


def _sums(sizes: list[int], labels: list[str]) -> Counter[str]:
    """Sum of `sizes` per label, labels in first-seen order (one C-level pass per distinct label)."""
    distinct = list(dict.fromkeys(labels))
    if len(distinct) == 1:
        return Counter({distinct[0]: sum(sizes)})
    return Counter({label: sum(compress(sizes, map(label.__eq__, labels))) for label in distinct})


class HeaderTensors(Mapping[str, TensorMeta]):
    """A well-formed safetensors header as the checkpoint's root state dict, kept as the header's columns.

    Looking a key up builds its `TensorMeta`; iterating keys, counting and the column sums never do.
    """

    def __init__(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        begins: list[int],
        ends: list[int],
        base: int,
    ) -> None:
        self.names, self.dtypes, self.shapes = names, dtypes, shapes
        self.begins, self.ends, self.base = begins, ends, base
        self.sizes = itemsizes(dtypes)

    @cached_property
    def index(self) -> dict[str, int]:
        """Position of each tensor name in the header's columns (built on the first lookup)."""
        return dict(zip(self.names, range(len(self.names))))

    def __len__(self) -> int:
        return len(self.names)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __getitem__(self, name: str) -> TensorMeta:
        return self.meta(self.index[name])

    def meta(self, i: int) -> TensorMeta:
        """The `TensorMeta` of entry `i`: contiguous, viewing a CPU storage of its own byte span
        (whole elements only).
        """
        shape, size = tuple(self.shapes[i]), self.sizes[i]
        storage = StorageRef(self.names[i], self.dtypes[i], size, "cpu", (self.ends[i] - self.begins[i]) // size)
        return TensorMeta(self.dtypes[i], shape, contiguous_strides(shape), storage)

    def span(self, name: str) -> Optional[tuple[int, int]]:
        """(file offset, length) of a tensor's bytes."""
        i = self.index.get(name)
        return None if i is None else (self.base + self.begins[i], self.ends[i] - self.begins[i])


class HeaderTable(TensorTable):
    """The `TensorTable` of a `HeaderTensors` root: one reference per entry, each its own storage on the CPU."""

    def __init__(self, header: HeaderTensors) -> None:  # no super().__init__(): paths and metas are built on demand
        self.header = header
        n = len(header)
        self.in_optimizer = [False] * n
        self.runs = [(0, n, ())] if n else []

    def __len__(self) -> int:
        return len(self.header)

    def path(self, i: int) -> Path:
        """The key path of entry `i`: its name alone (a safetensors header is flat)."""
        return (self.header.names[i],)

    def meta(self, i: int) -> TensorMeta:
        """The `TensorMeta` of entry `i`, built on demand."""
        return self.header.meta(i)

    @cached_property
    def first(self) -> Sequence[int]:
        """Every entry: each is a distinct tensor."""
        return range(len(self.header))

    @cached_property
    def numels(self) -> list[int]:
        """Elements of each entry, from the header's shapes."""
        return list(map(math.prod, self.header.shapes))

    @cached_property
    def nbytes(self) -> list[int]:
        """Bytes of each entry (elements times item size), from the header's columns."""
        return list(map(mul, self.numels, self.header.sizes))

    @cached_property
    def locations(self) -> list[str]:
        """The device of every entry: "cpu" (safetensors stores none)."""
        return ["cpu"] * len(self.header)

    def device_counts(self) -> Counter[str]:
        """All entries on the CPU (an empty count for an empty header)."""
        return Counter({"cpu": len(self.header)} if len(self.header) else {})

    @cached_property
    def _storage_bytes(self) -> list[int]:
        """Each entry's storage size as `StorageRef.nbytes` counts it (whole elements of its dtype)."""
        h = self.header
        spans = list(map(sub, h.ends, h.begins))
        if spans == self.nbytes:  # the usual file: every span holds exactly its tensor
            return spans
        return list(map(mul, map(floordiv, spans, h.sizes), h.sizes))

    def storage_totals(self) -> tuple[Counter[str], Counter[str]]:
        """Bytes of the entries' storages by dtype and by device (all "cpu")."""
        sizes = self._storage_bytes
        return _sums(sizes, self.header.dtypes), _sums(sizes, ["cpu"] * len(sizes))

    def storage_users(self, min_bytes: int) -> dict[str, list[int]]:
        """Each entry whose storage holds at least `min_bytes`, as its only user, by name."""
        big = compress(range(len(self.header)), map(min_bytes.__le__, self._storage_bytes))
        return {self.header.names[i]: [i] for i in big}

    def storage_nbytes(self, i: int) -> int:
        """Bytes of entry `i`'s storage (whole elements of its dtype in its span)."""
        return self._storage_bytes[i]

    @cached_property
    def paths(self) -> list[Path]:  # type: ignore[override]
        """The key path of every entry (built only when a caller needs the whole column)."""
        return [(name,) for name in self.header.names]

    @cached_property
    def metas(self) -> list[TensorMeta]:  # type: ignore[override]
        """The `TensorMeta` of every entry (built only when a caller needs the whole column)."""
        return list(map(self.header.meta, range(len(self.header))))


__all__ = ["HeaderTable", "HeaderTensors", "TensorTable"]
