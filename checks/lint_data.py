"""Data rules in source: samplers never re-seeded."""
from __future__ import annotations

import ast
from typing import Iterator, Optional

from torchdoctor.findings import Finding
from torchdoctor.lint.flow import iter_names, literal
from torchdoctor.lint.index import CallSite, FunctionScope, ModuleIndex, last, ref
from torchdoctor.lint.source import SourceFile
from torchdoctor.registry import Scope, check


def _is_loader_call(call: CallSite) -> bool:
    return last(call.qualname).endswith("DataLoader")


def _samplers(index: ModuleIndex) -> Iterator[tuple[FunctionScope, CallSite, Optional[str]]]:
    """DistributedSampler(...) calls that shuffle, with the name they are bound to (None when inline)."""
    for scope in index.scopes:
        bound = {id(b.value): b.target for b in scope.bindings if isinstance(b.value, ast.Call)}
        for call in scope.calls:
            if last(call.qualname).endswith("DistributedSampler") and literal(call.kwarg("shuffle")) is not False:
                yield scope, call, bound.get(id(call.node))


def _loaders_of(scope: FunctionScope, sampler: CallSite, name: Optional[str]) -> list[str]:
    """Names of the DataLoaders fed by this sampler (passed by name or built inline)."""
    out = []
    for b in scope.bindings:
        if isinstance(b.value, ast.Call) and last(ref(b.value.func) or "").endswith("DataLoader"):
            for kw in b.value.keywords:
                if kw.arg in ("sampler", "batch_sampler") and (
                        kw.value is sampler.node or name is not None and ref(kw.value) == name):
                    out.append(b.target)
    return out


def _epoch_loop_line(scope: FunctionScope, loader: str) -> Optional[int]:
    """Line of a loop that goes over `loader` more than once (a nested loop, or a call passing it inside a loop)."""
    for loop in scope.loops:
        node = loop.node
        if isinstance(node, (ast.For, ast.AsyncFor)) and loader in iter_names(node.iter) and loop.parent is not None:
            return loop.parent.node.lineno
    for call in scope.calls:
        if call.loop is not None and any(ref(a) == loader for a in call.node.args) and not _is_loader_call(call):
            return call.loop.node.lineno
    return None


@check(code="TD311", name="sampler-epoch-not-set", scope=Scope.SOURCE, severity="warning",
       summary="A DistributedSampler is used for several epochs without set_epoch(epoch): every epoch sees the same order.")
def sampler_epoch_not_set(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or "DistributedSampler" not in src.text:
        return
    index = src.index
    if any(c.attr == "set_epoch" for c in index.all_calls()):
        return
    if src.project.set_epoch_called_elsewhere():
        return  # the project calls set_epoch in another module; the runtime check confirms it per epoch
    for scope, sampler, name in _samplers(index):
        for loader in _loaders_of(scope, sampler, name):
            line = _epoch_loop_line(scope, loader)
            if line is None:
                continue
            yield Finding(
                f"`{src.snippet(sampler.node)}` feeds `{loader}`, which is read once per epoch (loop at line {line}), "
                "but set_epoch is never called in the linted files: DistributedSampler seeds its shuffle with the "
                "epoch, so every epoch sees the same order.",
                fix=f"At the start of every epoch call `{name or loader + '.sampler'}.set_epoch(epoch)`.",
                location=src.location(sampler.node),
            )
            break
