"""missing-zero-grad: gradients are never cleared between optimizer steps, so each step applies their sum."""

from __future__ import annotations

import ast
import dataclasses
import functools
import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall, Severity
from torchdoctor.sdk.runtime import ForwardEvent, RuntimeCheck, StepEvent, ZeroGradEvent
from torchdoctor.sdk.source import (
    BACKWARD_METHODS,
    CallSite,
    Effect,
    Fact,
    Function,
    FunctionScope,
    Loop,
    ModuleIndex,
    SourceFile,
    calls_in,
    clears_every_grad,
    enclosing_ifs,
    inner_scopes,
    is_backward,
    is_optimizer,
    is_optimizer_ctor,
    last,
    literal,
    qualname,
    rebind,
    ref,
)

_TINY_LOOP = """
import torch
from torch import nn

model = nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.MSELoss()
loader = [(torch.randn(8, 4), torch.randn(8, 2)) for _ in range(3)]
"""

MISSING_ZERO_GRAD = Pitfall(
    code="TD301",
    name="missing-zero-grad",
    severity="error",
    summary="Gradients are never cleared between optimizer steps, so every step adds up all previous ones.",
    why="""
        `loss.backward()` accumulates into `param.grad`; it does not overwrite it. Without
        `optimizer.zero_grad()` (or `model.zero_grad()`, or `p.grad = None`) once per step, each step uses the
        sum of all gradients so far: the update grows with every iteration and the loss usually explodes
        after a few steps. Gradient accumulation (several backwards, one step, one zero_grad) is legitimate
        and is not flagged.
    """,
    fix="""
        Call `optimizer.zero_grad(set_to_none=True)` once per optimizer step, before the backward of the
        next step.
    """,
    bad=Example(
        """
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        """,
        setup=_TINY_LOOP,
    ),
    good=Example(
        """
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        """,
        setup=_TINY_LOOP,
    ),
    details={
        "runtime": """
            `watch` picks, per optimizer, the smallest parameter that has a gradient and puts a gradient hook
            on it. Just before each backward adds into that parameter, the hook notes whether its `.grad` is
            empty (`None`, after `zero_grad()` with `set_to_none`, or `p.grad = None`) or all zeros
            (`set_to_none=False`, or a manual `p.grad.zero_()`); calls of `zero_grad()` on a watched optimizer
            count too. At the next `optimizer.step()` it reports an error when none of the backwards since the
            previous step started from cleared gradients. Gradient accumulation (several backwards, one step,
            one clear), `model.zero_grad()`, frozen parameters, GANs with two optimizers (the discriminator's
            gradients from the generator's backward are cleared before its own step) and steps skipped by
            `GradScaler` are quiet. The finding names the parameter and the first step where stale gradients
            were applied; later steps add to its count. Without an optimizer (parameters updated by hand,
            `p.data.add_(-lr * p.grad)`), the smallest trainable parameter of each model gets the hook: a
            backward that adds to a gradient left from before the parameter last changed is reported (at the
            next forward, or when the session ends), and accumulation before an update stays quiet.
        """,
        "source": """
            The lint rule looks for the smallest loop (or Lightning `training_step` with manual optimization)
            that contains both a `backward()` and an argument-free `optimizer.step()` /
            `scaler.step(optimizer)`, and reports it when nothing in that loop clears the gradients: no
            `zero_grad()` of that optimizer, of a model or of another optimizer that may hold the same parameters
            (built from the same model, or from sources it cannot see, such as `self.optimizers()`), no
            `p.grad = None`, no function called there (resolved through imports, closures, methods and installed
            libraries) that clears that optimizer's gradients (its own clears, rebound to the loop's names: a
            `clear(optimizerG)` helper does not clear the discriminator's optimizer; one that clears only under
            `if (i + 1) % k == 0` does not clear every step), no helper defined in the file
            that does so, no closure that does so. Optimizers returned by a project function that builds one
            (`solver = make_optimizer(model)`) count as optimizers. A clear counts only for the optimizers whose
            parameters it may touch: `netG.zero_grad()` does not clear an optimizer built from `netD.parameters()`
            (also through param-group lists and attributes set in `__init__`), and a clear that runs only under
            `if (i + 1) % k == 0` while the step runs every iteration is reported (gradient accumulation, where
            the step is periodic too, is not). A call outside the project that receives the optimizer
            (`clip_gradient(optimizer, 5.0)` from a library) is unknown: it is not assumed to clear, the finding
            is a warning and its message names that call. Calls into installed libraries are followed: their
            source is read from site-packages (`loss_scaler(loss, optimizer)` with timm's NativeScaler, which runs
            backward and step but never clears, is reported when the loop does not clear). A loop whose body runs
            once (`for _ in range(1)`, `for x, y in [batch]`, a body that always ends in `break` or `return`)
            steps once: it is judged by the loop around it, if any (a one-batch smoke test is quiet). When the
            optimizer is cleared right after the loop, the author expects one step per pass (a one-batch loader
            built elsewhere): what the loop iterates over is unknown here, so the finding is information, and
            its message names that clear. It stays quiet inside `dist_autograd.context()` loops,
            where gradients live per context. `watch` confirms the rest at run time.
        """,
    },
)

_LOOP_ORDER = """for x, y in loader:
    optimizer.zero_grad(set_to_none=True)
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()"""
_FIX = Fix(title="Clear the gradients once per optimizer step:", code=_LOOP_ORDER)


