"""eval-without-no-grad: forwards in eval() mode with autograd on, never back-propagated, build graphs for nothing."""

from __future__ import annotations

import ast
import itertools
from typing import Any, Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall, Severity, byte_size
from torchdoctor.sdk.runtime import ForwardEvent, RuntimeCheck, StepEvent, TransformedForwardEvent, user_frame
from torchdoctor.sdk.source import (
    BACKWARD_METHODS,
    CallSite,
    Effect,
    Fact,
    Function,
    FunctionScope,
    SourceFile,
    backprop_names,
    backward_targets,
    is_backward,
    last,
    literal,
    qualname,
    rebind,
    ref,
)

from ._user_names import name_of, source_line
from ._vmap_graphs import VmapGraphs

_VALIDATION = """
import torch
from torch import nn

model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.1), nn.Linear(8, 3))
val_loader = [(torch.randn(8, 4), torch.randint(0, 3, (8,))) for _ in range(3)]
"""

EVAL_WITHOUT_NO_GRAD = Pitfall(
    code="TD306",
    name="eval-without-no-grad",
    severity="warning",
    summary="Forwards in eval() mode with autograd on that are never back-propagated: eval() does not stop autograd.",
    why="""
        `model.eval()` only switches Dropout and BatchNorm to inference behaviour. Autograd still records a
        graph for every forward and keeps each activation it needs for a backward that never comes, so
        validation uses several times the memory it needs and runs slower.
    """,
    fix="""
        Wrap evaluation in `with torch.no_grad():` or `with torch.inference_mode():`, or decorate the
        evaluation function with `@torch.no_grad()`.
    """,
    bad=Example(
        """
        def evaluate(model, loader):
            model.eval()
            correct = 0
            for x, y in loader:
                correct += (model(x).argmax(1) == y).sum().item()
            return correct

        correct = evaluate(model, val_loader)
        """,
        setup=_VALIDATION,
    ),
    good=Example(
        """
        def evaluate(model, loader):
            model.eval()
            correct = 0
            for x, y in loader:
                with torch.no_grad():
                    correct += (model(x).argmax(1) == y).sum().item()
            return correct

        correct = evaluate(model, val_loader)
        """,
        setup=_VALIDATION,
    ),
    details={
        "source": """
            The lint rule follows `model.eval()` / `model.train()` in statement order inside one function and
            reports the first call of that model after `eval()` that is not under
            `no_grad`/`inference_mode`/`set_grad_enabled(...)`, in a function without any backward, including calls
            of functions that run the model, up to three calls deep (passed as an argument, a closure's free
            variable, or the model's own method: `model.predict(x)` calling `self(x)`). A
            function is only judged when the program model finds its callers in the project (through imports,
            closures and methods, read from disk whichever files were given) and one of them runs it with autograd
            on (the message names that call when another runs it under `no_grad`), and
            when it is not decorated with `torch.no_grad()`/`inference_mode()` or a project wrapper of them (such as
            yolov5's `smart_inference_mode`, or a `functools.wraps` wrapper that calls its target inside
            `with torch.no_grad():`). A function with a decorator the project does not define (and that is not
            known to leave autograd alone, like `functools.lru_cache`) is reported as a note that names the
            decorator: what it does is unknown. A scope that passes `Variable(..., volatile=True)` is left to
            deprecated-api, which reports that line. Models frozen in the file (`m.requires_grad_(False)`, or a loop
            setting `requires_grad = False` over `m.parameters()`), or frozen by a function the model is handed to
            (`freeze(teacher)` in another file), are skipped. `watch` sees the remaining cases at run
            time.
        """,
        "runtime": """
            `watch` looks at each forward of a watched model that runs in `eval()` mode with gradients enabled and
            whose output has a graph. A sentinel hook on the output's `grad_fn` tells whether a backward ever
            reaches it and when the graph is freed. When at least two such forwards were never back-propagated
            (freed without backward, or still alive), it warns once, with the activation memory each forward
            saved for backward. Forwards under `torch.no_grad()` or `torch.inference_mode()` are quiet, and so are
            eval-mode forwards that are back-propagated (fine-tuning with frozen BatchNorm). When backward goes
            through an eval-mode model none of whose parameters is in a watched optimizer, it adds an info note:
            a frozen teacher should be frozen (`requires_grad_(False)`) and run under `no_grad`.
            Inside `torch.func.vmap` (an ensemble from `stack_module_state` called with `functional_call`), where
            forward hooks see only the transform's wrappers, watch reads the tensors the wrapped parameters stand
            for: when autograd is on, only vmap transforms run (no `grad`/`vjp`/`jacrev` differentiating inside),
            and those tensors require grad, a gradient hook on them tells whether a backward ever reaches the
            ensemble. At least two such calls that no backward reached are reported, eval() or not; a trained
            ensemble and an evaluation under `no_grad` are quiet.
        """,
    },
)


