"""`--fix OUT`: write a weights-only, CPU, prefix-free copy rebuilt from the file's raw bytes (imports torch).

The input pickle is never executed: tensors are rebuilt from the storage bytes and the metadata the
safe reader found, so even a checkpoint that needs code to load yields a clean weights-only copy.
Files with unsafe-pickle findings or unreadable parts are refused.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import IO, Any, Callable, Optional

from torchdoctor.ckpt.info import CheckpointInfo, StateDict, show_path
from torchdoctor.ckpt.keys import LOOSE_PREFIXES, best_match, strip, wrapper_prefix
from torchdoctor.ckpt.objects import Key, TensorMeta
from torchdoctor.ckpt.reader import open_located
from torchdoctor.ckpt.structure import key_name
from torchdoctor.ckpt.tables import Path

_PREFERRED = (
    "state_dict",
    "model_state_dict",
    "model",
    "module",
    "net",
    "network",
    "weights",
    "params",
    "model_ema",
    "ema",
)


class FixError(ValueError):
    """`--fix` cannot write a trustworthy copy (one-line message)."""


def _choose(info: CheckpointInfo, model_keys: Any) -> tuple[StateDict, Any]:
    candidates = [sd for sd in info.state_dicts if sd.tensors]
    if not candidates:
        raise FixError(f"{info.path}: no state dict found to extract")
    if model_keys is not None:
        match = best_match(candidates, model_keys)
        assert match is not None
        return match.state_dict, match.remap
    if len(candidates) == 1:
        chosen = candidates[0]
    else:

        def rank(sd: StateDict) -> tuple:
            name = sd.path[-1] if sd.path else ""
            pref = _PREFERRED.index(name) if name in _PREFERRED and len(sd.path) == 1 else len(_PREFERRED)
            return (len(sd.path) != 0, pref, -len(sd.tensors))

        chosen = min(candidates, key=rank)
    prefix = wrapper_prefix(chosen.tensors)
    top = {t["key"] for t in info.top_level}
    if prefix.split(".", 1)[0] + "." in LOOSE_PREFIXES and not (
        chosen.path == ("state_dict",) and top & {"pytorch-lightning_version", "global_step", "epoch"}
    ):
        prefix = ""
    return chosen, (lambda k: strip(k, prefix))


def _is_lightning(info: CheckpointInfo, sd: StateDict) -> bool:
    top = {t["key"] for t in info.top_level}
    return "pytorch-lightning_version" in top or (sd.path == ("state_dict",) and "global_step" in top)


class _Rebuilder:
    """Tensors rebuilt from the file's storage bytes (never from its pickle), sharing storages as saved."""

    def __init__(self, info: CheckpointInfo, f: IO[bytes]) -> None:
        self.info, self.f = info, f
        self.bases: dict[str, Any] = {}
        self.moved = self.cloned = 0

    def tensor(self, key: str, t: TensorMeta) -> Any:
        """The tensor `t` (saved under `key`) as a view of its storage's bytes read from the file, cloned when it
        covers only part of that storage (so the copy carries no bloat); refuses what it cannot rebuild exactly."""
        import torch

        path = self.info.path
        if t.storage is None:
            return torch.empty(t.shape, dtype=getattr(torch, t.dtype), device="meta")
        if t.kind == "quantized" or not hasattr(torch, t.dtype):
            raise FixError(f"refusing to --fix {path}: {key} has dtype {t.dtype}, which --fix cannot rebuild")
        base = self.bases.get(t.storage.key)
        if base is None:
            loc = self.info.archive.locator(t.storage.key)
            if loc is None:
                raise FixError(f"refusing to --fix {path}: the bytes of {key} are not in the file")
            data = bytearray(open_located(self.f, loc).read(t.storage.nbytes))
            if len(data) < t.storage.nbytes:
                raise FixError(f"refusing to --fix {path}: storage of {key} is truncated")
            base = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
            self.bases[t.storage.key] = base
        try:
            typed = base.view(getattr(torch, t.dtype))
            tensor = torch.as_strided(typed, t.shape, t.stride, t.storage_offset)
        except RuntimeError as exc:
            raise FixError(f"refusing to --fix {path}: {key} does not fit its storage ({exc})") from None
        start, end = t.byte_span()
        if end - start < t.storage.nbytes:
            tensor = tensor.clone()
            self.cloned += 1
        if t.device != "cpu":
            self.moved += 1
        return tensor