class _Sentinel:
    """Per optimizer: one small parameter whose gradient tells whether grads were cleared between steps."""

    def __init__(self, param: Any) -> None:
        self.param = weakref.ref(param)
        self.stepped = False  # a step() was seen since the sentinel was chosen
        self.cleared = False  # a zero_grad() or an empty/zero gradient was seen since the last step
        self.backwards = 0  # backward passes into the sentinel since the last step
        self.zero_flags: list[Any] = []  # one-element bool tensors: "grad was all zero before this backward"


class _Manual:
    """Per model of an optimizer-free loop: its smallest trainable parameter and its value sum at the last
    backward."""

    def __init__(self, param: Any, label: str) -> None:
        self.param = weakref.ref(param)
        self.label = label
        self.value: Optional[float] = None
        self.updates = 0  # updates seen that started from cleared gradients


@MISSING_ZERO_GRAD.runtime
class MissingZeroGrad(RuntimeCheck):
    """Before each backward into a sentinel parameter, note whether its .grad was cleared since the last
    step; at the next step, flag when it never was. Accumulation (several backwards, one step) is fine."""

    needs_forward = False  # its forward handler only says what a backward hook found

    def on_start(self) -> None:
        self.sentinels: dict[int, _Sentinel] = {}
        self.manual: list[Finding] = []  # found inside backward (optimizer-free loops), said at the next event
        self.manual_done = False
        if not self.ctx.optimizers:
            for wm in self.ctx.models:
                params = [p for p in wm.inner.parameters() if p.requires_grad and p.is_floating_point()]
                if params:
                    manual = _Manual(min(params, key=lambda p: p.numel()), wm.label)
                    self.ctx.hooks.add(
                        manual.param().register_hook(  # type: ignore[union-attr]
                            lambda grad, m=manual: self._manual_backward(m)
                        )
                    )

    def _manual_backward(self, m: "_Manual") -> None:
        """Runs inside backward, before the gradient is added into the parameter of an optimizer-free loop:
        a gradient left from before the parameter's last change was never cleared."""
        param = m.param()
        if param is None or self.manual_done or self.ctx.optimizers:
            return
        try:
            value = float(param.detach().sum())  # one host sync per backward, in optimizer-free loops only
            grad = param.grad
            cleared = grad is None or not bool(grad.any())
            changed = m.value is not None and value != m.value  # the parameter was updated since the last backward
            m.value = value
            if cleared:
                m.updates += changed
                return
            if changed:  # updated, and the gradient from before the update is still there (accumulation: unchanged)
                self.manual_done = True
                name = self.ctx.param_name(param)
                self.manual.append(
                    Finding(
                        f"{m.label}'s parameters are updated without an optimizer that watch() saw (by hand, or by one "
                        "built out of its sight), and the gradient "
                        f"of {f'`{name}`' if name else 'its smallest parameter'} still held the previous iteration's "
                        "when the next backward added to it: gradients add up across updates, so each update "
                        "applies their running sum.",
                        fix=Fix(
                            title="Clear the gradients after each update:",
                            code="with torch.no_grad():\n"
                            "    for p in model.parameters():\n"
                            "        p -= lr * p.grad\n"
                            "model.zero_grad()",
                        ),
                        location=Location(module=m.label, param=name, step=m.updates),
                    )
                )
        except Exception as exc:  # never break the user's backward
            self.manual_done = True
            self.ctx.fault(self, exc)

    def on_forward(self, event: ForwardEvent) -> Optional[list[Finding]]:
        if not self.manual:
            return None
        found, self.manual = self.manual, []
        return found

    def on_stop(self) -> Optional[list[Finding]]:
        return self.on_forward(None)  # type: ignore[arg-type]

    def on_step_pre(self, event: StepEvent) -> Optional[Iterator[Finding]]:
        s = self.sentinels.get(id(event.optimizer))
        param = s.param() if s is not None else None
        if s is None or param is None:
            self._choose(event)
            return None
        if not s.stepped or s.backwards == 0 or s.cleared:
            return None
        if any(bool(flag) for flag in s.zero_flags):  # a host sync only on this rare path
            return None
        return self._finding(event, param)

    def _finding(self, event: StepEvent, param: Any) -> Iterator[Finding]:
        name = self.ctx.param_name(param)
        shown = f"`{name}`" if name else "a parameter"
        yield Finding(
            f"{event.optimizer.label}.step() applied gradients that still contained those of the previous step: "
            f"the gradient of {shown} was not cleared after the last step() (no zero_grad() was seen), "
            "so gradients add up across steps and the updates grow.",
            fix=_FIX,
            location=Location(param=name, step=event.step),
        )

    def on_step_post(self, event: StepEvent) -> None:
        s = self.sentinels.get(id(event.optimizer))
        if s is not None:
            s.stepped, s.cleared, s.backwards = True, False, 0
            s.zero_flags.clear()

    def on_zero_grad(self, event: ZeroGradEvent) -> None:
        s = self.sentinels.get(id(event.optimizer))
        if s is not None:
            s.cleared = True

    def _choose(self, event: StepEvent) -> None:
        with_grad = sorted(
            (p for p in event.optimizer.params() if p.grad is not None and p.requires_grad), key=lambda p: p.numel()
        )
        if not with_grad:
            return
        # an exactly-zero gradient (a WGAN critic's last bias: D(real).mean() - D(fake).mean() cancels) looks like
        # a cleared one at every step: take the smallest parameter whose gradient is not all zero (once per session)
        param = next(
            (p for p in with_grad[:8] if (g := p.grad) is not None and g.device.type != "meta" and bool(g.any())),
            with_grad[0],
        )
        s = _Sentinel(param)
        self.sentinels[id(event.optimizer)] = s
        self.ctx.hooks.add_observed(functools.partial(self._hook, s))

    def _hook(self, s: _Sentinel) -> Any:
        """The sentinel's gradient hook (installed at the steps the session observes, whose step events judge
        it), or None once the parameter is gone."""
        param = s.param()
        return None if param is None else param.register_hook(lambda grad: self._before_accumulate(s))

    def _before_accumulate(self, s: _Sentinel) -> None:
        """Runs inside backward, just before the gradient is added into ``param.grad`` (at the steps the session
        observes: its step events judge those)."""
        if not self.ctx.observing:
            return
        s.backwards += 1
        param = s.param()
        if s.cleared or param is None:
            return
        try:
            if param.grad is None:
                s.cleared = True
            elif len(s.zero_flags) < 8:
                s.zero_flags.append((param.grad == 0).all())
        except Exception as exc:  # never break the user's backward: give up on this sentinel
            s.cleared = True
            self.ctx.fault(self, exc)


