"""Checkpoint safety checks: code-executing pickles, globals outside torch's weights_only allowlist, pickled modules."""
from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any, Iterator

from torchdoctor.findings import Finding, Location
from torchdoctor.registry import Scope, check

if TYPE_CHECKING:
    from torchdoctor.ckpt.info import CheckpointInfo

_TORCH_LOAD_FORMATS = ("zip", "legacy")  # plain pickles: serialization-format explains


def _show_args(args: Any, budget: int = 160) -> str:
    """A short, inert rendering of call arguments (strings and numbers verbatim, the rest by type)."""
    from torchdoctor.ckpt.objects import GlobalRef, Instance, TensorMeta

    def one(v: Any, depth: int = 0) -> str:
        if isinstance(v, (str, bytes)):
            return repr(v[:budget])
        if isinstance(v, (int, float, bool)) or v is None:
            return repr(v)
        if isinstance(v, GlobalRef):
            return v.qualname
        if isinstance(v, Instance):
            return f"{v.qualname}(...)"
        if isinstance(v, TensorMeta):
            return "<tensor>"
        if isinstance(v, (tuple, list)) and depth < 3:
            inner = ", ".join(one(x, depth + 1) for x in v[:6]) + (", ..." if len(v) > 6 else "")
            return f"({inner})" if isinstance(v, tuple) else f"[{inner}]"
        return f"<{type(v).__name__}>"

    text = ", ".join(one(a) for a in args[:6]) if isinstance(args, tuple) else one(args)
    return text if len(text) <= budget else text[: budget - 3] + "..."


@check(code="TD201", name="unsafe-pickle", scope=Scope.CHECKPOINT, severity="error",
       summary="The pickle names or calls code that runs commands, evaluates code or touches files when loaded.")
def unsafe_pickle(info: CheckpointInfo) -> Iterator[Finding]:
    from torchdoctor.ckpt.policy import Verdict

    calls: dict[str, list[str]] = defaultdict(list)
    for name, scan in info.archive.pickles:
        for qualname, first_calls in scan.calls.items():
            for _, args in first_calls:
                if len(calls[qualname]) < 3:
                    calls[qualname].append(f"{qualname}({_show_args(args)})")
    for g in info.globals:
        if g.verdict is not Verdict.DANGEROUS:
            continue
        where = ", ".join(g.pickles)
        if g.called:
            runs = "; ".join(calls[g.qualname])
            what = f"calls `{runs}`"
        else:
            what = "imports it (the payload may call it through another object)"
        yield Finding(
            f"{where} names `{g.qualname}` and {what}. Loading this file with `torch.load(..., weights_only=False)` "
            "or `pickle.load` executes that; torchdoctor only read it.",
            fix="Do not load this file. If you trust its source anyway, know that loading runs exactly: "
                + ("; ".join(calls[g.qualname]) if g.called else f"an import of {g.qualname}")
                + ". Ask for a safetensors or plain state_dict copy instead.",
            location=Location(file=info.path, key=where),
        )
    for where, event in info.events:
        yield Finding(
            f"{where}, byte {event.pos}: {event.what}. A data-only checkpoint never does this; it is how "
            "pickle payloads hide the code they run from scanners.",
            fix="Do not load this file with torch.load(weights_only=False) or pickle.load.",
            location=Location(file=info.path, key=where),
        )


@check(code="TD202", name="needs-code-to-load", scope=Scope.CHECKPOINT, severity="warning",
       summary="The file needs globals outside torch's weights_only allowlist: torch.load's default refuses it.")
def needs_code_to_load(info: CheckpointInfo) -> Iterator[Finding]:
    from torchdoctor.ckpt.policy import Verdict

    if info.format not in _TORCH_LOAD_FORMATS:
        return
    extra = [g for g in info.globals if g.verdict in (Verdict.BENIGN, Verdict.UNKNOWN)]
    if extra:
        names = [g.qualname for g in extra]
        shown = ", ".join(names[:12]) + (f", … ({len(names) - 12} more)" if len(names) > 12 else "")
        user = [g.qualname for g in extra if g.verdict is Verdict.UNKNOWN]
        message = (f"`torch.load(path)` (weights_only=True, the default since torch 2.6) fails with "
                   f"\"Weights only load failed … Unsupported global: GLOBAL {names[0]}\": the file names "
                   f"{len(names)} global(s) outside the allowlist: {shown}.")
        if user:
            message += f" Loading it runs code from: {', '.join(user[:6])}."
        modules = sorted({n.rpartition(".")[0] for n in names[:12]})
        fix = ("If you trust the file, allow exactly these globals:\n"
               + "".join(f"import {m}\n" for m in modules if m and not m.startswith("__"))
               + f"torch.serialization.add_safe_globals([{', '.join(names[:12])}])\n"
               "ckpt = torch.load(path)\n"
               "Better: re-save only tensors and plain Python values (model.state_dict(), optimizer.state_dict(), "
               "int/float/str instead of numpy scalars, vars(args) instead of argparse.Namespace).")
        yield Finding(message, fix=fix, location=Location(file=info.path))
    if info.unsupported_opcodes:
        ops = ", ".join(sorted(info.unsupported_opcodes))
        protocol = max((scan.protocol for _, scan in info.archive.pickles), default=0)
        yield Finding(
            f"The pickle uses opcodes the weights_only unpickler does not implement ({ops}; pickle protocol "
            f"{protocol}), so `torch.load(path)` fails with \"Weights only load failed … Unsupported operand\" "
            "even though every global is allowed.",
            fix="Re-save with torch's default protocol (2): torch.save(obj, path)  # no pickle_protocol=4/5",
            location=Location(file=info.path),
        )


@check(code="TD203", name="pickled-module", scope=Scope.CHECKPOINT, severity="warning",
       summary="A whole nn.Module or optimizer object was pickled (torch.save(model)) instead of its state_dict().")
def pickled_module(info: CheckpointInfo) -> Iterator[Finding]:
    from torchdoctor.ckpt.info import show_path

    if info.format == "torchscript":
        return
    for obj in info.objects:
        cls = obj.qualname
        short = cls.rpartition(".")[2]
        where = show_path(obj.path)
        if obj.kind == "module":
            message = (f"{where} is a whole pickled `{cls}` module (torch.save(model)), not a state_dict. Loading "
                       f"it needs `{cls}` importable under exactly that name (else \"Can't get attribute '{short}' "
                       f"on <module '{cls.rpartition('.')[0]}'>\"), breaks when the code changes, and "
                       "torch.load's weights_only default refuses it.")
            fix = ("Save the weights instead: torch.save(model.state_dict(), 'weights.pt'), and rebuild with "
                   "model = Net(); model.load_state_dict(torch.load('weights.pt')). "
                   "`torchdoctor check-ckpt FILE --fix weights.pt` extracts them without running this pickle.")
        else:
            message = (f"{where} is a whole pickled `{cls}` optimizer object, not optimizer.state_dict(); it "
                       "carries references to parameters and needs code to load.")
            fix = "Save optimizer.state_dict() and restore with optimizer.load_state_dict(...)."
        yield Finding(message, fix=fix, location=Location(file=info.path, key=where))
