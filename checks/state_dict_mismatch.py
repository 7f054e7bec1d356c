"""state-dict-mismatch: with --model, keys, shapes or dtypes of the file do not fit the model."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import WRAPPER_PREFIXES, Example, Finding, Fix, Location, Pitfall, Severity
from torchdoctor.sdk.checkpoint import CheckpointInfo, Match, best_match, show_path, wrapper_prefix
from torchdoctor.sdk.runtime import CrashEvent, RuntimeCheck

from ._ckptutil import MODEL_SETUP, load_line

STATE_DICT_MISMATCH = Pitfall(
    code="TD206",
    name="state-dict-mismatch",
    severity="error",
    summary="With --model: missing/unexpected keys, shape or dtype mismatches against the model's state_dict.",
    why="""
        With `--model SPEC` (or `check_checkpoint(path, model=...)`), torchdoctor compares the file's state
        dict with the model's `state_dict()` after trying the known key remaps (stripping wrapper prefixes,
        adding the model's own prefix): missing keys, unexpected keys, shape and dtype differences. It says what
        `load_state_dict(strict=False)` would silently skip.

        `strict=True` stops with "Error(s) in loading state_dict" and a wall of key names. The common reaction,
        `strict=False`, loads whatever matches and leaves the rest at its random initial values without a word.
        Shape mismatches (`size mismatch for fc.weight: copying a param with shape torch.Size([1000, 512]) ...`)
        fail even with `strict=False`.
    """,
    fix="""
        Apply the exact remap torchdoctor prints; for layers that really differ (a new classification head),
        drop those keys explicitly and check the keys `load_state_dict(strict=False)` returns.
    """,
    bad=Example(
        """
            old = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
            torch.save(old.state_dict(), "ckpt.pt")  # keys 0.*, 2.*

            model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.1), nn.Linear(8, 2))  # the head is now 3.*
            model.load_state_dict(torch.load("ckpt.pt"), strict=False)  # loads layer 0; the head silently stays random
        """,
        setup="import torch\nfrom torch import nn\n",
        unseen={
            "runtime": "strict=False loads without an error; at run time the check explains a "
            "`load_state_dict` that raises"
        },
    ),
    good=Example(
        """
            torch.save(model.state_dict(), "ckpt.pt")
            model = make_model()  # the same architecture, e.g. in the evaluation script
            model.load_state_dict(torch.load("ckpt.pt"))  # strict: a missing or unexpected key raises
        """,
        setup=MODEL_SETUP,
        unseen={"runtime": "nothing raises"},
    ),
    details={
        "runtime": """
            When the watched code (or the program, under `torchdoctor run`) dies in `load_state_dict`, the
            check takes the model and the state dict from the failing call's frame and compares their keys,
            shapes and dtypes as `check-ckpt --model` does, after the same remaps (wrapper prefixes such as
            `module.` and `_orig_mod.`, the model's own prefix), so the fix is the exact remap. Quiet for any
            other error.
        """,
    },
)


def _few(keys: list[str], n: int = 8) -> str:
    """The first `n` keys, and how many more there are."""
    shown = ", ".join(keys[:n])
    return shown + (f", … ({len(keys) - n} more)" if len(keys) > n else "")


def _remap_snippet(m: Match) -> str:
    """The dict comprehension that renames the file's keys the way the match did ('' when none)."""
    if not (m.strip or m.add):
        return ""
    if m.strip and not m.add:
        body = f"k.removeprefix({m.strip!r})" if "." not in m.strip[:-1] else f"k.replace({m.strip!r}, '', 1)"
    else:
        body = f"{m.add!r} + k.removeprefix({m.strip!r})" if m.strip else f"{m.add!r} + k"
    return f"sd = {{{body}: v for k, v in sd.items()}}\n"


@STATE_DICT_MISMATCH.checkpoint
def state_dict_mismatch(info: CheckpointInfo) -> Iterator[Finding]:
    """Missing, unexpected, misshapen or recast keys of the best-matching state dict vs --model."""
    if info.model is None:
        return
    spec = info.model.spec
    m = best_match(info.state_dicts, info.model)
    if m is None:
        yield Finding(
            f"No state dict was found in the checkpoint to compare with the model {spec}.",
            fix=Fix(title="Save model.state_dict() (or a dict holding it) rather than other objects."),
            location=Location(file=info.path),
        )
        return
    where = show_path(m.state_dict.path)
    remap = _remap_snippet(m)
    prefix_noted = wrapper_prefix(m.state_dict.tensors) == m.strip and m.strip and not m.add
    head = f"State dict {where} vs model {spec}" + (
        f" (after mapping keys: strip '{m.strip}'" + (f", add '{m.add}'" if m.add else "") + ")" if remap else ""
    )
    load = load_line(info, m.state_dict)
    if m.missing or m.unexpected:
        parts = []
        if m.missing:
            parts.append(
                f"{len(m.missing)} model key(s) are missing from the file and would keep their "
                f"initial values with strict=False: {_few(m.missing)}"
            )
        if m.unexpected:
            parts.append(
                f"{len(m.unexpected)} key(s) in the file are not in the model and would be silently "
                f"ignored with strict=False: {_few(m.unexpected)}"
            )
        yield Finding(
            f'{head}: {"; ".join(parts)}. load_state_dict(strict=True) raises "Error(s) in loading state_dict".',
            fix=Fix(
                code=f"{load}\n{remap}missing, unexpected = model.load_state_dict(sd, strict=False)\n"
                "# check that only the layers you meant to re-initialise (e.g. a new head) are listed"
            ),
            location=Location(file=info.path, key=(m.missing or m.unexpected)[0]),
        )
    if m.shape:
        rows = "; ".join(f"{k}: file {list(a)} vs model {list(b)}" for k, a, b in m.shape[:8])
        names = ", ".join(repr(k) for k, _, _ in m.shape[:8])
        yield Finding(
            f"{head}: {len(m.shape)} shape mismatch(es), which load_state_dict rejects even with strict=False "
            f'("size mismatch for …"): {rows}.',
            fix=Fix(
                code=f"{load}\n{remap}for k in [{names}]:\n    sd.pop(k)  # e.g. a classifier head of another size\n"
                "model.load_state_dict(sd, strict=False)"
            ),
            location=Location(file=info.path, key=m.shape[0][0]),
        )
    if m.dtype:
        rows = "; ".join(f"{k}: file {a} vs model {b}" for k, a, b in m.dtype[:8])
        yield Finding(
            f"{head}: {len(m.dtype)} dtype difference(s); load_state_dict casts them silently: {rows}.",
            fix=Fix(
                title="Usually fine (e.g. fp16 weights into an fp32 model); convert the model (model.half()) if you "
                "meant to keep the saved precision."
            ),
            location=Location(file=info.path, key=m.dtype[0][0]),
            severity=Severity.INFO,
        )
    if remap and m.clean and not prefix_noted:
        yield Finding(
            f"{head}: every key matches only after the remap.",
            fix=Fix(code=f"{load}\n{remap}model.load_state_dict(sd)"),
            location=Location(file=info.path, key=m.matched[0] if m.matched else None),
            severity=Severity.WARNING,
        )


@STATE_DICT_MISMATCH.runtime
class StateDictMismatchAtLoad(RuntimeCheck):
    """At a crash in ``load_state_dict``: the model and the dict from the failing frame, compared key by key."""

    def on_crash(self, event: CrashEvent) -> Iterator[Finding]:
        from torchdoctor.sdk.checkpoint import ModelKeys, StateDict, TensorMeta
        from torchdoctor.sdk.runtime import evidence

        load = next(
            (
                f
                for f in reversed(evidence.frames(event.exception))
                if f.f_code.co_name == "load_state_dict"
                and isinstance(f.f_locals.get("state_dict"), dict)
                and hasattr(f.f_locals.get("self"), "state_dict")
            ),
            None,
        )
        if load is None:
            return
        model, given = load.f_locals["self"], load.f_locals["state_dict"]
        model_entries = {k: _meta(v) for k, v in model.state_dict().items()}
        tensors = {
            k: TensorMeta(dtype, shape, (), None)
            for k, (shape, dtype) in ((k, _meta(v)) for k, v in given.items() if hasattr(v, "shape"))
        }
        m = best_match([StateDict((), tensors)], ModelKeys(type(model).__name__, model_entries))
        remap = _remap_snippet(m) if m is not None else ""
        if m is None or (m.clean and not remap):
            return
        parts = []
        if m.strip and not m.add:
            who = WRAPPER_PREFIXES.get(m.strip)
            parts.append(
                f"every key of the dict carries the prefix '{m.strip}'"
                + (f" (added by {who})" if who else "")
                + " that the model's keys lack"
            )
        elif m.add and not m.strip:
            parts.append(f"the model's keys carry the prefix '{m.add}' that the dict's keys lack")
        if m.missing:
            parts.append(f"{len(m.missing)} model key(s) missing from the dict: {_few(m.missing)}")
        if m.unexpected:
            parts.append(f"{len(m.unexpected)} key(s) of the dict not in the model: {_few(m.unexpected)}")
        if m.shape:
            parts.append(
                f"{len(m.shape)} shape mismatch(es): "
                + "; ".join(f"{k}: dict {list(a)} vs model {list(b)}" for k, a, b in m.shape[:4])
            )
        mapped = (
            f" after mapping keys (strip '{m.strip}'" + (f", add '{m.add}'" if m.add else "") + ")" if remap else ""
        )
        name = evidence.module_path(self.ctx, model) if self.ctx.models else None
        fix = (
            Fix(title="Rename the keys as shown, then load:", code=f"{remap}model.load_state_dict(sd)")
            if remap and not m.missing and not m.unexpected and not m.shape
            else Fix(
                code=f"{remap}missing, unexpected = model.load_state_dict(sd, strict=False)\n"
                "# check that only the layers you meant to re-initialise (e.g. a new head) are listed"
            )
        )
        if m.shape:
            names = ", ".join(repr(k) for k, _, _ in m.shape[:8])
            fix = Fix(
                code=f"{remap}for k in [{names}]:\n    sd.pop(k)  # e.g. a classifier head of another size\n"
                "model.load_state_dict(sd, strict=False)"
            )
        first = next(iter(m.missing or m.unexpected or [k for k, _, _ in m.shape] or m.matched), None)
        yield Finding(
            f"load_state_dict into {type(model).__name__} failed{mapped}: " + "; ".join(parts) + ".",
            fix=fix,
            location=Location(module=name, key=first),
        )


def _meta(value: object) -> tuple[tuple[int, ...], str]:
    """(shape, dtype name) of a state-dict value, as check-ckpt records them."""
    shape = tuple(getattr(value, "shape", ()))
    return shape, str(getattr(value, "dtype", "")).replace("torch.", "")