# Calls that take the optimizer but are known not to clear gradients.
_HARMLESS_WITH_OPTIMIZER = frozenset({"step", "unscale_", "update", "scale", "clip_grad_norm_", "print", "log", "info"})


def _periodic(test: ast.expr) -> bool:
    """A condition on a remainder (`(i + 1) % k == 0`, `step % log_every`): true every k-th iteration."""
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in ast.walk(test))


def _runs_backward(fn: Function) -> bool:
    return not BACKWARD_METHODS.isdisjoint(fn.scope.call_attrs)


def _steps(fn: Function) -> frozenset[Effect]:
    """The optimizers the function steps (`opt.step()`, `scaler.step(opt)`), under its `% k` conditions."""
    out = set()
    for call in fn.scope.calls_named("step"):
        if call.node.keywords:
            continue
        args = call.node.args
        stepped = (
            call.receiver
            if not args
            else ref(args[0])
            if len(args) == 1 and "scaler" in (call.receiver or "").lower()
            else None
        )
        if stepped:
            out.add(Effect(stepped, _condition(fn, call)))
    return frozenset(out)


_ZEROING = frozenset({"zero_grad", "zero_"})


def _clears(fn: Function) -> frozenset[Effect]:
    """Whose gradients the function clears: `x.zero_grad()` clears x's; `p.grad = None` or `p.grad.zero_()`
    of a loop variable clears parameters no name says ("?"); one named parameter (`model.head.weight.grad`)
    clears nothing whole."""
    scope = fn.scope
    out = set()
    for call in scope.calls_named(*_ZEROING):
        if call.attr == "zero_grad":
            out.add(Effect(call.receiver or "?", _condition(fn, call)))
        elif call.attr == "zero_" and clears_every_grad(call.receiver):
            out.add(Effect("?", _condition(fn, call)))
    for b in scope.bindings:
        if clears_every_grad(b.target):
            out.add(Effect("?", fn.condition(b.node, _periodic)))
    return frozenset(out)


def _condition(fn: Function, call: CallSite) -> str:
    """The `% k` tests of the `if`s around `call` in `fn` (see `Function.condition`): none, found without a
    descent from the top, for a call that is a statement of its loop's own body, in loops that are statements of
    the body around them (the commonest place of a step or a clear)."""
    node, loop, top = call.node, call.loop, fn.scope.node.body
    if _is_statement_of(call, getattr(loop.node, "body", ()) if loop is not None else top):
        # (`in` finds a statement by identity: ast nodes compare by identity)
        while loop is not None and loop.node in (
            getattr(loop.parent.node, "body", ()) if loop.parent is not None else top
        ):
            loop = loop.parent
        if loop is None:
            return ""
    return fn.condition(node, _periodic)


def _is_statement_of(call: CallSite, body: Iterable[ast.stmt]) -> bool:
    """The call is a whole statement of `body` itself (not of a block nested in it): no `if` of `body` guards it.
    Only a discarded call is the value of an expression statement: no other is looked for."""
    if not call.discarded:
        return False
    node = call.node
    for s in body:
        if type(s) is ast.Expr and s.value is node:
            return True
    return False


def _returns_optimizer(fn: Function) -> bool:
    """A `return` gives back a torch optimizer built here (`torch.optim.X(...)`, directly or through a local
    name) or by a function it calls (followed through returned calls only)."""
    scope, index = fn.scope, fn.module.index
    for ret in scope.returns:
        values = [ret.value] if ret.value is not None else []
        if isinstance(ret.value, ast.Name):
            values += [b.value for b in scope.bindings_of(ret.value.id) if b.value is not None]
        for value in values:
            if is_optimizer_ctor(value, index):
                return True
            call = next((c for c in scope.calls if c.node is value), None)
            callee = fn.resolve(call) if call is not None and fn.depth < 3 else None
            if callee is not None and callee.scope is not scope and callee.fact(RETURNS_OPTIMIZER):
                return True
    return False


# The facts this rule asks of the functions a training loop calls.
RUNS_BACKWARD = Fact.any("runs-backward", _runs_backward)
# Steps are followed into the functions a helper calls only until one is found (a helper stepping one optimizer
# itself and another in a sub-helper is judged on the first: fewer findings, never a false one), which spares
# resolving every call of every training helper.
STEPS = dataclasses.replace(
    Fact.effects("steps-optimizer", _steps, guard=_periodic), final=lambda effects: bool(effects)
)
CLEARS = Fact.effects("clears-gradients", _clears, guard=_periodic)
RETURNS_OPTIMIZER = Fact("returns-optimizer", _returns_optimizer, False)