class _EvalGraphs:
    """Per model: eval-mode forwards with a graph, and what became of their graphs."""

    def __init__(self) -> None:
        self.live = 0  # graphs alive and not (yet) back-propagated
        self.dropped = 0  # graphs freed without backward
        self.backprop = 0  # graphs that backward went through
        self.forwards = 0


@EVAL_WITHOUT_NO_GRAD.runtime
class EvalWithoutNoGrad(RuntimeCheck):
    """A sentinel on each eval-mode forward's graph tells whether backward ever reached it."""

    min_forwards = 2

    def on_start(self) -> None:
        self.state: dict[str, _EvalGraphs] = {}
        self.reported: set[str] = set()
        self.per_forward: dict[str, int] = {}  # bytes saved for backward by one eval forward, per model
        self.vmapped = VmapGraphs()  # forwards inside torch.func.vmap (checks/_vmap_graphs.py)
        self.fixes: dict[str, Fix] = {}  # per model: the fix for the user's line that ran its first eval forward

    def _fix_for(self, label: str) -> Fix:
        """The fix at the user's line that ran the model's first eval forward (or the general one)."""
        return self.fixes.get(label) or _runtime_fix(None)

    def on_forward(self, event: ForwardEvent) -> Optional[Iterator[Finding]]:
        if event.training or not event.grad_enabled:
            return None
        return self._eval_forward(event)

    def _eval_forward(self, event: ForwardEvent) -> Iterator[Finding]:
        from torchdoctor.sdk.runtime import first_graph_tensor

        out = first_graph_tensor(event.output)
        if out is None:
            return  # no graph: frozen model and inputs without grad
        st = self.state.setdefault(event.model.label, _EvalGraphs())

        def backward() -> None:
            st.backprop += 1
            st.live -= 1

        def freed(reached: bool) -> None:
            if not reached:
                st.live -= 1
                st.dropped += 1

        if event.model.label not in self.fixes:
            self.fixes[event.model.label] = _runtime_fix()
        if self.ctx.graphs.track(out, on_backward=backward, on_free=freed):
            st.live += 1
            st.forwards += 1
            if event.model.label not in self.per_forward:  # measured once: eval graphs differ from training's
                from torchdoctor.sdk.runtime import footprint

                owned = [*event.model.inner.parameters(), *event.model.inner.buffers()]
                self.per_forward[event.model.label] = footprint(out, owned)[1]
        yield from self._verdict(event.model)

    def on_transformed_forward(self, event: TransformedForwardEvent) -> None:
        self.vmapped.saw(event, self.ctx.hooks)

    def on_step_pre(self, event: StepEvent) -> Optional[Iterator[Finding]]:
        if not self.state and not self.vmapped.uses:  # the every-step path: no eval forward with gradients so far
            return None
        return itertools.chain(
            (f for wm in self.ctx.models for f in self._verdict(wm)), self.vmapped.verdict(self.ctx.step)
        )

    def on_stop(self) -> Iterator[Finding]:
        yield from self.vmapped.verdict(self.ctx.step)
        for wm in self.ctx.models:
            yield from self._verdict(wm)

    def _verdict(self, wm: Any) -> Iterator[Finding]:
        st = self.state.get(wm.label)
        if st is None or wm.label in self.reported:
            return
        if st.dropped + st.live >= self.min_forwards and st.backprop == 0:
            self.reported.add(wm.label)
            per = byte_size(self.per_forward.get(wm.label, 0))
            yield Finding(
                f"{wm.label} ran {st.forwards} forward(s) in eval() mode with gradients enabled and none was "
                f"back-propagated: each one records the autograd graph and keeps its activations (about {per} "
                f"per forward) alive for as long as its output is; {st.live} such graph(s) are alive now. "
                "eval() changes Dropout/BatchNorm, it does not turn off autograd.",
                fix=self._fix_for(wm.label),
                location=Location(module=wm.label, step=self.ctx.step),
            )
        elif st.backprop and self.ctx.optimizers and (wm.label + ":teacher") not in self.reported:
            held = self.ctx.optimizer_param_ids()
            if not any(id(p) in held for _, p in wm.named_parameters()):
                self.reported.add(wm.label + ":teacher")
                yield Finding(
                    f"backward() goes through {wm.label}, which runs in eval() mode and has no parameter in any "
                    "optimizer given to watch(): if it is a frozen teacher or reference model, autograd computes "
                    "gradients for it that nobody uses.",
                    fix=Fix(
                        "Freeze it (it then records no graph of its own), and run it under `torch.no_grad()` if "
                        "nothing needs gradients through it",
                        f"{name_of(wm.module, 'teacher', None, wm.inner)}.requires_grad_(False)",
                    ),
                    location=Location(module=wm.label, step=self.ctx.step),
                    severity=Severity.INFO,
                )


