"""`--fix OUT`: write a plain, CPU, prefix-free state_dict rebuilt from the file's raw bytes (imports torch).

The input pickle is never executed: tensors are rebuilt from the storage bytes and the metadata the
safe reader found, so even a checkpoint that needs code to load yields a clean weights-only copy.
Files with unsafe-pickle findings or unreadable parts are refused.
"""
from __future__ import annotations

import os
from typing import Any, Optional

from torchdoctor.ckpt.info import CheckpointInfo, StateDict, show_path
from torchdoctor.ckpt.keys import LOOSE_PREFIXES, best_match, strip, wrapper_prefix
from torchdoctor.ckpt.reader import open_located

_PREFERRED = ("state_dict", "model_state_dict", "model", "module", "net", "network", "weights", "params",
              "model_ema", "ema")


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
            chosen.path == ("state_dict",) and top & {"pytorch-lightning_version", "global_step", "epoch"}):
        prefix = ""
    return chosen, (lambda k: strip(k, prefix))


def write_fixed(info: CheckpointInfo, out: str, model: Optional[Any] = None) -> list[str]:
    """Write the fixed copy to `out`, verify it loads with weights_only=True (and strict=True into `model`).

    Returns what was done, one line each.
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
    actions = [f"extracted the state dict at {show_path(sd.path)} ({len(sd.tensors)} tensors)"]
    bases: dict[str, Any] = {}
    out_sd: dict[str, Any] = {}
    moved = cloned = 0
    renamed = 0
    with open(info.path, "rb") as f:
        for key, t in sd.tensors.items():
            new_key = remap(key)
            renamed += new_key != key
            if t.storage is None:
                out_sd[new_key] = torch.empty(t.shape, dtype=getattr(torch, t.dtype), device="meta")
                continue
            if t.kind == "quantized" or not hasattr(torch, t.dtype):
                raise FixError(f"refusing to --fix {info.path}: {key} has dtype {t.dtype}, which --fix cannot rebuild")
            base = bases.get(t.storage.key)
            if base is None:
                loc = info.archive.locator(t.storage.key)
                if loc is None:
                    raise FixError(f"refusing to --fix {info.path}: the bytes of {key} are not in the file")
                data = bytearray(open_located(f, loc).read(t.storage.nbytes))
                if len(data) < t.storage.nbytes:
                    raise FixError(f"refusing to --fix {info.path}: storage of {key} is truncated")
                base = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
                bases[t.storage.key] = base
            try:
                typed = base.view(getattr(torch, t.dtype))
                tensor = torch.as_strided(typed, t.shape, t.stride, t.storage_offset)
            except RuntimeError as exc:
                raise FixError(f"refusing to --fix {info.path}: {key} does not fit its storage ({exc})") from None
            start, end = t.byte_span()
            if end - start < t.storage.nbytes:
                tensor = tensor.clone()
                cloned += 1
            if t.device != "cpu":
                moved += 1
            out_sd[new_key] = tensor
    if renamed:
        example = next(k for k in sd.tensors if remap(k) != k)
        actions.append(f"renamed {renamed} keys (e.g. {example!r} -> {remap(example)!r})")
    if moved:
        actions.append(f"moved {moved} tensors saved on accelerators to the CPU")
    if cloned:
        actions.append(f"cloned {cloned} views so they no longer carry their whole storage")
    tmp = out + ".tmp"
    torch.save(out_sd, tmp)
    try:
        loaded = torch.load(tmp, weights_only=True)
        if model is not None:
            model.load_state_dict(loaded, strict=True)
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
