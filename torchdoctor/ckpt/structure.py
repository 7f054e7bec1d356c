"""Walk the inert object tree of a checkpoint: tensors with their paths, state dicts, pickled modules, globals.

The walk is iterative, enters each container once (a memo-sharing pickle bomb describes a graph
that would expand exponentially as a tree) and is bounded in depth and visits, so hostile files end
with a recorded problem, never a hang or a recursion error.
"""

from __future__ import annotations

import math
from collections import defaultdict
from itertools import islice
from typing import Any, Iterator

from torchdoctor.ckpt.info import CheckpointInfo, GlobalUse, Path, PickledObject, StateDict
from torchdoctor.ckpt.objects import Blob, GlobalRef, Instance, Key, PickledDict, TensorMeta
from torchdoctor.ckpt.policy import Pair, Use, Verdict, classify
from torchdoctor.ckpt.reader import Archive
from torchdoctor.ckpt.tables import HeaderTable, HeaderTensors, TensorTable
from torchdoctor.ckpt.unpickler import WEIGHTS_ONLY_OPCODES, short

MAX_VISITS = 5_000_000
MAX_DEPTH = 400
_LEAF_TYPES = (int, float, bool, str, type(None), bytes, bytearray, GlobalRef, Blob)


def analyze(archive: Archive) -> CheckpointInfo:
    """Build the `CheckpointInfo` the checks look at from a freshly read archive."""
    walker = _Walker()
    if isinstance(archive.root, HeaderTensors):  # a safetensors header: one flat state dict, nothing to walk
        walker.table = HeaderTable(archive.root)
        walker.state_dicts = [StateDict((), archive.root, "dict")] if len(archive.root) else []
    else:
        walker.walk(archive.root)
    if archive.format == "torchscript":
        for name, scan in archive.pickles[1:]:
            if name.endswith("constants.pkl"):
                walker.walk(scan.value, ("constants",))
    return CheckpointInfo(
        archive=archive,
        table=walker.table,
        state_dicts=walker.state_dicts,
        objects=walker.objects,
        optimizer_states=walker.optimizer_states,
        globals=_globals(archive),
        events=archive.events + [(name, ev) for name, scan in archive.pickles for ev in scan.events],
        unsupported_opcodes=_unsupported_opcodes(archive),
        top_level=_top_level(archive.root),
        walk_problems=walker.problems,
    )


def _globals(archive: Archive) -> list[GlobalUse]:
    counts: dict[Pair, int] = defaultdict(int)
    uses: dict[Pair, Use] = {}
    calls: dict[Pair, list[tuple[str, Any]]] = defaultdict(list)
    where: dict[Pair, list[str]] = defaultdict(list)
    rank = {Use.NAMED: 0, Use.NEW: 1, Use.CALLED: 2}
    for name, scan in archive.pickles:
        for pair, count in scan.globals.items():
            counts[pair] += count
            where[pair].append(name)
            use = scan.uses.get(pair, Use.NAMED)
            if rank[use] >= rank[uses.get(pair, Use.NAMED)]:
                uses[pair] = use
        for pair, first in scan.calls.items():
            calls[pair].extend(first[: 3 - len(calls[pair])])
    out = []
    for m, n in sorted(counts):
        use, first = uses[(m, n)], calls.get((m, n), [])
        found, reason = classify(m, n, use), ""
        if found is not Verdict.ALLOWED and found is not Verdict.BENIGN:  # only then is any source read
            from torchdoctor.ckpt.reach import verdict

            found, reason = verdict(m, n, use, first)
        out.append(
            GlobalUse(
                f"{m}.{n}",
                found,
                counts[(m, n)],
                use is Use.CALLED,
                where[(m, n)],
                module=m,
                name=n,
                use=use,
                calls=first,
                reason=reason,
            )
        )
    return out


def _unsupported_opcodes(archive: Archive) -> set[str]:
    """Opcodes of the pickles `torch.load(weights_only=True)` interprets that its unpickler rejects."""
    if archive.format not in ("zip", "legacy"):
        return set()
    names = {"data.pkl", "object"}
    out: set[str] = set()
    for name, scan in archive.pickles:
        if name in names:
            out |= scan.opcodes - WEIGHTS_ONLY_OPCODES
    return out