def _runtime_fix(frame: Any = False) -> Fix:
    """Turn autograd off around the user's line that ran the eval-mode forward (always safe: that forward is
    never back-propagated); without its source, `@torch.no_grad()` on a function that runs no backward of its
    own, else a `with torch.no_grad():` block to put the evaluation in."""
    if frame is False:
        frame = user_frame(2)
    if frame is not None:
        code = frame.f_code
        at = f"line {frame.f_lineno} of {code.co_filename}"
        line = source_line(frame)
        if line and not line.endswith(":") and _parses(line):  # one whole statement
            return Fix(f"Run {at} without autograd: replace it with", f"with torch.no_grad():\n    {line}")
        if not code.co_name.startswith("<") and "backward" not in code.co_names:
            return Fix(
                f"Put `@torch.no_grad()` on the line above `def {code.co_name}` ({code.co_filename}:"
                f"{code.co_firstlineno}), which runs the forward at {at}",
                "@torch.no_grad()",
            )
    return Fix(
        "Run the evaluation under `with torch.no_grad():` (or `torch.inference_mode()`)",
        "with torch.no_grad():\n    ...",
    )


def _parses(line: str) -> bool:
    try:
        ast.parse(line)
    except SyntaxError:
        return False
    return True


def _source_fix(scope: Any) -> Fix:
    """Decorate the function that evaluates; at module level, wrap the evaluation in a no_grad block."""
    node = getattr(scope, "node", None)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return Fix(
            f"Put `@torch.no_grad()` on the line above `def {node.name}` (line {node.lineno}), or run the "
            "evaluation under `with torch.no_grad():` (or `torch.inference_mode()`)."
        )
    return Fix("Run the evaluation under `with torch.no_grad():` (or `torch.inference_mode()`).")


_GRAD_OFF = ("no_grad", "inference_mode")


def _wraps_in_grad_off_local(fn: Function) -> bool:
    """The function (with its closures) names no_grad/inference_mode other than in a `with`, and returns
    something: it builds a decorator or wrapped callable that runs its target without grad (yolov5's
    `smart_inference_mode()` returning `torch.inference_mode()(fn)`, or a hand-written `functools.wraps` wrapper
    calling its target inside `with torch.no_grad():`)."""
    node, index = fn.scope.node, fn.module.index
    used = withs = 0
    for inner in ast.walk(node):
        if isinstance(inner, (ast.With, ast.AsyncWith)):
            withs += sum(1 for item in inner.items if _names_grad_off(item.context_expr, fn))
        elif isinstance(inner, (ast.Attribute, ast.Name)) and last(qualname(inner, index)) in _GRAD_OFF:
            used += 1
    returns = any(isinstance(n, ast.Return) and n.value is not None for n in ast.walk(node))
    return returns and (used > withs or withs > 0 and _wraps_target_in_grad_off(fn))


