"""Data and device rules in source: shuffle with a sampler, `.to()` results thrown away."""
from __future__ import annotations

import ast
import re
from typing import Iterator

from torchdoctor.findings import Finding
from torchdoctor.lint.flow import TENSOR_FACTORIES, iter_names, literal, qualname
from torchdoctor.lint.index import Binding, CallSite, ModuleIndex, last, ref
from torchdoctor.lint.source import SourceFile
from torchdoctor.registry import Scope, check


def _is_loader_call(call: CallSite) -> bool:
    return last(call.qualname).endswith("DataLoader")


@check(code="TD502", name="shuffle-with-sampler", scope=Scope.SOURCE, severity="error",
       summary="DataLoader(shuffle=True) with a sampler or batch_sampler: PyTorch raises 'sampler option is mutually exclusive with shuffle'.")
def shuffle_with_sampler(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or "shuffle" not in src.text or "ampler" not in src.text:
        return
    for call in src.index.all_calls():
        if not _is_loader_call(call) or literal(call.kwarg("shuffle")) is not True:
            continue
        for option in ("sampler", "batch_sampler"):
            value = call.kwarg(option)
            if value is not None and literal(value) is not None:
                yield Finding(
                    f"`{src.snippet(call.node)}` passes shuffle=True together with {option}=: DataLoader raises "
                    f"'{option} option is mutually exclusive with shuffle'. The sampler decides the order.",
                    fix=f"Drop shuffle=True and let the sampler shuffle (DistributedSampler(dataset, shuffle=True)), "
                        f"e.g. `DataLoader(dataset, {option}=..., shuffle=False)`.",
                    location=src.location(call.node),
                )
                break


_MOVES = frozenset({"to", "cuda", "cpu", "float", "half", "double", "long", "int", "bfloat16", "bool",
                    "contiguous", "pin_memory"})
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


def _is_tensor(binding: Binding, index: ModuleIndex) -> bool:
    value = binding.value
    if isinstance(binding.node, ast.arg):
        ann = binding.node.annotation
        return ann is not None and last(ref(ann) or "") == "Tensor"
    if isinstance(binding.node, (ast.For, ast.AsyncFor)):
        target = binding.node.target
        elements = target.elts if isinstance(target, ast.Tuple) else []
        if isinstance(target, ast.Tuple) and len(elements) == 2 and isinstance(elements[1], ast.Tuple):
            elements = elements[1].elts  # for i, (x, y) in enumerate(loader)
        names = {ref(e) for e in elements}
        iterable = binding.node.iter
        if isinstance(iterable, ast.Call) and last(ref(iterable.func)) == "zip":
            return False  # zip(loader_a, loader_b) unpacks whole batches, which may move in place
        return binding.target in names and any("loader" in n.lower() for n in iter_names(iterable))
    if isinstance(value, ast.Call):
        qual = qualname(value.func, index)
        return qual.startswith("torch.") and last(qual) in TENSOR_FACTORIES
    return False


@check(code="TD501", name="to-result-discarded", scope=Scope.SOURCE, severity="error",
       summary="`tensor.to(device)` (or .cuda(), .float(), ...) as a statement: tensors are not moved in place, the result is lost.")
def to_result_discarded(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or not _has_move_statement(src.text):
        return
    index = src.index
    for scope in index.scopes:
        for call in scope.calls:
            if not call.discarded or call.attr not in _MOVES or not call.receiver or "." in call.receiver:
                continue
            bindings = [b for b in scope.bindings if b.target == call.receiver and b.pos <= call.pos]
            if bindings and all(_is_tensor(b, index) for b in bindings):
                yield Finding(
                    f"`{src.snippet(call.node)}` throws its result away: unlike a module's .to(), a tensor's "
                    f".{call.attr}() returns a new tensor and leaves `{call.receiver}` where it was.",
                    fix=f"{call.receiver} = {src.segment(call.node)}",
                    location=src.location(call.node),
                )
