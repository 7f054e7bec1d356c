"""Training-loop rules in source: forgotten `zero_grad`, loss history kept across steps, eval forwards with autograd on."""
from __future__ import annotations

import ast
from typing import Iterator, Optional

from torchdoctor.findings import Finding
from torchdoctor.lint.flow import (
    backprop_names, backward_targets, calls_in, graph_refs, inner_scopes, is_backward, is_optimizer,
)
from torchdoctor.lint.index import CallSite, FunctionScope, Loop, ModuleIndex, ref
from torchdoctor.lint.source import SourceFile
from torchdoctor.registry import Scope, check

@check(code="TD308", name="graph-retention-leak", scope=Scope.SOURCE, severity="error",
       summary="Tensors with autograd history are kept across steps (`total += loss`), so memory grows every step.")
def graph_retention_leak(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or "backward" not in src.text and "training_step" not in src.text:
        return
    for scope in src.index.scopes:
        trained = _trained_names_by_loop(scope)
        if not trained:
            continue
        kept = backprop_names(scope)
        for b in scope.bindings:
            if b.augmented and b.loop is not None and not b.grad_off and b.target not in kept:
                leaked = _leaked_name(b.value, b.loop, b.pos, trained, scope)
                if leaked and not _reset_in_loop(scope, b.target, b.loop, b.node):
                    yield _leak_finding(src, b.node, b.target, leaked, trained)
        for call in scope.calls:
            if call.attr == "append" and call.loop is not None and not call.grad_off and call.receiver \
                    and call.receiver not in kept and len(call.node.args) == 1:
                leaked = _leaked_name(call.node.args[0], call.loop, call.pos, trained, scope)
                if leaked and not _reset_in_loop(scope, call.receiver, call.loop, None):
                    yield _leak_finding(src, call.node, call.receiver, leaked, trained)


def _trained_names_by_loop(scope: FunctionScope) -> dict[str, list[tuple[Loop, ast.AST]]]:
    """name -> [(loop, backward node)] for every name a backward call in a loop differentiates."""
    out: dict[str, list[tuple[Loop, ast.AST]]] = {}
    for call in scope.calls:
        if is_backward(call) and call.loop is not None:
            for target in backward_targets(call):
                for name in graph_refs(target):
                    out.setdefault(name, []).append((call.loop, call.node))
    if scope.class_name and getattr(scope.node, "name", "") == "training_step" and scope.loops:
        for ret in scope.returns:
            for name in graph_refs(ret.value):
                out.setdefault(name, []).append((scope.loops[0], ret))
    return out


def _leaked_name(value: Optional[ast.expr], loop: Loop, pos: tuple, trained: dict,
                 scope: FunctionScope) -> Optional[str]:
    """A name in `value` holding a loss that the same loop back-propagates, still a tensor at `pos`.

    The last assignment of the name in the loop before `pos` decides: `loss = loss.item()` or
    `loss = float(loss)` leaves a number there, and then nothing is kept.
    """
    for name in sorted(graph_refs(value)):
        if not any(loop.encloses(other) or other.encloses(loop) for other, _ in trained.get(name, ())):
            continue
        before = [b for b in scope.bindings
                  if b.target == name and not b.augmented and b.pos < pos and loop.encloses(b.loop)]
        if before and not graph_refs(max(before, key=lambda b: b.pos).value):
            continue
        return name
    return None


def _reset_in_loop(scope: FunctionScope, target: str, loop: Loop, node: Optional[ast.AST]) -> bool:
    """The accumulator is re-initialised inside the same loop, so at most one window of history is kept."""
    return any(b.target == target and not b.augmented and b.node is not node and loop.encloses(b.loop)
               for b in scope.bindings)


def _leak_finding(src: SourceFile, node: ast.AST, target: str, leaked: str, trained: dict) -> Finding:
    backward = trained[leaked][0][1]
    return Finding(
        f"`{src.snippet(node)}` keeps `{leaked}`, which is back-propagated at line {backward.lineno}, with its "
        f"autograd history: `{target}` holds every iteration's graph alive, so memory grows step after step.",
        fix=f"Keep a number, not the graph: `{target} += {leaked}.item()` (or `{leaked}.detach()`).",
        location=src.location(node),
    )


@check(code="TD306", name="eval-without-no-grad", scope=Scope.SOURCE, severity="warning",
       summary="Forwards in eval() mode with autograd still on: eval() does not stop autograd, graphs are built for nothing.")
def eval_without_no_grad(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or ".eval()" not in src.text:
        return
    index = src.index
    frozen = "requires_grad_(False)" in src.text or ".requires_grad = False" in src.text
    for scope in index.scopes:
        if scope.grad_off or frozen or not any(c.attr == "eval" for c in scope.calls):
            continue
        if any(is_backward(c) or c.attr == "set_grad_enabled" for c in scope.calls):
            continue
        if scope.name != "<module>" and not _called_only_with_grad(src, scope):
            continue
        reported: set[str] = set()
        mode: dict[str, tuple[str, CallSite]] = {}
        for call in scope.calls:
            if call.attr in ("eval", "train") and call.receiver and not call.node.keywords:
                off = call.attr == "eval" or (call.node.args and isinstance(call.node.args[0], ast.Constant)
                                              and call.node.args[0].value is False)
                if call.attr == "eval" and call.node.args:
                    continue
                mode[call.receiver] = ("eval" if off else "train", call)
                continue
            model = call.receiver if call.attr == "forward" else ref(call.node.func)
            state = mode.get(model or "")
            if state is None or state[0] != "eval" or call.grad_off or model in reported:
                continue
            reported.add(model)
            yield Finding(
                f"`{src.snippet(call.node)}` runs after `{model}.eval()` (line {state[1].node.lineno}) with autograd "
                "still on, and nothing here is back-propagated: eval() only switches Dropout/BatchNorm, so this "
                "forward records a graph and keeps its activations for nothing.",
                fix="Run evaluation under `with torch.no_grad():` (or `torch.inference_mode()`), or decorate the "
                    "function with `@torch.no_grad()`.",
                location=src.location(call.node),
            )


def _called_only_with_grad(src: SourceFile, scope: FunctionScope) -> bool:
    """The function is called in this file, never under no_grad, and no other linted file names it."""
    method = scope.class_name is not None
    sites = [c for s in src.index.scopes for c in s.calls if c.attr == scope.name
             and isinstance(c.node.func, ast.Attribute if method else ast.Name)]
    if not sites or any(c.grad_off for c in sites):
        return False
    return not src.project.mentioned_elsewhere(scope.name)