def _wraps_target_in_grad_off(fn: Function) -> bool:
    """A nested function (the wrapper a decorator returns) calls a parameter of an enclosing function (the
    decorated target) inside `with torch.no_grad():`."""
    outer = fn.scope.node
    targets = {
        a.arg
        for n in ast.walk(outer)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        for a in n.args.posonlyargs + n.args.args
    }
    for inner in ast.walk(outer):
        if inner is outer or not isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        own = {a.arg for a in inner.args.posonlyargs + inner.args.args + inner.args.kwonlyargs}
        for node in ast.walk(inner):
            if (
                isinstance(node, (ast.With, ast.AsyncWith))
                and any(_names_grad_off(item.context_expr, fn) for item in node.items)
                and any(
                    isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id in targets - own
                    for stmt in node.body
                    for c in ast.walk(stmt)
                )
            ):
                return True
    return False


def _names_grad_off(expr: ast.expr, fn: Function) -> int:
    index = fn.module.index
    return sum(
        1 for n in ast.walk(expr) if isinstance(n, (ast.Attribute, ast.Name)) and last(qualname(n, index)) in _GRAD_OFF
    )


# A function that wraps what it is given in no_grad: a decorator it makes turns autograd off.
GRAD_OFF_WRAPPER = Fact("grad-off-wrapper", _wraps_in_grad_off_local, False)


def _grad_off_local(fn: Function) -> bool:
    """Decorated with no_grad/inference_mode, directly or through a wrapper the project or a library defines."""
    if fn.scope.grad_off:
        return True
    node = fn.scope.node
    if isinstance(node, ast.Module):
        return False
    where = fn.enclosing()
    for d in node.decorator_list:
        wrapper = where.resolve_expr(d.func if isinstance(d, ast.Call) else d)
        if wrapper is not None and wrapper.fact(GRAD_OFF_WRAPPER):
            return True
    return False


# The function runs with autograd off whoever calls it (its decorators say so).
GRAD_OFF = Fact("grad-off", _grad_off_local, False)


def _forwards_local(fn: Function) -> frozenset[Effect]:
    """Names (parameters or free variables) the function calls as models with grad enabled: `m(x)`,
    `m.forward(x)`."""
    if fn.fact(GRAD_OFF):
        return frozenset()
    out = set()
    for call in fn.scope.calls:
        if call.grad_off:
            continue
        if type(call.node.func) is ast.Name:
            out.add(Effect(call.node.func.id))
        elif call.attr == "forward" and call.receiver:
            out.add(Effect(call.receiver))
    return frozenset(out)


def _forwards_through(value: frozenset[Effect], fn: Function, call: CallSite, callee: Function) -> frozenset[Effect]:
    """A callee's forwards count at a call that runs with grad on, into a callee that does not turn it off."""
    if call.grad_off or fn.fact(GRAD_OFF) or callee.fact(GRAD_OFF):
        return frozenset()
    return rebind(value, fn, call, callee)


# The models a function runs forward with grad on (in its callers' names), itself or through its calls.
FORWARDS: Fact[frozenset[Effect]] = Fact(
    "forwards-with-grad", _forwards_local, frozenset(), join=lambda a, b: a | b, through=_forwards_through
)