def _callee_effects(
    src: SourceFile,
    caller: Optional[Function],
    call: CallSite,
    callee: Optional[Function],
    fact: Fact[frozenset[Effect]],
) -> Optional[frozenset[Effect]]:
    """What `callee`, the function `call` (of `caller`, as `src.project.function` gives it: asked once by the
    callers) runs, touches, in the caller's names, with the callee's own path conditions (the call's place in the
    loop is judged by the caller); None when the call is unknown."""
    if callee is None or caller is None:
        return None
    return rebind(src.project.fact(callee, fact) or frozenset(), caller, call, callee)


def _may_clear(receiver: str, optimizer: str, scope: FunctionScope, index: ModuleIndex) -> bool:
    """Clearing `receiver`'s gradients may clear `optimizer`'s: the optimizer itself, something no name says,
    another optimizer not known to hold other parameters, a model the optimizer's parameters may come from."""
    if receiver in ("?", optimizer):
        return True
    if is_optimizer(receiver, scope, index):
        return _may_share_parameters(scope, index, receiver, optimizer)
    sources = _parameter_sources(scope, index, optimizer)
    return sources is None or any(_related(receiver, source) for source in sources)


def _stepped_optimizer(
    call: CallSite, scope: FunctionScope, index: ModuleIndex, src: Optional[SourceFile] = None
) -> Optional[str]:
    """The optimizer an argument-free `opt.step()` or `scaler.step(opt)` updates, if that is clear."""
    if call.attr != "step" or call.node.keywords:
        return None
    if not call.node.args and (is_optimizer(call.receiver, scope, index) or _made_by_helper(src, scope, call.receiver)):
        return call.receiver
    if len(call.node.args) == 1 and call.receiver and "scaler" in call.receiver.lower():
        key = ref(call.node.args[0])
        return key if is_optimizer(key, scope, index) else None
    return None


def _steps_in_helpers(
    src: SourceFile, scope: FunctionScope, index: ModuleIndex, reported: set[str], candidates: list[CallSite]
) -> Iterator[Finding]:
    """A project function called in a loop runs backward and steps an optimizer passed to it
    (`train_step(model, batch, optimizer)`, `loss_scaler(loss, optimizer)`), and nothing clears its gradients.
    `candidates`: the calls of `scope` that may be such a call (see `_candidates`)."""
    known: dict[Optional[str], bool] = {None: False}  # name -> names an optimizer (asked once per scope)

    def optimizer_arg(arg: ast.expr) -> bool:
        key = ref(arg)
        if key not in known:
            known[key] = is_optimizer(key, scope, index) or _made_by_helper(src, scope, key)
        return known[key]

    seen: Optional[Loop] = None  # the loop of the previous candidate (most share one) and its repeating loop
    loop: Optional[Loop] = None
    for call in candidates:
        if call.loop is not seen:
            seen, loop = call.loop, _repeating(call.loop)
        if loop is None:
            continue  # a loop that runs once: one step, nothing left from before it
        callee = src.project.callee(scope, call)  # first: cheaper than the arguments' question, and memoised
        if callee is None or not src.project.fact(callee, RUNS_BACKWARD):
            continue
        same_instance = isinstance(call.node.func, ast.Attribute) and ref(call.node.func.value) == "self"
        if (
            not same_instance
            and not any(optimizer_arg(a) for a in call.node.args)
            and not any(optimizer_arg(k.value) for k in call.node.keywords)
        ):
            continue
        caller = src.project.function(scope)
        steps = _callee_effects(src, caller, call, callee, STEPS) or frozenset()
        own: Optional[frozenset[Effect]] = None  # what the helper's own body clears (the commonest answer)
        clears: Optional[frozenset[Effect]] = None  # and through its calls: asked only when its body does not
        for step in sorted(steps, key=lambda e: e.receiver):
            optimizer = step.receiver
            if optimizer in reported or not (
                is_optimizer(optimizer, scope, index) or _made_by_helper(src, scope, optimizer)
            ):
                continue
            if own is None and caller is not None:  # (a library function not parsed: its kept CLEARS says it all)
                own = rebind(_clears(callee), caller, call, callee) if not callee.pending else frozenset()
            mine = [c for c in own or () if _may_clear(c.receiver, optimizer, scope, index)]
            if any(not c.condition or step.condition for c in mine):
                continue  # the helper clears them itself (every step, or with its accumulation window)
            if clears is None:
                clears = _callee_effects(src, caller, call, callee, CLEARS) or frozenset()
            mine = [c for c in clears if _may_clear(c.receiver, optimizer, scope, index)]
            if any(not c.condition or step.condition for c in mine):
                continue  # ... or through a function it calls
            verdict = _loop_clears(src, loop, optimizer, scope, index, step=call.node)
            if verdict:
                continue
            if mine and verdict.every_kth is None:
                verdict.every_kth = (call, mine[0].condition, f"in `{mine[0].via[0]}`" if mine[0].via else "")
            reported.add(optimizer)
            yield Finding(
                f"`{src.snippet(call.node)}` runs backward and `{optimizer}.step()` (in `{callee.name}`) in the loop "
                f"at line {loop.node.lineno}, but `{optimizer}.zero_grad()` is never called there: every "
                "backward adds to the gradients of all previous iterations, so each step uses their running sum."
                + verdict.caveat(src, optimizer),
                fix=_FIX,
                location=src.location(call.node),
                severity=verdict.severity(),
            )


