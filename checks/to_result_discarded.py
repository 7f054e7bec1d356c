"""to-result-discarded: `tensor.to(device)` as a statement; tensors are not moved in place, so the result is lost."""

from __future__ import annotations

import ast
import re
from typing import Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Pitfall
from torchdoctor.sdk.source import (
    TENSOR_FACTORIES,
    Binding,
    FunctionScope,
    ModuleIndex,
    SourceFile,
    iter_names,
    last,
    qualname,
    ref,
)

_SETUP = """
import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Linear(4, 2).to(device)
loader = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(3)]
"""

TO_RESULT_DISCARDED = Pitfall(
    code="TD501",
    name="to-result-discarded",
    severity="error",
    summary="""
        `tensor.to(device)` (or .cuda(), .float(), ...) as a statement: tensors are not moved in place, the result
        is lost.
    """,
    why="""
        `nn.Module.to()` moves a module in place, which makes `model.to(device)` work as a statement. A tensor's
        `.to()` returns a new tensor and leaves the original where it was, so the next operation mixes devices
        (`Expected all tensors to be on the same device`) or silently runs on the CPU.
    """,
    fix="Assign the result: `x = x.to(device)`.",
    bad=Example(
        """
        for images, labels in loader:
            images.to(device)
            labels.to(device)
            out = model(images)
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        for images, labels in loader:
            images = images.to(device)
            labels = labels.to(device)
            out = model(images)
        """,
        setup=_SETUP,
    ),
    details={
        "source": """
            Only names known to hold tensors are reported (built by a torch tensor factory, unpacked from a loop over
            a data loader — a name containing "loader" or one bound to `DataLoader(...)` in the same function —,
            unpacked from one batch of such a loader (`x, y = next(iter(loader))`) or from a project function whose
            every `return` gives torch tensors at that position (`x, y = get_batch(...)`), or annotated `Tensor`);
            `model.to(device)`, whole batches and unknown objects (which may move in place) are quiet. This check has
            no run-time counterpart.
        """,
    },
)

_MOVES = frozenset(
    {"to", "cuda", "cpu", "float", "half", "double", "long", "int", "bfloat16", "bool", "contiguous", "pin_memory"}
)
_MOVE_CALL = re.compile(rf"\.(?:{'|'.join(sorted(_MOVES))})\(")
_LINE_START_NAME = re.compile(r"[ \t]*[A-Za-z_]\w*")


def _has_move_statement(text: str) -> bool:
    """Whether a line starts with `name.to(` (or another of `_MOVES`). Searching for the call first and then
    checking the start of its line is much faster than one multi-line regex trying every position."""
    for call in _MOVE_CALL.finditer(text):
        dot = call.start()
        if _LINE_START_NAME.fullmatch(text, text.rfind("\n", 0, dot) + 1, dot):
            return True
    return False


def _is_loader(name: str, scope: FunctionScope, index: ModuleIndex) -> bool:
    """Named like a loader, or bound in this function to a `DataLoader(...)` (whatever its name)."""
    if "loader" in name.lower():
        return True
    return any(
        isinstance(b.value, ast.Call) and last(qualname(b.value.func, index)).endswith("DataLoader")
        for b in scope.bindings_of(name)
    )


def _is_tensor(binding: Binding, index: ModuleIndex, scope: FunctionScope, src: Optional[SourceFile] = None) -> bool:
    value = binding.value
    if isinstance(binding.node, ast.arg):
        ann = binding.node.annotation
        return ann is not None and last(ref(ann) or "") == "Tensor"
    if isinstance(binding.node, (ast.For, ast.AsyncFor)):
        target = binding.node.target
        elements = target.elts if isinstance(target, ast.Tuple) else []
        iterable = binding.node.iter
        if isinstance(iterable, ast.Call) and last(ref(iterable.func)) == "enumerate" and len(elements) == 2:
            # for i, (x, y) in enumerate(loader): the parts are tensors; `for i, batch in ...`: a whole batch,
            # which may be a dict-like object that moves in place (transformers' BatchEncoding.to returns self)
            elements = elements[1].elts if isinstance(elements[1], ast.Tuple) else []
        names = {ref(e) for e in elements}
        if isinstance(iterable, ast.Call) and last(ref(iterable.func)) == "zip":
            return False  # zip(loader_a, loader_b) unpacks whole batches, which may move in place
        return binding.target in names and any(_is_loader(n, scope, index) for n in iter_names(iterable))
    if isinstance(value, ast.Call):
        qual = qualname(value.func, index)
        return qual.startswith("torch.") and last(qual) in TENSOR_FACTORIES
    if isinstance(binding.node, ast.Assign) and value is None and src is not None:
        return _unpacked_tensor(binding, binding.node, index, scope, src)
    return False


def _unpacked_tensor(
    binding: Binding, node: ast.Assign, index: ModuleIndex, scope: FunctionScope, src: SourceFile
) -> bool:
    """A part of a tuple unpacked from one batch of a loader (`x, y = next(iter(loader))`) or from a project
    function whose every `return` gives torch tensors at that position (`x, y = get_batch(...)`)."""
    if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Tuple) or not isinstance(node.value, ast.Call):
        return False
    names = [ref(e) for e in node.targets[0].elts]
    if binding.target not in names:
        return False
    position, call = names.index(binding.target), node.value
    if (
        last(ref(call.func) or "") == "next"
        and len(call.args) == 1
        and isinstance(call.args[0], ast.Call)
        and last(ref(call.args[0].func) or "") == "iter"
        and call.args[0].args
    ):
        loader = ref(call.args[0].args[0])
        return loader is not None and _is_loader(loader, scope, index)
    site = next((c for c in scope.calls if c.node is call), None)
    found = src.project.callee(scope, site) if site is not None else None
    if found is None or not found.scope.returns:
        return False
    callee, index = found.scope, found.module.index  # its names resolve with its own imports
    for ret in callee.returns:
        if not isinstance(ret.value, ast.Tuple) or len(ret.value.elts) != len(names):
            return False
        part = ret.value.elts[position]
        values = (
            [part]
            if isinstance(part, ast.Call)
            else [b.value for b in callee.bindings_of(ref(part) or "") if b.value is not None]
        )
        if not values or not all(
            isinstance(v, ast.Call)
            and qualname(v.func, index).startswith("torch.")
            and last(qualname(v.func, index)) in TENSOR_FACTORIES
            for v in values
        ):
            return False
    return True


@TO_RESULT_DISCARDED.source
def to_result_discarded(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or not _has_move_statement(src.text):
        return
    index = src.index
    for scope in index.scopes:
        for call in scope.calls if not _MOVES.isdisjoint(scope.call_attrs) else ():
            if not call.discarded or call.attr not in _MOVES or not call.receiver or "." in call.receiver:
                continue
            bindings = [b for b in scope.bindings if b.target == call.receiver and b.pos <= call.pos]
            if bindings and all(_is_tensor(b, index, scope, src) for b in bindings):
                yield Finding(
                    f"`{src.snippet(call.node)}` throws its result away: unlike a module's .to(), a tensor's "
                    f".{call.attr}() returns a new tensor and leaves `{call.receiver}` where it was.",
                    fix=Fix(code=f"{call.receiver} = {src.segment(call.node)}"),
                    location=src.location(call.node),
                )