def _describe(value: Any) -> dict[str, Any]:
    if isinstance(value, TensorMeta):
        return {"type": "tensor", "shape": list(value.shape), "dtype": value.dtype}
    if isinstance(value, bool) or value is None:
        return {"type": type(value).__name__, "value": value}
    if isinstance(value, int):
        return {"type": "int", "value": value if abs(value) < 1 << 63 else str(value)}
    if isinstance(value, float):  # NaN/Inf are not JSON
        return {"type": "float", "value": value if math.isfinite(value) else str(value)}
    if isinstance(value, str):
        return {"type": "str", "value": value if len(value) <= 80 else value[:77] + "..."}
    if isinstance(value, dict):
        tensors = sum(1 for v in value.values() if isinstance(v, TensorMeta))
        out: dict[str, Any] = {"type": getattr(value, "qualname", "dict"), "len": len(value)}
        if tensors:
            out["tensors"] = tensors
        return out
    if isinstance(value, (list, tuple, set, frozenset)):
        return {"type": type(value).__name__, "len": len(value)}
    if isinstance(value, Instance):
        return {"type": value.qualname}
    if isinstance(value, Blob):
        return {"type": value.kind, "len": value.size}
    return {"type": type(value).__name__}


def _top_level(root: Any) -> list[dict[str, Any]]:
    if isinstance(root, HeaderTensors):
        return [{"key": k, **_describe(v)} for k, v in zip(root.names, map(root.meta, range(min(60, len(root)))))]
    if not isinstance(root, dict):
        return [{"key": "(root)", **_describe(root)}]
    return [{"key": key_name(k), **_describe(v)} for k, v in islice(root.items(), 60)]


def key_name(key: Any) -> str:
    """How a dict key is named in paths and reports (a container key by its value)."""
    if isinstance(key, Key):
        key = key.value
    return key if isinstance(key, str) else short(key)


def _is_module_state(state: dict) -> bool:
    return "_parameters" in state and "_modules" in state


def _is_optimizer_state_dict(value: Any) -> bool:
    return isinstance(value, dict) and "state" in value and "param_groups" in value