@EVAL_WITHOUT_NO_GRAD.source
def eval_without_no_grad(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or ".eval()" not in src.text:
        return
    index = src.index
    frozen = _frozen_models(src)
    for scope in index.scopes:
        if scope.grad_off or "eval" not in scope.call_attrs:
            continue
        if "set_grad_enabled" in scope.call_attrs:
            continue
        fed = _feeding_backward(scope) if not BACKWARD_METHODS.isdisjoint(scope.call_attrs) else set()
        if "volatile" in src.text and any(_volatile(c) for c in scope.calls):
            continue  # `Variable(x, volatile=True)`: meant as no-grad inference; deprecated-api reports that line
        reached = _reached_with_grad(src, scope) if scope.name != "<module>" else ""
        if reached is None:
            continue
        reported: set[str] = set()
        unknown: Optional[list[ast.expr]] = None  # decorators not followed (asked at the first finding)
        mode: dict[str, tuple[str, CallSite]] = {}
        for call in scope.calls:
            if call.attr in ("eval", "train") and call.receiver and not call.node.keywords:
                off = call.attr == "eval" or (
                    call.node.args and isinstance(call.node.args[0], ast.Constant) and call.node.args[0].value is False
                )
                if call.attr == "eval" and call.node.args:
                    continue
                mode[call.receiver] = ("eval" if off else "train", call)
                continue
            if call.grad_off or id(call.node) in fed:
                continue  # without grad, or its output is back-propagated (a frozen teacher, a target network)
            for model in _forwarded(src, scope, call, mode):
                if model in reported or model in frozen:
                    continue
                if _frozen_by_helper(src, scope, model):
                    frozen.add(model)
                    continue
                reported.add(model)
                through = "" if ref(call.node.func) == model or call.attr == "forward" else f" (it calls `{model}`)"
                if unknown is None:
                    unknown = src.project.unknown_decorators(scope)
                caveat = (
                    f" This rests on `@{src.snippet(unknown[0])}`, which is not defined in the project and was not "
                    "followed: if it turns autograd off, silence this line."
                    if unknown
                    else ""
                )
                yield Finding(
                    f"`{src.snippet(call.node)}`{through} runs after `{model}.eval()` (line "
                    f"{mode[model][1].node.lineno}) with autograd still on, and nothing here is back-propagated: "
                    "eval() only switches Dropout/BatchNorm, so this forward records a graph and keeps its "
                    "activations for nothing." + reached + caveat,
                    fix=_source_fix(scope),
                    location=src.location(call.node),
                    severity=Severity.INFO if unknown else None,
                )


def _forwarded(
    src: SourceFile, scope: FunctionScope, call: CallSite, mode: dict[str, tuple[str, CallSite]]
) -> Iterator[str]:
    """The eval-mode models this call runs with grad on: directly (`model(x)`, `model.forward(x)`), or through
    a project function that calls one (passed as an argument, or a closure's free variable)."""
    model = call.receiver if call.attr == "forward" else ref(call.node.func)
    if model is not None and mode.get(model, ("",))[0] == "eval":
        yield model
        return
    if not any(state == "eval" for state, _ in mode.values()):
        return
    for effect in sorted(src.project.at_call(scope, call, FORWARDS) or (), key=lambda e: e.receiver):
        if mode.get(effect.receiver, ("",))[0] == "eval":
            yield effect.receiver


def _feeding_backward(scope: FunctionScope) -> set[int]:
    """ids of the expressions whose value reaches a backward of the function (through the names it binds):
    a forward among them is needed for that backward. Empty when the function runs no backward."""
    backwards = [c for c in scope.calls_named(*BACKWARD_METHODS) if is_backward(c)]
    if not backwards:
        return set()
    names = backprop_names(scope)
    roots: list[ast.AST] = [t for c in backwards for t in backward_targets(c)]
    roots += [b.value for b in scope.bindings if b.target in names and b.value is not None]
    return {id(node) for root in roots for node in ast.walk(root)}


def _volatile(call: CallSite) -> bool:
    """`Variable(x, volatile=True)` (any value but a literal False)."""
    flag = call.kwarg("volatile")
    return flag is not None and literal(flag) is not False


def _frozen_models(src: SourceFile) -> set[str]:
    """Models frozen in this file: `m.requires_grad_(False)`, or `p.requires_grad = False` in a loop over
    `m.parameters()` (their forwards record no graph of their own)."""
    if src.tree is None:
        return set()
    calls = list(src.index.all_calls()) if "requires_grad_" in src.text else []
    return _freezing(src.tree, calls, "requires_grad = False" in src.text)


def _freezing(node: ast.AST, calls: list[CallSite], assigns: bool) -> set[str]:
    """The models frozen whole in `node`: `m.requires_grad_(False)` among `calls`, or (when `assigns`)
    `p.requires_grad = False` unconditionally in a loop over `m.parameters()`."""
    frozen = {
        c.receiver
        for c in calls
        if c.attr == "requires_grad_"
        and c.receiver
        and c.node.args
        and isinstance(c.node.args[0], ast.Constant)
        and c.node.args[0].value is False
    }
    for loop in ast.walk(node) if assigns else ():
        if (
            isinstance(loop, ast.For)
            and isinstance(loop.iter, ast.Call)
            and isinstance(loop.iter.func, ast.Attribute)
            and loop.iter.func.attr in ("parameters", "named_parameters")
        ):
            owner = ref(loop.iter.func.value)
            # unconditional, in the loop's own body: `if "bn" in name: p.requires_grad = False` freezes a part
            if owner and any(
                isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Attribute) and t.attr == "requires_grad" for t in n.targets)
                for n in loop.body
            ):
                frozen.add(owner)
    return {name for name in frozen if name}


