"""unsafe-torch-load: `torch.load` without `weights_only=True` can run arbitrary code from the file."""

from __future__ import annotations

import ast
from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Pitfall, Severity
from torchdoctor.sdk.source import (
    CallSite,
    Edit,
    FixableFinding,
    FunctionScope,
    SourceFile,
    Spanned,
    end_of,
    literal,
    ref,
)

_SETUP = """
import torch
from torch import nn

model = nn.Linear(4, 2)
"""

UNSAFE_TORCH_LOAD = Pitfall(
    code="TD503",
    name="unsafe-torch-load",
    severity="info",
    summary="torch.load without weights_only=True can run arbitrary code from the file.",
    why="""
        A checkpoint is a pickle. With `weights_only=False` (the default before PyTorch 2.6) loading it runs any
        callable the file names, so a downloaded checkpoint can take over the machine. Since 2.6 the default is
        `weights_only=True`, so a call that does not say which it wants behaves differently depending on the
        installed torch.
    """,
    fix="""
        Pass `weights_only=True` for state dicts and checkpoints of tensors; register your own classes with
        `torch.serialization.add_safe_globals([...])`. `torchdoctor lint --fix` adds `weights_only=True` where the
        result only goes to `load_state_dict`.
    """,
    bad=Example(
        """
        state = torch.load("model.pt")
        model.load_state_dict(state)
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        state = torch.load("model.pt", weights_only=True)
        model.load_state_dict(state)
        """,
        setup=_SETUP,
    ),
    details={
        "source": """
            Findings are notes (the default severity above) except one: an explicit `weights_only=False` is a
            warning when the file is downloaded (a URL, or a `*download*` /
            `urlopen` call feeding the path) and otherwise a note (a deliberate choice, e.g. a test loading what it
            just wrote); a call without `weights_only` is a note, fixable when its result is only passed to
            `load_state_dict` (directly or by constant key).
        """,
    },
)


def _only_a_state_dict(load: CallSite, scope: FunctionScope) -> bool:
    """The loaded object only ever goes to `load_state_dict` (directly, or by a constant key)."""
    state_args = [c.node.args[0] for c in scope.calls if c.attr == "load_state_dict" and c.node.args]
    if any(a is load.node for a in state_args):
        return True
    names = [b.target for b in scope.bindings if b.value is load.node and not b.augmented]
    if len(names) != 1 or "." in names[0] or isinstance(names[0], tuple):
        return False
    name = names[0]
    allowed = {id(a) for a in state_args if isinstance(a, ast.Name) and a.id == name}
    allowed |= {
        id(a.value)
        for a in state_args
        if isinstance(a, ast.Subscript)
        and isinstance(a.value, ast.Name)
        and a.value.id == name
        and isinstance(a.slice, ast.Constant)
    }
    uses = [n for n in ast.walk(scope.node) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]
    return bool(uses) and all(id(n) in allowed for n in uses) and len(scope.bindings_of(name)) == 1


def _downloaded(scope: FunctionScope, load: CallSite) -> bool:
    """The file comes from the network: a URL literal, or a `*download*`/`urlopen` call (directly or through
    the name passed to torch.load)."""
    arg = load.node.args[0] if load.node.args else load.kwarg("f")
    values: list[ast.expr] = [arg] if arg is not None else []
    if isinstance(arg, ast.Name):
        values += [b.value for b in scope.bindings_of(arg.id) if b.value is not None and b.pos < load.pos]
    for value in values:
        for node in ast.walk(value):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.startswith(("http://", "https://"))
            ):
                return True
            if isinstance(node, ast.Call):
                name = (ref(node.func) or "").rsplit(".", 1)[-1].lower()
                if "download" in name or name == "urlopen":
                    return True
    return False


@UNSAFE_TORCH_LOAD.source
def unsafe_torch_load(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or "load(" not in src.text:
        return
    for scope in src.index.scopes:
        for call in scope.calls if "load" in scope.call_attrs else ():
            if call.qualname != "torch.load" or call.has_star_kwargs or call.kwarg("pickle_module") is not None:
                continue
            flag = call.kwarg("weights_only")
            if flag is not None and literal(flag) is False:
                downloaded = _downloaded(scope, call)
                yield Finding(
                    f"`{src.snippet(call.node)}` unpickles with weights_only=False: loading the file runs whatever "
                    "code its pickle names, so a checkpoint from elsewhere can take over the machine"
                    + (" (and this one is downloaded)." if downloaded else "; fine for files you made yourself."),
                    fix=Fix(
                        title="Load with weights_only=True (allow your own classes with "
                        "torch.serialization.add_safe_globals([...])), or only load files you made."
                    ),
                    location=src.location(call.node),
                    severity=Severity.WARNING if downloaded else None,
                )
            elif flag is None:
                edits: tuple[Edit, ...] = ()
                if _only_a_state_dict(call, scope):
                    arguments: list[Spanned] = [*call.node.args, *call.node.keywords]
                    last = max(arguments, key=end_of)
                    edits = (Edit(src.end(last), src.end(last), ", weights_only=True"),)
                yield FixableFinding(
                    f"`{src.snippet(call.node)}` does not say weights_only: before torch 2.6 it unpickles "
                    "arbitrary objects (running any code the file names), and from 2.6 on it refuses files with "
                    "anything but tensors and plain containers, so the behaviour depends on the installed torch.",
                    fix=Fix(
                        title="Say what you mean: `torch.load(..., weights_only=True)` for a state dict or "
                        "checkpoint of "
                        "tensors; weights_only=False only for files you made yourself."
                    ),
                    location=src.location(call.node),
                    edits=edits,
                )