class _Walker:
    def __init__(self) -> None:
        self.table = TensorTable()
        self.state_dicts: list[StateDict] = []
        self.objects: list[PickledObject] = []
        self.optimizer_states: list[Path] = []
        self.problems: list[str] = []
        self.visits = 0
        self.entered: dict[int, Any] = {}  # id -> object (kept alive so ids stay unique)

    def walk(self, root: Any, base: Path = ()) -> None:
        """Depth-first over the object graph; each container is entered once (shared ones are not re-walked)."""
        stack: list[tuple[Any, Path, bool, bool]] = [(root, base, False, False)]
        entered = self.entered
        while stack:
            obj, path, in_opt, in_module = stack.pop()
            self.visits += 1
            if self.visits > MAX_VISITS:
                self.problems.append(
                    f"the object graph has more than {MAX_VISITS:,} nodes; the structure report is incomplete"
                )
                return
            if type(obj) is TensorMeta:
                self.table.add([path], [obj], in_opt, path[:-1])
                continue
            if id(obj) in entered:
                continue
            entered[id(obj)] = obj
            if len(path) > MAX_DEPTH:
                self.problems.append(
                    f"objects nested more than {MAX_DEPTH} levels deep at "
                    f"{'/'.join(path[:5])}/...; the structure report is incomplete"
                )
                return
            if isinstance(obj, dict):
                all_tensors = (
                    set(map(type, obj.values())) == {TensorMeta}
                    and getattr(obj, "state", None) is None
                    and self.visits + len(obj) <= MAX_VISITS
                )
                if _is_optimizer_state_dict(obj):
                    in_opt = True
                    self.optimizer_states.append(path)
                elif not in_opt and not in_module:
                    self.maybe_state_dict(obj, path, all_tensors)
                if all_tensors:  # a state dict: its tensors are the next nodes visited, in order, so add them now
                    self.visits += len(obj)
                    self.table.add(
                        [path + (k if type(k) is str else key_name(k),) for k in obj], list(obj.values()), in_opt, path
                    )
                    continue
            elif isinstance(obj, Instance):
                in_opt, in_module = self.note_object(obj, path, in_opt, in_module)
            if type(obj) is dict:  # the common case, without the generator
                children = [
                    (k if type(k) is str else key_name(k), v) for k, v in obj.items() if not isinstance(v, _LEAF_TYPES)
                ]
            else:
                children = [(k, v) for k, v in self.children(obj) if not isinstance(v, _LEAF_TYPES)]
            for key, child in reversed(children):
                stack.append((child, path + (key,), in_opt, in_module))

    def children(self, obj: Any) -> Iterator[tuple[str, Any]]:
        """(name, value) of each child the walk descends into, never calling anything of the file's.

        Dict items (and a `PickledDict`'s BUILD state), list/tuple/set members by index, an `Instance`'s
        state, constructor `__args__`, appended and set items, and the value a `Key` wraps.
        """
        if isinstance(obj, dict):
            for k, v in obj.items():
                yield key_name(k), v
            if isinstance(obj, PickledDict) and obj.state is not None:
                yield "__state__", obj.state
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                yield str(i), v
        elif isinstance(obj, (set, frozenset)):
            for i, v in enumerate(obj):
                yield str(i), v.value if isinstance(v, Key) else v
        elif isinstance(obj, Instance):
            state = obj.state_dict_attr()
            if state:
                for k, v in state.items():
                    yield key_name(k), v
            elif obj.state is not None:
                yield "__state__", obj.state
            if obj.args not in ((), None):
                yield "__args__", obj.args
            for i, v in enumerate(obj.items):
                yield str(i), v
            for k, v in obj.setitems:
                yield key_name(k), v
        elif isinstance(obj, Key):
            yield "__key__", obj.value

    def maybe_state_dict(self, obj: dict, path: Path, all_tensors: bool) -> None:
        """Record `obj` as a state dict when all its keys are str and at least half its values are
        tensors (keeping only the tensor entries).
        """
        if not obj or set(map(type, obj)) != {str}:
            return
        tensors = dict(obj) if all_tensors else {k: v for k, v in obj.items() if isinstance(v, TensorMeta)}
        if tensors and len(tensors) * 2 >= len(obj):
            self.state_dicts.append(StateDict(path, tensors, "dict"))

    def note_object(self, obj: Instance, path: Path, in_opt: bool, in_module: bool) -> tuple[bool, bool]:
        """Record a pickled `nn.Module` (its state dict rebuilt from `_parameters`/`_buffers`/`_modules`,
        outermost module only) or a `torch.optim` optimizer, and return the (in optimizer, in module)
        flags its children are walked with.
        """
        state = obj.state_dict_attr()
        qualname = obj.qualname
        if _is_module_state(state):
            if not in_module:
                self.objects.append(PickledObject(path, qualname, "module"))
                self.state_dicts.append(StateDict(path, _module_state_dict(obj), "module"))
            return in_opt, True
        if qualname.startswith("torch.optim.") and "param_groups" in state:
            self.objects.append(PickledObject(path, qualname, "optimizer"))
            return True, in_module
        return in_opt, in_module


def _module_state_dict(module: Instance) -> dict[str, TensorMeta]:
    """The keys `module.state_dict()` would produce, from the pickled `_parameters`/`_buffers`/`_modules`."""
    out: dict[str, TensorMeta] = {}
    todo: list[tuple[str, Instance, int]] = [("", module, 0)]
    seen = 0
    while todo and seen < 200_000:
        prefix, mod, depth = todo.pop()
        seen += 1
        state = mod.state_dict_attr()
        skip = state.get("_non_persistent_buffers_set")
        skip_names = {key_name(x) for x in skip} if isinstance(skip, (set, frozenset)) else set()
        if isinstance(skip, Instance):
            skip_names = {key_name(x) for x in skip.args[0]} if skip.args and isinstance(skip.args[0], list) else set()
        for attr in ("_parameters", "_buffers"):
            table = state.get(attr)
            if isinstance(table, dict):
                for name, t in table.items():
                    if isinstance(t, TensorMeta) and not (attr == "_buffers" and key_name(name) in skip_names):
                        out[prefix + key_name(name)] = t
        children = state.get("_modules")
        if isinstance(children, dict) and depth < MAX_DEPTH:
            for name, child in reversed(list(children.items())):
                if isinstance(child, Instance):
                    todo.append((f"{prefix}{key_name(name)}.", child, depth + 1))
    return out
