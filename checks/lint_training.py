"""Training-loop rules in source: forgotten `zero_grad`, loss history kept across steps, eval forwards with autograd on."""
from __future__ import annotations

import ast
from typing import Iterator, Optional

from torchdoctor.findings import Finding
from torchdoctor.lint.flow import (
    backprop_names, backward_targets, calls_in, graph_refs, inner_scopes, is_backward, is_optimizer,
)
from torchdoctor.lint.index import CallSite, FunctionScope, Loop, ModuleIndex, ref
from torchdoctor.lint.source import SourceFile, Spanned
from torchdoctor.registry import Scope, check

_LOOP_ORDER = """for x, y in loader:
    optimizer.zero_grad(set_to_none=True)
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()"""
# Calls that take the optimizer but are known not to clear gradients.
_HARMLESS_WITH_OPTIMIZER = frozenset({"step", "unscale_", "update", "scale", "clip_grad_norm_", "print", "log", "info"})


def _stepped_optimizer(call: CallSite, scope: FunctionScope, index: ModuleIndex) -> Optional[str]:
    """The optimizer an argument-free `opt.step()` or `scaler.step(opt)` updates, if that is clear."""
    if call.attr != "step" or call.node.keywords:
        return None
    if not call.node.args and is_optimizer(call.receiver, scope, index):
        return call.receiver
    if len(call.node.args) == 1 and call.receiver and "scaler" in call.receiver.lower():
        key = ref(call.node.args[0])
        return key if is_optimizer(key, scope, index) else None
    return None


def _clears_grads(call: CallSite, optimizer: str, others: set[str]) -> bool:
    """A zero_grad that may clear `optimizer`'s gradients: its own, a model's, or any optimizer not known
    to be a different one (`for opt in optimizers: opt.zero_grad()`)."""
    if call.attr == "zero_grad":
        return call.receiver == optimizer or call.receiver not in others
    return call.attr in ("zero_", "detach_", "fill_", "requires_grad_") and (call.receiver or "").endswith(".grad")


def _helper_may_clear(call: CallSite, optimizer: str, index: ModuleIndex) -> bool:
    """A call in the loop that might zero the gradients where we cannot see it."""
    local = index.functions.get(call.attr)
    if local:
        return any(c.attr in ("zero_grad", "zero_") for s in local for c in s.calls) or any(
            b.target.endswith(".grad") for s in local for b in s.bindings)
    if call.attr in _HARMLESS_WITH_OPTIMIZER:
        return False
    return any(ref(a) == optimizer for a in call.node.args) or any(ref(k.value) == optimizer for k in call.node.keywords)


def _smallest_loop_with_backward(step: CallSite, backwards: list[CallSite]) -> Optional[Loop]:
    loop = step.loop
    while loop is not None:
        if any(loop.encloses(b.loop) for b in backwards):
            return loop
        loop = loop.parent
    return None


@check(code="TD301", name="missing-zero-grad", scope=Scope.SOURCE, severity="error",
       summary="Gradients are never cleared between optimizer steps, so every step adds up all previous ones.")
def missing_zero_grad(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or "backward" not in src.text or ".step(" not in src.text:
        return
    index = src.index
    for scope in index.scopes:
        backwards = [c for c in scope.calls if is_backward(c) and c.loop is not None]
        if not backwards:
            continue
        reported: set[str] = set()
        for call in scope.calls:
            optimizer = _stepped_optimizer(call, scope, index)
            if optimizer is None or optimizer in reported:
                continue
            loop = _smallest_loop_with_backward(call, backwards)
            if loop is None or _loop_clears(loop, optimizer, scope, index):
                continue
            reported.add(optimizer)
            backward = next(b for b in backwards if loop.encloses(b.loop))
            what = "training_step" if isinstance(loop.node, ast.FunctionDef) else f"the loop at line {loop.node.lineno}"
            yield Finding(
                f"`{src.snippet(call.node)}` runs in {what} with `{src.snippet(backward.node)}` "
                f"(line {backward.node.lineno}) but `{optimizer}.zero_grad()` is never called there: every "
                "backward adds to the gradients of all previous iterations, so each step uses their running sum.",
                fix=f"Clear the gradients once per optimizer step, e.g.\n{_LOOP_ORDER}",
                location=src.location(call.node),
            )


def _loop_clears(loop: Loop, optimizer: str, scope: FunctionScope, index: ModuleIndex) -> bool:
    others = {o for c in calls_in(scope, loop) if (o := _stepped_optimizer(c, scope, index)) and o != optimizer}
    for call in calls_in(scope, loop):
        if _clears_grads(call, optimizer, others) or _helper_may_clear(call, optimizer, index):
            return True
        if "autograd.context" in call.qualname or "dist_autograd" in call.qualname:
            return True  # distributed autograd keeps gradients per context: nothing to clear
    if any(b.target.endswith(".grad") and loop.encloses(b.loop) for b in scope.bindings):
        return True
    return any(c.attr in ("zero_grad", "zero_") for s in inner_scopes(index, loop) for c in s.calls)


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


def _leak_finding(src: SourceFile, node: Spanned, target: str, leaked: str, trained: dict) -> Finding:
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
            if model is None or state is None or state[0] != "eval" or call.grad_off or model in reported:
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
