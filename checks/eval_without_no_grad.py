"""eval-without-no-grad: forwards in eval() mode with autograd on, never back-propagated, build graphs for nothing."""

from __future__ import annotations

import ast
from typing import Any, Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall, Severity, byte_size
from torchdoctor.sdk.runtime import ForwardEvent, RuntimeCheck, StepEvent, user_frame
from torchdoctor.sdk.source import (
    BACKWARD_METHODS,
    CallSite,
    FunctionScope,
    SourceFile,
    backprop_names,
    backward_targets,
    is_backward,
    literal,
    ref,
)

from ._user_names import name_of, source_line

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
            of project functions that run the model (passed as an argument, or a closure's free variable). A
            function is only judged when the program model finds its callers in the project (through imports,
            closures and methods, read from disk whichever files were given) and one of them runs it with autograd
            on (the message names that call when another runs it under `no_grad`), and
            when it is not decorated with `torch.no_grad()`/`inference_mode()` or a project wrapper of them (such as
            yolov5's `smart_inference_mode`, or a `functools.wraps` wrapper that calls its target inside
            `with torch.no_grad():`). A function with a decorator the project does not define (and that is not
            known to leave autograd alone, like `functools.lru_cache`) is reported as a note that names the
            decorator: what it does is unknown. A scope that passes `Variable(..., volatile=True)` is left to
            deprecated-api, which reports that line. Models frozen in the file (`m.requires_grad_(False)`, or a loop
            setting
            `requires_grad = False` over `m.parameters()`) are skipped. `watch` sees the remaining cases at run
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
        self.fixes: dict[str, Fix] = {}  # per model: the fix for the user's line that ran its first eval forward

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

    def on_step_pre(self, event: StepEvent) -> Optional[Iterator[Finding]]:
        if not self.state:  # the every-step path: no eval forward with gradients so far
            return None
        return (f for wm in self.ctx.models for f in self._verdict(wm))

    def on_stop(self) -> Iterator[Finding]:
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
                fix=self.fixes.get(wm.label) or _runtime_fix(None),
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


def _source_fix(scope: Any) -> str:
    """Decorate the function that evaluates; at module level, wrap the evaluation in a no_grad block."""
    node = getattr(scope, "node", None)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return (
            f"Put `@torch.no_grad()` on the line above `def {node.name}` (line {node.lineno}), or run the "
            "evaluation under `with torch.no_grad():` (or `torch.inference_mode()`)."
        )
    return "Run the evaluation under `with torch.no_grad():` (or `torch.inference_mode()`)."


@EVAL_WITHOUT_NO_GRAD.source
def eval_without_no_grad(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or ".eval()" not in src.text:
        return
    index = src.index
    frozen = _frozen_models(src)
    for scope in index.scopes:
        if scope.grad_off or "eval" not in scope.call_attrs:
            continue
        if any(c.attr == "set_grad_enabled" for c in scope.calls):
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
    found = src.project.callee(scope, call)
    if found is None or found[1].grad_off:
        return
    callee, summary = found
    params = (
        [a.arg for a in callee.node.args.posonlyargs + callee.node.args.args]
        if not isinstance(callee.node, ast.Module)
        else []
    )
    if callee.class_name is not None and params[:1] in (["self"], ["cls"]):
        params = params[1:]
    passed = {p: ref(a) for p, a in zip(params, call.node.args)}
    passed.update({kw.arg: ref(kw.value) for kw in call.node.keywords if kw.arg})
    for name in sorted(summary.forwards):
        model = passed.get(name) if name in params or name in passed else name  # a closure's free variable
        if model is not None and mode.get(model, ("",))[0] == "eval":
            yield model


def _feeding_backward(scope: FunctionScope) -> set[int]:
    """ids of the expressions whose value reaches a backward of the function (through the names it binds):
    a forward among them is needed for that backward. Empty when the function runs no backward."""
    backwards = [c for c in scope.calls if is_backward(c)]
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
    calls = src.index.all_calls() if "requires_grad_" in src.text else ()
    frozen = {
        c.receiver
        for c in calls
        if c.attr == "requires_grad_"
        and c.receiver
        and c.node.args
        and isinstance(c.node.args[0], ast.Constant)
        and c.node.args[0].value is False
    }
    for node in ast.walk(src.tree) if src.tree is not None and "requires_grad = False" in src.text else ():
        if (
            isinstance(node, ast.For)
            and isinstance(node.iter, ast.Call)
            and isinstance(node.iter.func, ast.Attribute)
            and node.iter.func.attr in ("parameters", "named_parameters")
        ):
            owner = ref(node.iter.func.value)
            # unconditional, in the loop's own body: `if "bn" in name: p.requires_grad = False` freezes a part
            if owner and any(
                isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Attribute) and t.attr == "requires_grad" for t in n.targets)
                for n in node.body
            ):
                frozen.add(owner)
    return {name for name in frozen if name}


def _reached_with_grad(src: SourceFile, scope: FunctionScope) -> Optional[str]:
    """None unless the function is not decorated to run without grad and is called somewhere in the project
    (found through imports, closures and methods, whichever files this run was given) with grad on; then what
    the message adds: "" when every caller runs it with grad on, else the call that does (one no_grad caller
    does not excuse another that runs the same evaluation with autograd on)."""
    if src.project.grad_off(scope):
        return None
    callers = src.project.callers(scope)
    on = [call for caller, call, off in callers if not off and _runs_with_grad(src, caller, {id(scope)})]
    if not on:
        return None
    if len(on) == len(callers):
        return ""
    call = min(on, key=lambda c: c.pos)
    return (
        f" Another call runs it under no_grad, but `{ast.unparse(call.node)[:60]}` (line {call.node.lineno} of its "
        "file) runs it with autograd on."
    )


def _runs_with_grad(src: SourceFile, caller: FunctionScope, seen: set[int], depth: int = 0) -> bool:
    """Whether a calling function may run with autograd on: module level, a function nothing in the project calls
    (its caller is unknown), or one called with grad on somewhere (a helper that only a `@torch.no_grad()`
    function calls runs without grad, however many calls lie between)."""
    if caller.name == "<module>" or depth >= 3 or id(caller) in seen:
        return True
    seen.add(id(caller))
    callers = src.project.callers(caller)
    return not callers or any(not off and _runs_with_grad(src, up, seen, depth + 1) for up, _, off in callers)