def _candidates(scope: FunctionScope, index: ModuleIndex) -> list[CallSite]:
    """The calls in a loop, with arguments, that may run a project function running a backward (most calls are
    not; see `_may_run_backward`): tested inline, in one comprehension, as this runs over every call of every
    function with a loop. (A call site's receiver is a plain name only for `name.f(...)`, and None for `f(...)`.)"""
    names, methods, modules = _may_run_backward(index)
    return [
        c
        for c in scope.calls
        if c.loop is not None
        and ((node := c.node).args or node.keywords)
        and (
            (methods is None or c.attr in methods)
            if (receiver := c.receiver) == "self" or receiver == "cls"
            else receiver in modules
            or receiver is None
            and type(func := node.func) is ast.Name
            and (names is None or func.id in names)
        )
    ]


def _may_run_backward(index: ModuleIndex) -> tuple[Optional[frozenset[str]], Optional[frozenset[str]], frozenset[str]]:
    """Which calls may run a project function that itself runs a backward, as three sets of names (worked out
    once per module): `f(...)` when `f` names a function of this file that calls a backward, a name this file
    imports (the program model follows it) or an instance of an imported class (its `__call__`), any `f(...)`
    when a function of this file named `__call__` runs one (None: all names); `self.f(...)`/`cls.f(...)` when `f`
    is such a function of this file, any when a class here inherits from a base of another file (None); `x.f(...)`
    when `x` is imported, unless as (a module of) one of `_LIBRARIES`. Nothing else is resolved."""
    question = ("callees that may run backward",)
    found = index.memo.get(question)
    if found is None:
        here = frozenset([s.name for s in index.scopes[1:] if not BACKWARD_METHODS.isdisjoint(s.call_attrs)])
        imported = frozenset(index.imported)
        aliases = index.aliases
        found = index.memo[question] = (
            None if "__call__" in here else here | imported | _instances(index),
            None if _inherits_from_project(index) else here,
            frozenset(
                [m for m in imported if (alias := aliases.get(m)) is None or alias.split(".", 1)[0] not in _LIBRARIES]
            ),
        )
    return found


# Libraries whose functions the program model never follows (`torch.zeros(...)`, `np.mean(...)`): a call
# through a module alias of one (`torch`, `F` for torch.nn.functional) runs no project function.
_LIBRARIES = frozenset({"torch", "torchvision", "numpy"})
_LIBRARY_PREFIXES = tuple(f"{name}." for name in sorted(_LIBRARIES))


def _instances(index: ModuleIndex) -> frozenset[str]:
    """Names bound to an instance of an imported class (`loss_scaler = NativeScaler()`): calling one runs its
    `__call__`, which the program model follows into the project or the installed library."""
    classes = frozenset([n for n in index.imported if n[:1].isupper()])
    if not classes:
        return classes
    call, name = ast.Call, ast.Name
    return frozenset(
        [
            b.target
            for s in _may_call_classes(index, classes)
            for b in s.bindings
            if type(value := b.value) is call and type(func := value.func) is name and func.id in classes
        ]
    )


def _may_call_classes(index: ModuleIndex, classes: frozenset[str]) -> list[FunctionScope]:
    """The functions that may call one of `classes` by its name: a binding's value `C(...)` is a call of the
    function holding the binding, recorded under the last name of what `C` meant at that point of the file (`C`
    itself, or what an import binding `C` named). When every import is at the top level, those are known, and
    only the functions calling one of them by that name are kept (most call none); else all of them."""
    scopes = index.scopes
    body = scopes[0].node.body
    top = [stmt for stmt in body if type(stmt) in _IMPORTS]
    if len(top) != index.imports:
        return scopes
    called = set(classes)
    for stmt in top:
        for a in stmt.names:  # type: ignore[attr-defined]  # (an Import or ImportFrom)
            if a.asname in classes:  # `import a as C` / `from a import B as C`
                called.add(last(a.name))
    return [s for s in scopes if not s.call_attrs.isdisjoint(called)]


_IMPORTS = frozenset({ast.Import, ast.ImportFrom})


def _inherits_from_project(index: ModuleIndex) -> bool:
    """Whether a class of this file has a base that may be a project class of another file (not torch's, not a
    builtin): its methods may run what that base defines."""
    question = ("inherits from the project",)
    found = index.memo.get(question)
    if found is None:
        found = index.memo[question] = any(
            not base.startswith(("torch.", "lightning.", "pytorch_lightning.", "typing.", "abc.", "enum."))
            and base not in _BUILTIN_BASES
            and base not in index.classes
            for bases in index.classes.values()
            for base in bases
        )
    return found


_BUILTIN_BASES = frozenset(
    {
        "object",
        "Exception",
        "dict",
        "list",
        "tuple",
        "str",
        "int",
        "float",
        "type",
        "NamedTuple",
        "TypedDict",
        "Protocol",
        "Generic",
        "ABC",
        "Enum",
    }
)


def _may_call_project(func: ast.expr) -> bool:
    """Whether a callee has a shape the program model resolves to a project function: `f(...)` or `x.f(...)`."""
    return type(func) is ast.Name or type(func) is ast.Attribute and type(func.value) is ast.Name


