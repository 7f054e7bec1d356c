"""wrapper-prefix: every state-dict key carries a wrapper prefix such as 'module.' or '_orig_mod.'."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import WRAPPER_PREFIXES, Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.checkpoint import LOOSE_PREFIXES, CheckpointInfo, StateDict, share, show_path, wrapper_prefix

from ._ckptutil import MODEL_SETUP, load_line

_WHY = {
    **WRAPPER_PREFIXES,
    "model.": "a Lightning module or training wrapper",
    "net.": "a training wrapper",
}

WRAPPER_PREFIX = Pitfall(
    code="TD204",
    name="wrapper-prefix",
    severity="warning",
    summary="Every key carries a wrapper prefix such as 'module.' or '_orig_mod.'.",
    why="""
        Every (or nearly every) key of a state dict in the file starts with a wrapper's prefix: `module.` from
        `nn.DataParallel`/`DistributedDataParallel`, `_orig_mod.` from `torch.compile`, or `model.`/`net.` from a
        Lightning module or training wrapper. The prefixes can stack (`module._orig_mod.`).

        The weights were saved from the wrapper, but they are loaded into the bare model, whose keys lack the
        prefix:

        ```text
        RuntimeError: Error(s) in loading state_dict for Net:
            Missing key(s) in state_dict: "conv1.weight", ...
            Unexpected key(s) in state_dict: "module.conv1.weight", ...
        ```

        With `strict=False` the load "succeeds" and silently keeps the random initial weights. `model.` alone is
        reported only when the file looks like a Lightning checkpoint or `--model` shows that the model's keys
        lack it, since a plain model may have a child called `model`.
    """,
    fix="""
        Strip the prefix before loading, with `consume_prefix_in_state_dict_if_present`, or write a fixed copy
        with `torchdoctor check-ckpt FILE --fix fixed.pt`. When saving, save the inner module:
        `model.module.state_dict()` (DataParallel/DDP) or `model._orig_mod.state_dict()` (compiled).
    """,
    bad=Example(
        """
            ddp_model = nn.DataParallel(model)  # DistributedDataParallel adds the same "module." prefix
            torch.save(ddp_model.state_dict(), "ckpt.pt")  # keys: module.0.weight, ...
            # model.load_state_dict(torch.load("ckpt.pt")) -> Unexpected key(s) in state_dict: "module.0.weight"
        """,
        setup=MODEL_SETUP,
    ),
    good=Example(
        """
            ddp_model = nn.DataParallel(model)
            torch.save(ddp_model.module.state_dict(), "ckpt.pt")  # the plain model's keys: 0.weight, ...
            model.load_state_dict(torch.load("ckpt.pt"))
        """,
        setup=MODEL_SETUP,
    ),
)


def _looks_lightning(info: CheckpointInfo, sd: StateDict) -> bool:
    """A Lightning checkpoint's state dict, whose 'model.' prefix is the LightningModule's attribute."""
    top = {t["key"] for t in info.top_level}
    return sd.path == ("state_dict",) and bool(top & {"pytorch-lightning_version", "global_step", "epoch"})


@WRAPPER_PREFIX.checkpoint
def prefixed_keys(info: CheckpointInfo) -> Iterator[Finding]:
    """State dicts whose keys share a wrapper prefix that the model (if given) does not have."""
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
            f'Loading it into the unwrapped model fails with "Missing key(s) … Unexpected key(s) in state_dict: '
            f'"{example}"".',
            fix=Fix(
                code=f"{load_line(info, sd)}\n"
                "from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present\n"
                + "".join(f"consume_prefix_in_state_dict_if_present(sd, {p + '.'!r})\n" for p in prefix.split(".") if p)
                + "model.load_state_dict(sd)\n"
                f"# or write a fixed copy: torchdoctor check-ckpt {info.path} --fix fixed.pt"
            ),
            location=Location(file=info.path, key=example),
        )
