"""The event layer: turns PyTorch's own hooks into `Event`s and delivers them to the checks that want them.

Only the hooks that the subscribed events need are installed, and every one of them goes into the
session's `HookSet`, which removes them all when the session stops (also after an exception):

==============================  ============================================================
FORWARD                         one global ``register_module_forward_hook``, filtered to the watched
                                models as the user calls them (the outermost wrapper); a model never
                                called by the first step (Lightning's ``training_step``) is seen through
                                the last direct child that ran
STEP with a closure             the step events wait for the closure's first evaluation (LBFGS)
ZERO_GRAD                       per-instance wrappers of the optimizers' ``zero_grad`` (`patches`)
STEP_PRE, PERIODIC, STEP_POST   ``Optimizer.register_step_pre_hook``/``register_step_post_hook`` (a
                                per-instance wrapper of ``step`` where the optimizer has no hook state)
LOADER_ITER                     a class-level patch of ``DataLoader.__iter__`` (`patches`)
the step clock                  where a check sets ``uses_clock``: readings at the forward and step hooks
                                above and a class-level patch of the loader iterators' ``__next__`` (`timing`)
START, STOP                     called by the session itself
==============================  ============================================================

Optimizers are the torch optimizers inside any wrapper (`torchdoctor.wrappers.unwrap_optimizer`). A hook
that cannot be installed only drops its events, for every check; `install` says which checks lose them.
Nothing runs while dynamo traces (``torch.compiler.is_compiling()``) or inside a ``torch.func`` transform:
the hooks return before touching anything, so compiled graphs get no breaks and no recompiles.

A handler that raises is unsubscribed from every event and reported once (``on_fault``). Findings are
handed to the sink outside that guard, so ``on_finding="raise"`` and user callbacks reach the user.
"""
from __future__ import annotations

import functools
import logging
import weakref
from typing import Any, Callable, Iterable, Optional

import torch
from torch.nn.modules.module import register_module_forward_hook

from torchdoctor.findings import Finding
from torchdoctor.watch.context import LastForward, WatchContext, WatchedModel, WatchedOptimizer, first_graph_tensor
from torchdoctor.watch.handles import WarningFilter
from torchdoctor.watch.contract import (
    Event,
    ForwardEvent,
    LoaderEvent,
    RuntimeCheck,
    StepEvent,
    ZeroGradEvent,
)
from torchdoctor.watch.patches import LoaderPatch, MethodPatch

logger = logging.getLogger("torchdoctor")
Sink = Callable[[RuntimeCheck, Finding], None]
Fault = Callable[[RuntimeCheck, BaseException], None]