def _made_by_helper(src: Optional[SourceFile], scope: FunctionScope, key: Optional[str]) -> bool:
    """`key` is bound (only) to what a project function returns, and that function builds an optimizer
    (`solver = make_optimizer(cfg, model)`, in this file or an imported one)."""
    if src is None or key is None or "." in key:
        return False
    bound = scope.bindings_of(key)
    if len(bound) != 1 or type(bound[0].value) is not ast.Call:
        return False
    value = bound[0].value
    func = value.func
    if not _may_call_project(func) or qualname(func, src.index).startswith(_LIBRARY_PREFIXES):
        return False  # `x.to(device)`, `f()(...)`, `nn.Linear(...)`: not a call of a project function by name
    call = next((c for c in scope.calls if c.node is value), None)
    if call is None:
        return False
    returns = src.project.fact(src.project.callee(scope, call), RETURNS_OPTIMIZER)
    return bool(returns)


# The calls that may clear gradients: `x.zero_grad()`; `p.grad.zero_()` (or `detach_`, `fill_`, `requires_grad_`).
_CLEARING = frozenset({"zero_grad", "zero_", "detach_", "fill_", "requires_grad_"})


def _clears_grads(call: CallSite, optimizer: str, loop: Loop, scope: FunctionScope, index: ModuleIndex) -> bool:
    """A zero_grad (a call in `loop`) that may clear `optimizer`'s gradients: its own; another
    optimizer's or a model's unless they are known to hold other parameters (`netG.zero_grad()` does not clear
    an optimizer built from `netD.parameters()`, nor does that of another optimizer the loop steps); any
    optimizer not known to be a different one (`for opt in optimizers: opt.zero_grad()`)."""
    if call.attr == "zero_grad":
        receiver = call.receiver
        if receiver == optimizer:
            return True
        if receiver is None or any(
            loop.encloses(c.loop)
            and _stepped_optimizer(c, scope, index) == receiver
            and not _may_share_parameters(scope, index, receiver, optimizer)
            for c in scope.calls_named("step")
        ):
            return False
        if is_optimizer(receiver, scope, index):
            return _may_share_parameters(scope, index, receiver, optimizer)
        sources = _parameter_sources(scope, index, optimizer)
        return sources is None or any(_related(receiver, source) for source in sources)
    return call.attr in _CLEARING and clears_every_grad(call.receiver)