def _freezes(fn: Function) -> frozenset[Effect]:
    scope = fn.scope
    assigns = any(b.target.endswith(".requires_grad") for b in scope.bindings)
    if not assigns and "requires_grad_" not in scope.call_attrs:
        return frozenset()
    return frozenset(Effect(name) for name in _freezing(scope.node, scope.calls, assigns))


def _passes(call: CallSite, name: str) -> bool:
    """`call` hands `name` (a name or attribute chain) to its callee as a positional argument."""
    if "." not in name:
        return any(type(a) is ast.Name and a.id == name for a in call.node.args)
    return any(type(a) is ast.Attribute and ref(a) == name for a in call.node.args)


# The models a function freezes whole (`freeze(teacher)` in a utils module), itself or through its calls.
FREEZES = Fact.effects("freezes-model", _freezes)


def _frozen_by_helper(src: SourceFile, scope: FunctionScope, model: str) -> bool:
    """A call of the function (or of the module body) hands `model` to a function that freezes it whole."""
    return any(
        any(e.receiver == model for e in src.project.at_call(where, call, FREEZES) or ())
        for where in ((scope,) if scope is src.index.scopes[0] else (scope, src.index.scopes[0]))
        for call in where.calls
        if call.node.args and _passes(call, model)
    )


def _reached_with_grad(src: SourceFile, scope: FunctionScope) -> Optional[str]:
    """None unless the function is not decorated to run without grad and is called somewhere in the project
    (found through imports, closures and methods, whichever files this run was given) with grad on; then what
    the message adds: "" when every caller runs it with grad on, else the call that does (one no_grad caller
    does not excuse another that runs the same evaluation with autograd on)."""
    if src.project.fact(src.project.function(scope), GRAD_OFF):
        return None
    callers = src.project.callers(scope)
    on = [call for caller, call in callers if not _off(src, caller, call) and _runs_with_grad(src, caller, {id(scope)})]
    if not on:
        return None
    if len(on) == len(callers):
        return ""
    call = min(on, key=lambda c: c.pos)
    return (
        f" Another call runs it under no_grad, but `{ast.unparse(call.node)[:60]}` (line {call.node.lineno} of its "
        "file) runs it with autograd on."
    )


def _off(src: SourceFile, caller: Function, call: CallSite) -> bool:
    """The call runs with grad off: under a no_grad block, or in a function decorated to run without grad."""
    off = src.project.fact(caller, GRAD_OFF)
    return call.grad_off or bool(off)


def _runs_with_grad(src: SourceFile, caller: Function, seen: set[int], depth: int = 0) -> bool:
    """Whether a calling function may run with autograd on: module level, a function nothing in the project calls
    (its caller is unknown), or one called with grad on somewhere (a helper that only a `@torch.no_grad()`
    function calls runs without grad, however many calls lie between)."""
    if caller.name == "<module>" or depth >= 3 or id(caller.scope) in seen:
        return True
    seen.add(id(caller.scope))
    callers = src.project.callers(caller.scope)
    return not callers or any(
        not _off(src, up, call) and _runs_with_grad(src, up, seen, depth + 1) for up, call in callers
    )