class _Copy:
    """The whole checkpoint rebuilt from its inert tree: what `torch.load(weights_only=True)` can load is kept
    (containers, numbers, strings, tensors), the chosen state dict gets its keys renamed, and any other object
    is left out (rebuilding it would mean running its code) and listed in `dropped`."""

    def __init__(self, tensors: _Rebuilder, sd: StateDict, remap: Callable[[str], str]) -> None:
        self.tensors, self.sd, self.remap = tensors, sd, remap
        self.dropped: list[str] = []
        self.memo: dict[int, Any] = {}

    def build(self, obj: Any, path: Path) -> Any:
        """The loadable copy of `obj` found at `path` in the inert tree (shared objects built once), or `_DROP`
        for an object that only its own code could rebuild."""
        if isinstance(obj, (bool, int, float, str, bytes, type(None))):
            return obj
        done = self.memo.get(id(obj))
        if done is not None:
            return done
        out: Any
        if isinstance(obj, TensorMeta):
            out = self.tensors.tensor(show_path(path), obj)
        elif isinstance(obj, dict) and _attributes(obj).keys() <= {"_metadata"}:
            out = OrderedDict() if getattr(obj, "qualname", "") == "collections.OrderedDict" else {}
            renaming = path == self.sd.path
            for key, value in obj.items():
                name = key if type(key) is str else key_name(key)
                new = self.build(value, path + (name,))
                if new is not _DROP:
                    out[self.remap(key) if renaming and type(key) is str else self.key(key)] = new
            metadata = _attributes(obj).get("_metadata")
            if isinstance(out, OrderedDict) and isinstance(metadata, dict):  # module versions, as state_dict() saves
                built = self.build(metadata, path + ("_metadata",))
                if isinstance(built, dict):
                    names = {self.module_name(k) if renaming else k: v for k, v in built.items()}
                    out._metadata = names  # type: ignore[attr-defined]
        elif isinstance(obj, (list, tuple)):
            items = [self.build(v, path + (str(i),)) for i, v in enumerate(obj)]
            out = type(obj)(None if v is _DROP else v for v in items)
        else:
            self.dropped.append(f"{show_path(path)} ({getattr(obj, 'qualname', type(obj).__name__)})")
            out = _DROP
        self.memo[id(obj)] = out
        return out

    def module_name(self, name: Any) -> Any:
        """A module's name in `_metadata` after the renaming of its parameters' keys ("module.0" -> "0")."""
        if type(name) is not str:
            return name
        new = self.remap(name + ".x")
        return new[:-2] if new.endswith(".x") else ""

    def key(self, key: Any) -> Any:
        """A dict key outside the renamed state dict as plain data (a pickled list key becomes a tuple)."""
        value = key.value if isinstance(key, Key) else key
        return tuple(value) if isinstance(value, list) else value


_DROP = object()  # what `_Copy.build` returns for an object it leaves out


def _attributes(obj: dict) -> dict:
    """The attributes a pickled dict subclass sets on itself (an OrderedDict state dict: `_metadata`)."""
    state = getattr(obj, "state", None)
    if isinstance(state, tuple) and len(state) == 2:
        state = {k: v for part in state if isinstance(part, dict) for k, v in part.items()}
    return state if isinstance(state, dict) else {}


def write_fixed(info: CheckpointInfo, out: str, model: Optional[Any] = None) -> list[str]:
    """Write the fixed copy to `out`, verify it loads with weights_only=True (and strict=True into `model`).

    A training checkpoint (a dict holding the state dict beside epoch, optimizer state, ...) keeps all that
    torch.load(weights_only=True) can load, with only the state dict's keys renamed; from anything else (a
    Lightning checkpoint, a pickled module, a list) the state dict is extracted. Returns what was done, one
    line each.
    """
    import torch

    from torchdoctor.ckpt.model import model_keys

    if info.events or any(str(g.verdict) == "dangerous" for g in info.globals):
        names = ", ".join(g.qualname for g in info.globals if str(g.verdict) == "dangerous") or "pickle tricks"
        raise FixError(f"refusing to --fix {info.path}: it has unsafe-pickle findings ({names})")
    if info.problems:
        raise FixError(f"refusing to --fix {info.path}: part of it is unreadable ({info.problems[0]})")
    if str(info.archive.details.get("byteorder", "little")).startswith("big"):
        raise FixError(f"refusing to --fix {info.path}: big-endian files are not supported")
    keys = model_keys(model) if model is not None else None
    sd, remap = _choose(info, keys)
    whole = (
        type(info.archive.root) is dict
        and sd.path
        and sd.source == "dict"
        and info.kind == "training checkpoint"
        and not _is_lightning(info, sd)
    )
    renamed = [k for k in sd.tensors if remap(k) != k]
    with open(info.path, "rb") as f:
        tensors = _Rebuilder(info, f)
        if whole:
            copy = _Copy(tensors, sd, remap)
            saved: Any = copy.build(info.archive.root, ())
            actions = [
                f"kept the training checkpoint as saved ({', '.join(t['key'] for t in info.top_level[:8])}"
                f"{', ...' if len(info.top_level) > 8 else ''}), its state dict at {show_path(sd.path)}"
            ]
        else:
            saved = {remap(key): tensors.tensor(key, t) for key, t in sd.tensors.items()}
            actions = [f"extracted the state dict at {show_path(sd.path)} ({len(sd.tensors)} tensors)"]
    if renamed:
        actions.append(
            f"renamed {len(renamed)} keys of {show_path(sd.path)} (e.g. {renamed[0]!r} -> {remap(renamed[0])!r})"
        )
    if tensors.moved:
        actions.append(f"moved {tensors.moved} tensors saved on accelerators to the CPU")
    if tensors.cloned:
        actions.append(f"cloned {tensors.cloned} views so they no longer carry their whole storage")
    if whole and copy.dropped:
        actions.append(
            f"left out {len(copy.dropped)} objects that torch.load(weights_only=True) refuses "
            f"(rebuilding them would run their code): {', '.join(copy.dropped[:6])}"
            f"{', ...' if len(copy.dropped) > 6 else ''}"
        )
    tmp = out + ".tmp"
    try:
        torch.save(saved, tmp)
    except (OSError, RuntimeError) as exc:  # a missing folder, no permission, a full disk
        if os.path.exists(tmp):
            os.remove(tmp)
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0].strip("'\"")
        raise FixError(f"cannot write {out}: {why}") from None
    try:
        loaded = torch.load(tmp, weights_only=True)
        if model is not None:
            state = loaded
            for part in sd.path if whole else ():
                state = state[part]
            model.load_state_dict(state, strict=True)
            actions.append("verified: torch.load(weights_only=True) and load_state_dict(strict=True) succeed")
        else:
            actions.append("verified: torch.load(weights_only=True) succeeds")
    except Exception as exc:
        os.remove(tmp)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FixError(f"the fixed copy does not load cleanly, nothing written: {first[:300]}") from None
    os.replace(tmp, out)
    actions.append(f"wrote {out}")
    return actions