def _related(a: str, b: str) -> bool:
    """The same model, or one a part of the other (`model` and `model.head`)."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _parameter_sources(scope: FunctionScope, index: ModuleIndex, optimizer: str) -> Optional[frozenset[str]]:
    """The models an optimizer was built from (`SGD(model.parameters())` -> {model}; `Adam([{"params":
    a.parameters()}, {"params": b.parameters()}])` or `chain(a.parameters(), b.parameters())` -> {a, b});
    an attribute's binding is looked for in every function of the file. None when unknown (asked once per
    module, or per function for a plain name)."""
    question = ("parameter sources", optimizer) if "." in optimizer else ("parameter sources", id(scope), optimizer)
    found = index.memo.get(question, ...)
    if found is ...:
        found = index.memo[question] = _built_from(index.scopes if "." in optimizer else [scope], optimizer)
    return found


def _built_from(scopes: list[FunctionScope], optimizer: str) -> Optional[frozenset[str]]:
    """The models the one binding of `optimizer` in `scopes` builds it from (see `_parameter_sources`)."""
    built = [b.value for s in scopes for b in s.bindings if b.target == optimizer and b.value is not None]
    if len(built) != 1 or not isinstance(built[0], ast.Call) or not (built[0].args or built[0].keywords):
        return None
    first = built[0].args[0] if built[0].args else next((k.value for k in built[0].keywords if k.arg == "params"), None)
    if first is None or isinstance(first, ast.Name):
        return None  # parameters gathered elsewhere: unknown
    if (
        type(first) is ast.Call
        and type(first.func) is ast.Attribute
        and first.func.attr in ("parameters", "named_parameters")
        and not first.args
        and not first.keywords
    ):  # `model.parameters()`, the commonest: below, nothing but the owner (a name chain when `ref` names it)
        owner = ref(first.func.value)
        return frozenset([owner]) if owner is not None else None
    found: set[str] = set()
    for node in ast.walk(first):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("parameters", "named_parameters")
        ):
            owner = ref(node.func.value)
            if owner is None:
                return None
            found.add(owner)
        leaves = (
            node.elts
            if isinstance(node, (ast.List, ast.Tuple))
            else node.values
            if isinstance(node, ast.Dict)
            else node.args
            if isinstance(node, ast.Call)
            else []
        )
        if any(isinstance(leaf, (ast.Name, ast.Attribute)) for leaf in leaves):
            return None  # `[{"params": head_params}, ...]`, `chain(a.parameters(), extra)`: partly unknown
    return frozenset(found) or None


def _may_share_parameters(scope: FunctionScope, index: ModuleIndex, a: str, b: str) -> bool:
    """Two optimizers not known to hold different parameters (one's zero_grad may clear the other's)."""
    first, second = _parameter_sources(scope, index, a), _parameter_sources(scope, index, b)
    if first is None or second is None:
        return True
    return any(_related(x, y) for x in first for y in second)


def _helper_clears(call: CallSite, index: ModuleIndex) -> bool:
    """A function of this file with the called name clears gradients (a helper the program model did not resolve,
    e.g. `self.reset()` of another class)."""
    local = index.functions.get(call.attr) or []
    return bool(local) and (
        any(c.attr in _ZEROING for s in local for c in s.calls)
        or any(clears_every_grad(b.target) for s in local for b in s.bindings)
    )


def _smallest_loop_with_backward(step: CallSite, backwards: list[CallSite]) -> Optional[Loop]:
    loop = step.loop
    while loop is not None:
        if any(loop.encloses(b.loop) for b in backwards):
            return _repeating(loop)
        loop = loop.parent
    return None


def _repeating(loop: Optional[Loop]) -> Optional[Loop]:
    """`loop`, or the nearest loop around it that may run more than once: a loop whose body runs once (`for _ in
    range(1)`, `for x, y in [batch]`, a body that always ends in `break` or `return`) steps once, so it adds
    nothing to gradients left from before; the loop around it, if any, is where steps repeat."""
    while loop is not None and _runs_once(loop.node):
        loop = loop.parent
    return loop


def _runs_once(node: ast.AST) -> bool:
    """The loop's body runs at most once: it iterates over `range(1)` or a one-element literal, or its body
    ends in an unconditional `break`/`return`/`raise` and never `continue`s (a `continue` could go round again).
    (Node types tested exactly: `ast.parse` makes no subclasses.)"""
    kind = type(node)
    if kind is ast.For or kind is ast.AsyncFor:
        it = node.iter  # type: ignore[attr-defined]
        of = type(it)
        if (of is ast.List or of is ast.Tuple) and len(it.elts) == 1 and type(it.elts[0]) is not ast.Starred:
            return True
        if (
            of is ast.Call
            and type(it.func) is ast.Name
            and it.func.id == "range"
            and not it.keywords
            and it.args
            and type(it.args[-1]) is ast.Constant  # (a last argument that is no literal is no 1)
            and [literal(a) for a in it.args] in ([1], [0, 1])
        ):
            return True
    elif kind is not ast.While:
        return False
    body = node.body  # type: ignore[attr-defined]
    return bool(body) and type(body[-1]) in _EXITS and not _continues(body)


_EXITS = frozenset({ast.Break, ast.Return, ast.Raise})


def _continues(body: list[ast.stmt]) -> bool:
    """A `continue` of this loop in `body` (those of loops nested in it, and of nested functions, are theirs)."""
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Continue):
            return True
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            stack.extend(node.orelse)  # the `else` of an inner loop belongs to this one
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)) or isinstance(
            node, ast.expr
        ):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return False


@MISSING_ZERO_GRAD.source
def missing_zero_grad(src: SourceFile) -> Iterator[Finding]:
    if (
        src.tree is None
        or ("backward" not in src.text or ".step(" not in src.text)
        and "opt" not in src.text
        and not ("self." in src.text and _inherits_from_project(src.index))
    ):
        return  # neither a backward and a step here, nor an optimizer that a helper (or a base class) might step
    index = src.index
    for scope in index.scopes:
        if not scope.loops:  # a call in a loop (a backward, a helper's) needs a loop in its function
            continue
        reported: set[str] = set()
        candidates = _candidates(scope, index)
        if candidates:
            yield from _steps_in_helpers(src, scope, index, reported, candidates)
        if "step" not in scope.call_attrs:
            continue
        backwards = [c for c in scope.calls_named(*BACKWARD_METHODS) if c.loop is not None and is_backward(c)]
        for call in scope.calls_named("step"):
            optimizer = _stepped_optimizer(call, scope, index, src)
            if optimizer is None or optimizer in reported:
                continue
            loop = _smallest_loop_with_backward(call, backwards)
            if loop is None:
                continue
            verdict = _loop_clears(src, loop, optimizer, scope, index, step=call.node)
            if verdict:
                continue
            reported.add(optimizer)
            backward = next(b for b in backwards if loop.encloses(b.loop))
            what = "training_step" if isinstance(loop.node, ast.FunctionDef) else f"the loop at line {loop.node.lineno}"
            never = "is never called there" if verdict.every_kth is None else "does not run before every step"
            yield Finding(
                f"`{src.snippet(call.node)}` runs in {what} with `{src.snippet(backward.node)}` "
                f"(line {backward.node.lineno}) but `{optimizer}.zero_grad()` {never}: every "
                "backward adds to the gradients of all previous iterations, so each step uses their running sum."
                + verdict.caveat(src, optimizer),
                fix=_FIX,
                location=src.location(call.node),
                severity=verdict.severity(),
            )


@dataclass
class _Verdict:
    """Whether a loop clears an optimizer's gradients before each step, and what a "no" rests on."""

    cleared: bool
    # a clear that runs only under `if i % k == 0`: the call, the condition, where the condition is ("" = here)
    every_kth: Optional[tuple[CallSite, str, str]] = None
    unknown: Optional[CallSite] = None  # a call outside the project that receives the optimizer (not followed)
    after: Optional[CallSite] = None  # a clear right after the loop: the author clears once per pass over it

    def __bool__(self) -> bool:
        return self.cleared

    def severity(self) -> Optional[Severity]:
        """A clear after the loop says the author expects one step per pass (a one-batch loader): what the loop
        holds is unknown here, so the finding is information; an unknown call makes it a warning."""
        if self.after is not None:
            return Severity.INFO
        return Severity.WARNING if self.unknown is not None else None

    def caveat(self, src: SourceFile, optimizer: str) -> str:
        """What the message adds about the clears the loop has but that do not count."""
        out = ""
        if self.every_kth is not None:
            clear, condition, where = self.every_kth
            out += (
                f" `{src.snippet(clear.node)}` (line {clear.node.lineno}) runs only when "
                f"`{condition}`{' ' + where if where else ''}, while the step runs every iteration: the steps "
                "between clears apply the running sum."
            )
        if self.unknown is not None:
            out += (
                f" `{src.snippet(self.unknown.node)}` receives `{optimizer}` but is not defined in the project, "
                "so it was not followed: if it clears the gradients, silence this line."
            )
        if self.after is not None:
            out += (
                f" `{src.snippet(self.after.node)}` (line {self.after.node.lineno}) clears them only after the loop:"
                " right if the loop runs once (a one-batch loader), otherwise move it into the loop."
            )
        return out


