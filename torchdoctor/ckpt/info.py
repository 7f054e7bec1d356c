"""`CheckpointInfo`: what the checkpoint checks see, plus its JSON-ready summary (the report's facts)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from functools import cached_property
from itertools import compress, islice
from typing import TYPE_CHECKING, Any, Mapping, Optional

from torchdoctor.ckpt.objects import TensorMeta
from torchdoctor.ckpt.policy import Use
from torchdoctor.ckpt.tables import Path, TensorTable

if TYPE_CHECKING:
    from torchdoctor.ckpt.policy import Verdict
    from torchdoctor.ckpt.reader import Archive
    from torchdoctor.ckpt.unpickler import Event


UNREADABLE = "unreadable"  # the format of a file that could not be read as a checkpoint at all (see `problems`)


def show_path(path: Path) -> str:
    """How a nesting path is printed: components joined by '/', the root as '(root)'."""
    return "/".join(path) if path else "(root)"


@dataclass
class TensorEntry:
    """One tensor and where it sits in the checkpoint."""

    path: Path
    tensor: TensorMeta
    in_optimizer: bool = False


@dataclass
class StateDict:
    """A mapping of parameter names to tensors found in the file (or derived from a pickled module)."""

    path: Path
    tensors: Mapping[str, TensorMeta]
    source: str = "dict"  # dict, or module (rebuilt from a pickled nn.Module's _parameters/_buffers)


@dataclass
class PickledObject:
    """A whole nn.Module or optimizer object pickled into the file."""

    path: Path
    qualname: str
    kind: str  # module or optimizer


@dataclass
class GlobalUse:
    """A global the file names, how it was used, and its verdict."""

    qualname: str  # module + "." + name, for display (the verdict uses the exact pair)
    verdict: Verdict
    count: int
    called: bool
    pickles: list[str]
    module: str = ""
    name: str = ""
    use: Use = Use.NAMED
    calls: list[tuple[str, Any]] = field(default_factory=list)  # first (how, args) of the calls
    reason: str = ""  # why it is dangerous, or what reading its source found


@dataclass
class ModelKeys:
    """The `state_dict()` of the model given with `--model`: key -> (shape, dtype)."""

    spec: str
    entries: dict[str, tuple[tuple[int, ...], str]]


@dataclass
class NonFinite:
    """NaN/Inf counts of one scanned tensor."""

    path: Path
    nan: int
    inf: int
    numel: int


@dataclass
class ValueScan:
    """The result of `--scan-values`."""

    tensors: int = 0
    bytes: int = 0
    nonfinite: list[NonFinite] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


@dataclass
class CheckpointInfo:
    """Everything known about one checkpoint file, read without executing it."""

    archive: Archive
    table: TensorTable
    state_dicts: list[StateDict]
    objects: list[PickledObject]
    optimizer_states: list[Path]
    globals: list[GlobalUse]
    events: list[tuple[str, Event]]
    unsupported_opcodes: set[str]
    top_level: list[dict[str, Any]]
    walk_problems: list[str] = field(default_factory=list)
    model: Optional[ModelKeys] = None
    values: Optional[ValueScan] = None

    @property
    def path(self) -> str:
        """The checkpoint's path as the user gave it (findings name it)."""
        return self.archive.path

    @property
    def format(self) -> str:
        """The container the reader recognised: zip, torchscript, legacy, legacy-tar, pickle or safetensors."""
        return self.archive.format

    @property
    def problems(self) -> list[str]:
        """Everything that could not be read: the reader's problems, then the structure walk's."""
        return self.archive.problems + self.walk_problems

    @property
    def kind(self) -> str:
        """state_dict, training checkpoint, optimizer state, pickled module, torchscript module, tensor, or other."""
        root = self.archive.root
        if self.format == "torchscript":
            return "torchscript module"
        if any(o.path == () for o in self.objects):
            return "pickled module"
        if any(sd.path == () and sd.source == "dict" for sd in self.state_dicts):
            return "state_dict"
        if isinstance(root, TensorMeta):
            return "tensor"
        if () in self.optimizer_states:  # optimizer.state_dict() on its own (accelerate's optimizer.bin)
            return "optimizer state"
        if isinstance(root, dict) and len(self.table):
            return "training checkpoint"
        return "other"

    @cached_property
    def tensors(self) -> list[TensorEntry]:
        """Every tensor reference in walk order (a tensor saved twice appears twice)."""
        table = self.table
        return list(map(TensorEntry, table.paths, table.metas, table.in_optimizer))

    def unique_tensors(self) -> list[TensorEntry]:
        """The first reference to each distinct tensor, in walk order."""
        table = self.table
        return [TensorEntry(table.path(i), table.meta(i), table.in_optimizer[i]) for i in table.first]

    def _groups(self) -> dict[Path, list[int]]:
        """[tensors, elements, bytes] per group, in first-seen order: the innermost state dict or optimizer
        state holding each reference, else its container with module plumbing folded."""
        table = self.table
        anchors = {sd.path for sd in self.state_dicts if sd.source == "dict"} | set(self.optimizer_states)
        lengths = sorted({len(a) for a in anchors}, reverse=True)  # the longest anchor wins, one lookup per length
        groups: dict[Path, list[int]] = {}
        for start, stop, parent in table.runs:
            if lengths and lengths[0] > len(parent) and not anchors.isdisjoint(map(table.path, range(start, stop))):
                spans = [(i, i + 1, table.path(i), len(table.path(i))) for i in range(start, stop)]
            else:  # every path is parent + (key,): only the parent's prefixes can be anchors
                spans = [(start, stop, parent + ("",), len(parent))]
            for a, b, path, longest in spans:
                group = next((path[:k] for k in lengths if k <= longest and path[:k] in anchors), None)
                if group is None:
                    group = _group_of(path)
                row = groups.setdefault(group, [0, 0, 0])
                row[0] += b - a
                row[1] += sum(table.numels[a:b])
                row[2] += sum(table.nbytes[a:b])
        return groups

    def facts(self) -> dict[str, Any]:
        """The JSON-ready structure report."""
        table = self.table
        first = table.first
        numels, unique_bytes = table.unique(table.numels), table.unique(table.nbytes)
        flags = table.unique(table.in_optimizer)
        optimizer_elements = sum(compress(numels, flags)) if any(flags) else 0
        parameters = sum(numels) - optimizer_elements
        by_dtype, by_device = table.storage_totals()
        groups = self._groups()
        largest = [first[i] for i in _largest(unique_bytes, 10)]
        facts: dict[str, Any] = {
            "path": self.path,
            "format": self.format,
            "file_size": self.archive.file_size,
            "details": self.archive.details,
            "kind": self.kind,
            "top_level": self.top_level,
            "tensors": {
                "count": len(table),
                "unique": len(first),
                "parameters": parameters,
                "optimizer_state_elements": optimizer_elements,
                "stored_bytes": sum(by_dtype.values()),
                "bytes_by_dtype": dict(by_dtype.most_common()),
                "bytes_by_device": dict(by_device.most_common()),
                "groups": [
                    {"path": show_path(p), "tensors": count, "elements": elements, "bytes": size}
                    for p, (count, elements, size) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:30]
                ],
                "largest": [
                    {
                        "key": show_path(table.path(i)),
                        "shape": list(t.shape),
                        "dtype": t.dtype,
                        "device": t.device,
                        "bytes": table.nbytes[i],
                    }
                    for i, t in zip(largest, map(table.meta, largest))
                ],
            },
            "state_dicts": [
                {"path": show_path(sd.path), "tensors": len(sd.tensors), "source": sd.source} for sd in self.state_dicts
            ],
            "optimizer_states": [show_path(p) for p in self.optimizer_states],
            "pickled_objects": [{"path": show_path(o.path), "class": o.qualname, "kind": o.kind} for o in self.objects],
            "globals": [
                {"name": g.qualname, "verdict": str(g.verdict), "count": g.count, "called": g.called, "use": str(g.use)}
                for g in self.globals
            ],
            "problems": self.problems,
        }
        if self.values is not None:
            facts["values"] = {
                "tensors_scanned": self.values.tensors,
                "bytes_scanned": self.values.bytes,
                "nonfinite": [
                    {"key": show_path(n.path), "nan": n.nan, "inf": n.inf, "numel": n.numel}
                    for n in self.values.nonfinite[:50]
                ],
                "skipped": self.values.skipped[:20],
            }
        if self.model is not None:
            facts["model"] = {"spec": self.model.spec, "keys": len(self.model.entries)}
        return facts


def _largest(values: list[int], n: int) -> list[int]:
    """Indices of the `n` largest values, ties in index order: `heapq.nlargest(n, range(len(values)),
    key=values.__getitem__)` without a Python-level key call per value."""
    if len(values) <= n:
        return sorted(range(len(values)), key=values.__getitem__, reverse=True)
    threshold = heapq.nlargest(n, values)[-1]
    above = sorted(compress(range(len(values)), map(threshold.__lt__, values)), key=values.__getitem__, reverse=True)
    return above + list(islice(compress(range(len(values)), map(threshold.__eq__, values)), n - len(above)))


def _group_of(path: Path) -> Path:
    """Group tensors outside state dicts by their container, folding module attribute plumbing."""
    parent = path[:-1]
    while parent and parent[-1] in ("_parameters", "_buffers"):
        parent = parent[:-1]
    cut = [i for i, part in enumerate(parent) if part == "_modules"]
    return parent[: cut[0]] if cut else parent