class EventHub:
    """Subscriptions of one session's checks, the hooks behind them, and dispatch."""

    def __init__(self, ctx: WatchContext, checks: Iterable[RuntimeCheck], sink: Sink, on_fault: Fault) -> None:
        self.ctx = ctx
        self.sink = sink
        self.on_fault = on_fault
        self.subs: dict[Event, list[tuple[RuntimeCheck, Callable[..., Any]]]] = {e: [] for e in Event}
        self._watched: dict[int, WatchedModel] = {}
        self._children: dict[int, WatchedModel] = {}  # direct children of the models, until the first step
        for chk in checks:
            for event in type(chk).subscribed_events():
                self.subs[event].append((chk, getattr(chk, f"on_{event.value}")))

    def dispatch(self, event: Event, *payload: Any) -> None:
        """Call every subscriber; pass its findings to the sink; contain its faults."""
        for chk, handler in list(self.subs[event]):
            try:
                found = handler(*payload)
                found = list(found) if found is not None else []
            except Exception as exc:
                self.disable(chk)
                self.on_fault(chk, exc)
                continue
            for finding in found:  # outside the try: on_finding="raise" and user callbacks may raise
                self.sink(chk, finding)

    def disable(self, chk: RuntimeCheck) -> None:
        for subs in self.subs.values():
            subs[:] = [(c, h) for c, h in subs if c is not chk]

    def install(self) -> list[tuple[str, BaseException, list[RuntimeCheck]]]:
        """Install the hooks behind every event that has at least one subscriber. A hook that fails only
        unsubscribes the handlers of its events; returns (what, error, the checks that lose them) for each."""
        wanted = {e for e, subs in self.subs.items() if subs}
        hooks = self.ctx.hooks
        failed: list[tuple[str, BaseException, list[RuntimeCheck]]] = []

        def attempt(what: str, events: set[Event], install: Callable[[], Any]) -> None:
            try:
                install()
            except Exception as exc:  # the subscribers of these events go on without them; the rest is unaffected
                failed.append((what, exc, list({id(c): c for e in events for c, _ in self.subs[e]}.values())))
                for event in events:
                    self.subs[event] = []

        if Event.FORWARD in wanted or self.ctx.clock is not None:
            # global, not per module: nothing of ours lands in the user's modules, so torch.save(model)
            # and copy.deepcopy(model) (EMA) work unchanged during the session
            self._watched = {id(wm.module): wm for wm in self.ctx.models}
            self._children = {id(c): wm for wm in self.ctx.models for c in wm.inner.children()}
            attempt("the forward hook", {Event.FORWARD}, lambda: hooks.add(register_module_forward_hook(self._forward)))
            # torch warns that global hooks also fire for an OptimizedModule's inner module; the id lookup in
            # _forward dispatches each watched call once anyway, so that warning would only puzzle the user
            hooks.add(WarningFilter(r"Using `torch.compile\(module\)` when there are global hooks"))
        for wo in self.ctx.optimizers:
            if Event.ZERO_GRAD in wanted:  # optimizers only: their __getstate__ leaves the wrapper out of copies
                attempt(f"{wo.label}.zero_grad", {Event.ZERO_GRAD}, functools.partial(self._hook_zero_grad, wo))
            # always: the post hook keeps the step count that locations and PERIODIC use
            attempt(f"{wo.label}.step", {Event.STEP_PRE, Event.PERIODIC, Event.STEP_POST},
                    functools.partial(self._hook_step, wo, wanted & {Event.STEP_PRE, Event.PERIODIC}))
        if Event.LOADER_ITER in wanted:
            attempt("DataLoader.__iter__", {Event.LOADER_ITER}, lambda: hooks.add(LoaderPatch(self._loader_iter)))
        if self.ctx.clock is not None:  # the step clock times every loader's __next__ (torchdoctor.watch.timing)
            from torchdoctor.watch.timing import NextPatch

            clock = self.ctx.clock
            attempt("DataLoader iterators' __next__", set(), lambda: hooks.add(NextPatch(clock)))
        return failed

    def _hook_zero_grad(self, wo: WatchedOptimizer) -> None:
        def after(*_: Any) -> None:
            self.dispatch(Event.ZERO_GRAD, ZeroGradEvent(wo))

        self.ctx.hooks.add(MethodPatch(wo.optimizer, "zero_grad", after=after))

    def _hook_step(self, wo: WatchedOptimizer, pre: set[Event]) -> None:
        """Step hooks on one optimizer: torch's own, or a wrapper of ``step`` for an optimizer that never ran
        ``Optimizer.__init__`` (and so has no hook dictionaries)."""
        opt, hooks = wo.optimizer, self.ctx.hooks
        pre = pre or ({Event.STEP_PRE} if self.ctx.clock is not None else set())
        if isinstance(opt.__dict__.get("_optimizer_step_pre_hooks"), dict):
            if pre:
                hooks.add(opt.register_step_pre_hook(functools.partial(self._step_pre, wo)))
            hooks.add(opt.register_step_post_hook(functools.partial(self._step_post, wo)))
        else:
            hooks.add(MethodPatch(opt, "step", before=functools.partial(self._step_pre, wo) if pre else None,
                                  after=functools.partial(self._step_post, wo)))

    def _forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if _is_compiling():
            return
        wm = self._watched.get(id(module))
        if wm is None:
            if self._children:  # until the first step: which direct child stands for a model never called
                child_of = self._children.get(id(module))
                if child_of is not None:
                    child_of.last_child = module
            return
        if _in_functorch():
            return
        if self.ctx.clock is not None:
            try:
                self.ctx.clock.forward_end(first_graph_tensor(output) if wm.inner.training else None)
            except Exception as exc:
                self._clock_failed(exc)
        if self._children and wm.module is module:
            for child in wm.inner.children():
                self._children.pop(id(child), None)
        training = wm.inner.training
        grad_enabled = torch.is_grad_enabled()
        inference = torch.is_inference_mode_enabled()
        self.ctx.last_forward = LastForward(wm.label, training, grad_enabled, inference)
        self.dispatch(Event.FORWARD, ForwardEvent(wm, output, training, grad_enabled, inference, _input_ref(args)))

    def _adopt_children(self) -> None:
        """At the first step: a model whose own __call__ never ran (Lightning's training_step, a method
        called instead of forward) is seen through the last of its direct children that ran, whose output
        carries the step's graph (``self.head(self.encoder(x))``: the head). Only weakly kept until then."""
        for wm in self.ctx.models:
            child = wm.last_child
            if child is not None and id(wm.module) in self._watched and id(child) in self._children:
                self._watched[id(child)] = wm
                wm.entry = type(child).__name__
            wm.last_child = None
        self._children = {}

    def _step_pre(self, wo: WatchedOptimizer, optimizer: Any, args: Any, kwargs: Any) -> Any:
        if self._children:
            self._adopt_children()
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)  # args: (optimizer, closure?)
        if closure is None:
            self._dispatch_step(wo)
            return None
        # LBFGS, Lightning's automatic optimization: forward and backward run inside step(), in the closure;
        # the checks see the step once its first evaluation has produced the gradients
        pending = [True]

        def closure_then_step_events() -> Any:
            loss = closure()
            if pending:
                pending.clear()
                self._dispatch_step(wo)
            return loss

        if "closure" in kwargs:
            return args, {**kwargs, "closure": closure_then_step_events}
        return (args[0], closure_then_step_events, *args[2:]), kwargs

    def _dispatch_step(self, wo: WatchedOptimizer) -> None:
        if self.ctx.clock is not None:
            try:
                self.ctx.clock.step_pre()
            except Exception as exc:
                self._clock_failed(exc)
        event = StepEvent(wo, wo.steps)
        self.dispatch(Event.STEP_PRE, event)
        if wo.steps % self.ctx.every == 0:
            self.ctx.forget_names()
            self.dispatch(Event.PERIODIC, event)

    def _step_post(self, wo: WatchedOptimizer, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.ctx.clock is not None:
            try:
                self.ctx.clock.step_post(wo)
            except Exception as exc:
                self._clock_failed(exc)
        try:
            self.dispatch(Event.STEP_POST, StepEvent(wo, wo.steps))
        finally:
            wo.steps += 1

    def _clock_failed(self, exc: BaseException) -> None:
        """The step clock failed: it stops (the report goes without a breakdown); training goes on."""
        clock, self.ctx.clock = self.ctx.clock, None
        if clock is not None:
            clock.broken = True
        logger.warning("torchdoctor: the step clock stopped: %s: %s", type(exc).__name__, exc)

    def _loader_iter(self, loader: Any, iterator: Any) -> None:
        self.dispatch(Event.LOADER_ITER, LoaderEvent(loader, iterator))



# True while dynamo traces: the forward hook must then add nothing to the graph (checked first, cheaply)
_is_compiling: Callable[[], bool] = getattr(getattr(torch, "compiler", None), "is_compiling", None) \
    or torch._dynamo.is_compiling
_functorch_stack: Any = getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack", None)


def _input_ref(args: Any) -> Optional["weakref.ReferenceType[torch.Tensor]"]:
    """A weak reference to a forward's first tensor argument (None without one)."""
    first = next((a for a in args if isinstance(a, torch.Tensor)), None) if isinstance(args, tuple) else None
    try:
        return None if first is None else weakref.ref(first)
    except TypeError:  # a tensor-like that takes no weak references
        return None


def _in_functorch() -> bool:
    """Inside a torch.func transform: outputs are functorch wrappers, without storage or autograd graph."""
    return _functorch_stack is not None and _functorch_stack() is not None