def _loop_clears(
    src: SourceFile,
    loop: Loop,
    optimizer: str,
    scope: FunctionScope,
    index: ModuleIndex,
    step: Optional[ast.Call] = None,
) -> _Verdict:
    """Whether something in `loop` clears `optimizer`'s gradients once per `step` (the call that steps it): a
    clear that runs only every k-th iteration while the step runs every one does not count, and a call outside
    the project is unknown: it neither clears nor steps anything (the verdict names it)."""
    verdict = _Verdict(False)

    def counts(clear: CallSite) -> bool:
        guard = _only_every_kth(loop, clear, step) if step is not None else None
        if guard is not None:
            verdict.every_kth = verdict.every_kth or (clear, src.snippet(guard.test), "")
            return False
        return True

    # First what the loop itself clears: the commonest answer, and it asks nothing of other files (nor of the
    # loop's other calls, which are gathered only after it).
    for call in [c for c in scope.calls_named(*_CLEARING) if loop.encloses(c.loop)]:
        if _clears_grads(call, optimizer, loop, scope, index) and counts(call):
            return _Verdict(True)
    calls = calls_in(scope, loop)
    step_periodic: Optional[bool] = None
    caller: Optional[Function] = None  # asked at the first call that runs a known function
    for call in calls:
        effects = None
        if call.attr not in _HARMLESS_WITH_OPTIMIZER:
            callee = src.project.callee(scope, call)
            if callee is not None and caller is None:
                caller = src.project.function(scope)
            effects = _callee_effects(src, caller, call, callee, CLEARS)
        if effects is not None:  # a known function: its declared fact says whose gradients it clears, and when
            mine = [e for e in effects if _may_clear(e.receiver, optimizer, scope, index)]
            if mine and step_periodic is None:
                step_periodic = step is not None and any(_periodic(g.test) for g in enclosing_ifs(_body(loop), step))
            if any(not e.condition or step_periodic for e in mine) and counts(call):
                return _Verdict(True)
            if mine and verdict.every_kth is None:
                verdict.every_kth = (call, mine[0].condition, f"in `{mine[0].via[0]}`" if mine[0].via else "")
        elif _helper_clears(call, index) and counts(call):
            return _Verdict(True)
        elif verdict.unknown is None and _receives(call, optimizer) and call.attr not in _HARMLESS_WITH_OPTIMIZER:
            verdict.unknown = call
        if "autograd.context" in call.qualname or "dist_autograd" in call.qualname:
            return _Verdict(True)  # distributed autograd keeps gradients per context: nothing to clear
    if any(clears_every_grad(b.target) and loop.encloses(b.loop) for b in scope.bindings):
        return _Verdict(True)
    if any(c.attr in _ZEROING for s in inner_scopes(index, loop) for c in s.calls):
        return _Verdict(True)
    verdict.after = _cleared_after(loop, optimizer, scope, index)
    return verdict


def _cleared_after(loop: Loop, optimizer: str, scope: FunctionScope, index: ModuleIndex) -> Optional[CallSite]:
    """A clear of `optimizer`'s gradients that runs after `loop` ends, once per run of what holds the loop (the
    same enclosing loop, not under an `if`): one clear per pass over the loop."""
    if not isinstance(loop.node, (ast.For, ast.AsyncFor, ast.While)):
        return None
    end = (getattr(loop.node, "end_lineno", None) or loop.node.lineno, 1 << 30)
    for call in scope.calls_named("zero_grad"):
        if (
            call.loop is loop.parent
            and call.pos > end
            and call.receiver == optimizer
            and not enclosing_ifs(_body(loop.parent) if loop.parent is not None else _function_body(scope), call.node)
        ):
            return call
    return None


def _function_body(scope: FunctionScope) -> list[ast.stmt]:
    return list(getattr(scope.node, "body", []))


def _body(loop: Loop) -> list[ast.stmt]:
    """The statements of a loop (a framework step method's body for a `training_step` loop)."""
    return list(getattr(loop.node, "body", []))


def _only_every_kth(loop: Loop, clear: CallSite, step: ast.Call) -> Optional[ast.If]:
    """The `if ... % k ...` that guards `clear` but not `step`, when the step itself runs every iteration."""
    body = _body(loop)
    if _is_statement_of(clear, body):
        return None  # the common case: a clear in the loop's own body, under no `if` (asked without a descent)
    clear_ifs = enclosing_ifs(body, clear.node)
    if not clear_ifs:
        return None  # an unconditional clear in a nested block (`with`, `try`)
    step_ifs = enclosing_ifs(body, step)
    if any(_periodic(g.test) for g in step_ifs):
        return None  # both periodic: gradient accumulation, judged by its own clears
    return next((g for g in clear_ifs if g not in step_ifs and _periodic(g.test)), None)


def _receives(call: CallSite, optimizer: str) -> bool:
    node = call.node
    return optimizer in map(ref, node.args) or any(ref(k.value) == optimizer for k in node.keywords)
