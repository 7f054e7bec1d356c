"""Checkpoint key checks: wrapper prefixes on state-dict keys, and mismatches against a model (--model)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from torchdoctor.findings import Finding, Location, Severity
from torchdoctor.registry import Scope, check

if TYPE_CHECKING:
    from torchdoctor.ckpt.info import CheckpointInfo, StateDict
    from torchdoctor.ckpt.keys import Match

_WHY = {
    "module.": "nn.DataParallel / DistributedDataParallel",
    "_orig_mod.": "torch.compile",
    "model.": "a Lightning module or training wrapper",
    "net.": "a training wrapper",
}


def _looks_lightning(info: CheckpointInfo, sd: StateDict) -> bool:
    top = {t["key"] for t in info.top_level}
    return sd.path == ("state_dict",) and bool(top & {"pytorch-lightning_version", "global_step", "epoch"})


def _load_line(info: CheckpointInfo, sd: StateDict) -> str:
    if sd.source == "module":  # a pickled nn.Module: its weights come from .state_dict()
        access = "".join(f"[{part!r}]" for part in sd.path)
        return (f"sd = torch.load({info.path!r}, map_location='cpu', weights_only=False){access}.state_dict()"
                "  # only if you trust the file")
    access = "".join(f"[{part!r}]" for part in sd.path)
    return f"sd = torch.load({info.path!r}, map_location='cpu'){access}"


@check(code="TD204", name="wrapper-prefix", scope=Scope.CHECKPOINT, severity="warning",
       summary="Every key carries a wrapper prefix such as 'module.' or '_orig_mod.'.")
def wrapper_prefix_check(info: CheckpointInfo) -> Iterator[Finding]:
    from torchdoctor.ckpt.info import show_path
    from torchdoctor.ckpt.keys import LOOSE_PREFIXES, share, wrapper_prefix

    model_keys = list(info.model.entries) if info.model is not None else None
    for sd in info.state_dicts:
        keys = list(sd.tensors)
        prefix = wrapper_prefix(keys)
        if not prefix:
            continue
        if model_keys is not None and wrapper_prefix(model_keys).startswith(prefix):
            continue  # the model itself is wrapped the same way: the keys fit it
        first = prefix.split(".", 1)[0] + "."
        if first in LOOSE_PREFIXES and model_keys is None and not _looks_lightning(info, sd):
            continue  # a plain model may well have a child called `model`; only --model can tell
        n = share(keys, first)
        example = next(k for k in keys if k.startswith(first))
        whom = " + ".join(_WHY.get(p + ".", "a wrapper") for p in prefix.split(".") if p)
        where = show_path(sd.path)
        count = "every key" if n == len(keys) else f"{n} of {len(keys)} keys"
        yield Finding(
            f"In state dict {where}, {count} starts with '{prefix}' (added by {whom}), e.g. '{example}'. "
            f"Loading it into the unwrapped model fails with \"Missing key(s) … Unexpected key(s) in state_dict: "
            f"\"{example}\"\".",
            fix=(f"{_load_line(info, sd)}\n"
                 "from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present\n"
                 + "".join(f"consume_prefix_in_state_dict_if_present(sd, {p + '.'!r})\n"
                           for p in prefix.split(".") if p)
                 + "model.load_state_dict(sd)\n"
                 f"or write a fixed copy: torchdoctor check-ckpt {info.path} --fix fixed.pt"),
            location=Location(file=info.path, key=example),
        )


def _few(keys: list[str], n: int = 8) -> str:
    shown = ", ".join(keys[:n])
    return shown + (f", … ({len(keys) - n} more)" if len(keys) > n else "")


def _remap_snippet(m: Match) -> str:
    if not (m.strip or m.add):
        return ""
    if m.strip and not m.add:
        body = f"k.removeprefix({m.strip!r})" if "." not in m.strip[:-1] else f"k.replace({m.strip!r}, '', 1)"
    else:
        body = f"{m.add!r} + k.removeprefix({m.strip!r})" if m.strip else f"{m.add!r} + k"
    return f"sd = {{{body}: v for k, v in sd.items()}}\n"


@check(code="TD206", name="state-dict-mismatch", scope=Scope.CHECKPOINT, severity="error",
       summary="With --model: missing/unexpected keys, shape or dtype mismatches against the model's state_dict.")
def state_dict_mismatch(info: CheckpointInfo) -> Iterator[Finding]:
    from torchdoctor.ckpt.info import show_path
    from torchdoctor.ckpt.keys import best_match, wrapper_prefix

    if info.model is None:
        return
    spec = info.model.spec
    m = best_match(info.state_dicts, info.model)
    if m is None:
        yield Finding(f"No state dict was found in the checkpoint to compare with the model {spec}.",
                      fix="Save model.state_dict() (or a dict holding it) rather than other objects.",
                      location=Location(file=info.path))
        return
    where = show_path(m.state_dict.path)
    remap = _remap_snippet(m)
    prefix_noted = wrapper_prefix(m.state_dict.tensors) == m.strip and m.strip and not m.add
    head = f"State dict {where} vs model {spec}" + (
        f" (after mapping keys: strip '{m.strip}'" + (f", add '{m.add}'" if m.add else "") + ")" if remap else "")
    load = _load_line(info, m.state_dict)
    if m.missing or m.unexpected:
        parts = []
        if m.missing:
            parts.append(f"{len(m.missing)} model key(s) are missing from the file and would keep their "
                         f"initial values with strict=False: {_few(m.missing)}")
        if m.unexpected:
            parts.append(f"{len(m.unexpected)} key(s) in the file are not in the model and would be silently "
                         f"ignored with strict=False: {_few(m.unexpected)}")
        yield Finding(
            f"{head}: {'; '.join(parts)}. load_state_dict(strict=True) raises \"Error(s) in loading state_dict\".",
            fix=(f"{load}\n{remap}missing, unexpected = model.load_state_dict(sd, strict=False)\n"
                 "# check that only the layers you meant to re-initialise (e.g. a new head) are listed"),
            location=Location(file=info.path, key=(m.missing or m.unexpected)[0]),
        )
    if m.shape:
        rows = "; ".join(f"{k}: file {list(a)} vs model {list(b)}" for k, a, b in m.shape[:8])
        names = ", ".join(repr(k) for k, _, _ in m.shape[:8])
        yield Finding(
            f"{head}: {len(m.shape)} shape mismatch(es), which load_state_dict rejects even with strict=False "
            f"(\"size mismatch for …\"): {rows}.",
            fix=(f"{load}\n{remap}for k in [{names}]:\n    sd.pop(k)  # e.g. a classifier head of another size\n"
                 "model.load_state_dict(sd, strict=False)"),
            location=Location(file=info.path, key=m.shape[0][0]),
        )
    if m.dtype:
        rows = "; ".join(f"{k}: file {a} vs model {b}" for k, a, b in m.dtype[:8])
        yield Finding(
            f"{head}: {len(m.dtype)} dtype difference(s); load_state_dict casts them silently: {rows}.",
            fix="Usually fine (e.g. fp16 weights into an fp32 model); convert the model (model.half()) if you "
                "meant to keep the saved precision.",
            location=Location(file=info.path, key=m.dtype[0][0]),
            severity=Severity.INFO,
        )
    if remap and m.clean and not prefix_noted:
        yield Finding(
            f"{head}: every key matches only after the remap.",
            fix=f"{load}\n{remap}model.load_state_dict(sd)",
            location=Location(file=info.path, key=m.matched[0] if m.matched else None),
            severity=Severity.WARNING,
        )
