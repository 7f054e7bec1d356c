"""State-dict key matching: wrapper prefixes (DataParallel, torch.compile, Lightning) and model comparison."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import islice, repeat
from typing import TYPE_CHECKING, Iterable, Optional

from torchdoctor.wrappers import WRAPPER_PREFIXES

if TYPE_CHECKING:
    from torchdoctor.ckpt.info import ModelKeys, StateDict

# Prefixes added by wrappers (DataParallel/DDP, torch.compile), and by Lightning modules and common
# hand-written wrappers (loose: they are also ordinary attribute names).
STRICT_PREFIXES = tuple(WRAPPER_PREFIXES)
LOOSE_PREFIXES = ("model.", "net.")
MOST = 0.9


def share(keys: list[str], prefix: str) -> int:
    """How many keys start with `prefix`: one C-level substring count over the keys joined by newlines
    (state dicts reach 10^5 keys); keys that hold a newline themselves are tested one by one."""
    text = "\n" + "\n".join(keys)
    if text.count("\n") == len(keys):
        return text.count("\n" + prefix)
    return sum(map(str.startswith, keys, repeat(prefix)))


def wrapper_prefix(keys: Iterable[str], prefixes: tuple[str, ...] = STRICT_PREFIXES + LOOSE_PREFIXES) -> str:
    """The (possibly stacked, e.g. 'module._orig_mod.') wrapper prefix most keys carry, or ''.

    Strict prefixes count when at least 90% of keys carry them, loose ones (model., net.) only when all do.
    """
    keys = list(keys)
    found, base = "", ""  # base: what every key starts with, skipped rather than cut off
    while keys:
        for p in prefixes:
            strict = p in STRICT_PREFIXES
            need = math.ceil(MOST * len(keys)) if strict else len(keys)
            if not any(map(str.startswith, islice(keys, len(keys) - need + 1), repeat(base + p))):
                continue  # too many of the first keys lack it (cheap: most prefixes are ruled out here)
            n = share(keys, base + p)
            if n == len(keys) or (strict and n >= MOST * len(keys)):
                found += p
                if n == len(keys):
                    base += p
                else:
                    keys = [k[len(base) + len(p) :] if k.startswith(base + p) else k[len(base) :] for k in keys]
                    base = ""
                break
        else:
            break
    return found


def strip(key: str, prefix: str) -> str:
    """Remove a stacked prefix part by part (keys lacking part of it keep the rest)."""
    for part in _parts(prefix):
        if key.startswith(part):
            key = key[len(part) :]
    return key


def _parts(prefix: str) -> list[str]:
    return [p + "." for p in prefix.split(".") if p]


@dataclass
class Match:
    """How a checkpoint state dict lines up with a model's state_dict after the best key remap."""

    state_dict: StateDict
    strip: str = ""  # prefix removed from checkpoint keys
    add: str = ""  # prefix added to checkpoint keys
    matched: list[str] = field(default_factory=list)  # model keys found in the checkpoint
    missing: list[str] = field(default_factory=list)  # model keys absent from the checkpoint
    unexpected: list[str] = field(default_factory=list)  # checkpoint keys (remapped) the model lacks
    shape: list[tuple[str, tuple, tuple]] = field(default_factory=list)  # key, checkpoint shape, model shape
    dtype: list[tuple[str, str, str]] = field(default_factory=list)

    def remap(self, key: str) -> str:
        """A checkpoint key as the model would name it: `strip` removed part by part, then `add` prepended."""
        return self.add + strip(key, self.strip)

    @property
    def clean(self) -> bool:
        """True when every model key is found with the model's shape and no key is unexpected.

        dtype differences do not count: `load_state_dict` casts them.
        """
        return not (self.missing or self.unexpected or self.shape)


def _common_first(keys: list[str]) -> str:
    firsts = {k.split(".", 1)[0] + "." for k in keys if "." in k}
    if len(firsts) == 1 and all("." in k for k in keys):
        return firsts.pop()
    return ""


def compare(sd: StateDict, model: ModelKeys) -> Match:
    """Try no remap, stripping wrapper prefixes, and adding the model's own prefix; keep the best."""
    keys = list(sd.tensors)
    model_keys = list(model.entries)
    strips = {"", wrapper_prefix(keys), _common_first(keys)}
    adds = {"", wrapper_prefix(model_keys), _common_first(model_keys)}
    best: Optional[Match] = None
    for s in strips:
        for a in adds:
            m = _match(sd, model, s, a)
            if best is None or (len(m.matched), -len(m.unexpected), -len(s + a)) > (
                len(best.matched),
                -len(best.unexpected),
                -len(best.strip + best.add),
            ):
                best = m
    assert best is not None
    return best


def _match(sd: StateDict, model: ModelKeys, strip_prefix: str, add_prefix: str) -> Match:
    m = Match(sd, strip_prefix, add_prefix)
    remapped = {m.remap(k): t for k, t in sd.tensors.items()}
    for key, (shape, dtype) in model.entries.items():
        t = remapped.get(key)
        if t is None:
            m.missing.append(key)
            continue
        m.matched.append(key)
        if tuple(t.shape) != tuple(shape):
            m.shape.append((key, tuple(t.shape), tuple(shape)))
        elif t.dtype != dtype:
            m.dtype.append((key, t.dtype, dtype))
    m.unexpected = [k for k in remapped if k not in model.entries]
    return m


def best_match(state_dicts: list[StateDict], model: ModelKeys) -> Optional[Match]:
    """The state dict in the file that best fits the model, with its remap."""
    matches = [compare(sd, model) for sd in state_dicts if sd.tensors]
    if not matches:
        return None
    return max(matches, key=lambda m: (len(m.matched), -len(m.unexpected) - len(m.missing)))
