"""The event layer: turns PyTorch's own hooks into `Event`s and delivers them to the checks that want them.

Only the hooks that the subscribed events need are installed, and every one of them goes into the
session's `HookSet`, which removes them all when the session stops (also after an exception):

==============================  ============================================================
FORWARD                         a shared patch of ``nn.Module._call_impl`` (`calls`) that sees the calls
                                of the watched models: a call of a model as the user calls it (the outermost wrapper),
                                and a call of any of its submodules that runs outside every watched
                                forward (Lightning's ``self.head(self.encoder(x))``, ``model.encoder_q(x)``
                                for monitoring)
STEP with a closure             the step events wait for the closure's first evaluation (LBFGS)
ZERO_GRAD                       per-instance wrappers of the optimizers' ``zero_grad`` (`patches`)
STEP_PRE, PERIODIC, STEP_POST   ``Optimizer.register_step_pre_hook``/``register_step_post_hook`` (a
                                per-instance wrapper of ``step`` where the optimizer has no hook state)
LOADER_ITER                     a class-level patch of ``DataLoader.__iter__`` (`patches`)
the step clock                  where a check sets ``uses_clock``: readings at the forward and step hooks
                                above and a class-level patch of the loader iterators' ``__next__`` (`timing`)
TRANSFORMED_FORWARD             the same forward hook, inside a ``torch.func`` transform: a watched model's call,
                                or any module's outside the watched ones (read with `transformed`)
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
from typing import Any, Callable, Iterable, Optional

import torch

from torchdoctor.findings import Finding
from torchdoctor.watch.calls import CallPatch
from torchdoctor.watch.context import WatchContext, WatchedModel, WatchedOptimizer
from torchdoctor.watch.contract import (
    Event,
    ForwardEvent,
    LoaderEvent,
    RuntimeCheck,
    StepEvent,
    TransformedForwardEvent,
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
        self._watched: dict[int, WatchedModel] = {}  # the models as the user calls them
        self._members: dict[
            int, WatchedModel
        ] = {}  # those and every submodule: a call of one outside the others is seen
        self._depth = 0  # calls of members running now: a member called at depth 0 is the outermost
        self._roots = self._watched  # what `calls` reports every call of
        self._stepped = False
        self.seen: dict[Event, int] = {}  # events dispatched (START/STOP aside), for the checks that could not run
        self.under_functorch = 0  # forwards of watched models skipped inside torch.func transforms
        self.wanted: set[Event] = set()
        self._calls: Optional[CallPatch] = None  # the forward patch, once installed
        # the subscribers of the per-step events that want them at unobserved steps too (`every_step`)
        self.always: dict[Event, list[tuple[RuntimeCheck, Callable[..., Any]]]] = {e: [] for e in Event}
        # (module id, training, grad enabled) of the forwards seen at observed steps: another kind is news
        self._usual: set[tuple[int, bool, bool]] = set()
        self._hold = 0  # step() calls to go on observing after something new, whatever the schedule says
        # with one optimizer, `_quiet_opt`: its first step that the schedule observes, once observing paused
        self._quiet_until = 0
        self._quiet_opt: Optional[WatchedOptimizer] = None
        self.frequent: list[tuple[RuntimeCheck, Callable[..., Any]]] = []  # PERIODIC's, the set-up checks apart
        self._every_step = False  # some check wants per-step events at unobserved steps too
        # the forward patch reports no forward of these kinds (`calls.CallListener`): `_plain` while a step is
        # neither observed nor timed, else None (`_hush`); `_plain`: the usual kinds that the patch reads the
        # same way, all but a wrapped model's (its wrapper's train/eval flag may differ from the model's)
        self._quiet: Optional[set[tuple[int, bool, bool]]] = None
        self._plain: set[tuple[int, bool, bool]] = set()
        self._subscribe(checks)

    def _subscribe(self, checks: Iterable[RuntimeCheck]) -> None:
        for chk in checks:
            for event in type(chk).subscribed_events():
                sub = (chk, getattr(chk, f"on_{event.value}"))
                self.subs[event].append(sub)
                if type(chk).every_step:
                    self.always[event].append(sub)
                    self._every_step = True
                if event is Event.PERIODIC and not type(chk).setup:
                    self.frequent.append(sub)
        self._hush()

    def dispatch(self, event: Event, *payload: Any) -> None:
        """Call every subscriber; pass its findings to the sink; contain its faults."""
        self._deliver(self.subs[event], event, payload)

    def _per_step(self, event: Event, *payload: Any) -> None:
        """A per-step event: to every subscriber at an observed step, else to the `every_step` ones."""
        if self.ctx.observing:
            self._deliver(self.subs[event], event, payload)
        elif self.always[event]:
            self._deliver(self.always[event], event, payload)

    def _deliver(self, subs: list[tuple[RuntimeCheck, Callable[..., Any]]], event: Event, payload: tuple) -> None:
        self.seen[event] = self.seen.get(event, 0) + 1
        for chk, handler in subs:  # `disable` rebinds the lists: no copy per event
            try:
                found = handler(*payload)
                if found is None:
                    continue
                found = list(found)
            except Exception as exc:
                self.disable(chk)
                self.on_fault(chk, exc)
                continue
            for finding in found:  # outside the try: on_finding="raise" and user callbacks may raise
                self.sink(chk, finding)

    def disable(self, chk: RuntimeCheck) -> None:
        for table in (self.subs, self.always):
            for event, subs in table.items():
                table[event] = [(c, h) for c, h in subs if c is not chk]
        self.frequent = [(c, h) for c, h in self.frequent if c is not chk]
        self._every_step = any(self.always.values())
        self._hush()

    def _hush(self) -> None:
        """Let the forward patch skip the usual forwards while nothing is due: no observed step, no check that
        wants every step, no timed step."""
        clock = self.ctx.clock
        quiet = not self.ctx.observing and not self._every_step and (clock is None or not clock.timing)
        self._quiet = self._plain if quiet else None

    def _news(self) -> None:
        """Something new happened: observe the rest of this step and the next whole one of every optimizer."""
        self._observe(True)
        self._hold = len(self.ctx.optimizers) + 1

    def _observe(self, on: bool) -> None:
        """Observe the steps from now on, or not; the checks' instrumentation for observed steps follows."""
        if on is self.ctx.observing:
            return
        self.ctx.observing = on
        self._hush()
        for exc in self.ctx.hooks.observe(on):  # never into the user's step: that instrumentation is lost
            logger.warning(
                "torchdoctor: a check's instrumentation could not be %s: %s", "resumed" if on else "paused", exc
            )

    def _schedule(self) -> None:
        """After a step: whether the next one is observed (`WatchContext.observes` of each optimizer that has
        stepped; a news hold first)."""
        if self._hold:
            self._hold -= 1
            return
        ctx = self.ctx
        if len(ctx.optimizers) == 1:
            first = ctx.optimizers[0]
            on = ctx.observes(first.steps)
            if not on:  # `_step_post` skips this call until then
                self._quiet_opt, self._quiet_until = first, ctx.next_observed(first.steps)
            self._observe(on)
            return
        stepped = [wo.steps for wo in ctx.optimizers if wo.steps]
        self._observe(not stepped or any(ctx.observes(n) for n in stepped))

    def install(self) -> list[tuple[str, BaseException, list[RuntimeCheck]]]:
        """Install the hooks behind every event that has at least one subscriber. A hook that fails only
        unsubscribes the handlers of its events; returns (what, error, the checks that lose them) for each."""
        wanted = {e for e, subs in self.subs.items() if subs}
        self.wanted = wanted  # for the optimizers and models adopted later (`add_optimizer`, `add_model`)
        hooks = self.ctx.hooks
        failed: list[tuple[str, BaseException, list[RuntimeCheck]]] = []

        def attempt(what: str, events: set[Event], install: Callable[[], Any]) -> None:
            try:
                install()
            except Exception as exc:  # the subscribers of these events go on without them; the rest is unaffected
                failed.append((what, exc, list({id(c): c for e in events for c, _ in self.subs[e]}.values())))
                for event in events:
                    self.subs[event] = self.always[event] = []
                if Event.PERIODIC in events:
                    self.frequent = []

        if Event.FORWARD in wanted or self.ctx.clock is not None:
            # a patch of nn.Module._call_impl, not per-module hooks: nothing of ours lands in the user's modules,
            # so torch.save(model) and copy.deepcopy(model) (EMA) work unchanged during the session; and not
            # torch's global hooks, which slow every module call down (`torchdoctor.watch.calls`)
            self._watched = self._roots = {id(wm.module): wm for wm in self.ctx.models}
            self._members = {id(m): wm for wm in reversed(self.ctx.models) for m in (*wm.inner.modules(), wm.module)}

            def forward_hooks() -> None:
                transformed = bool(self.subs[Event.TRANSFORMED_FORWARD])
                self._calls = hooks.add(CallPatch(self, transformed=transformed))
                self._calls.listen(m for wm in self.ctx.models for m in (*wm.inner.modules(), wm.module))

            attempt("the forward hook", {Event.FORWARD}, forward_hooks)
        for wo in self.ctx.optimizers:
            if Event.ZERO_GRAD in wanted:  # optimizers only: their __getstate__ leaves the wrapper out of copies
                attempt(f"{wo.label}.zero_grad", {Event.ZERO_GRAD}, functools.partial(self._hook_zero_grad, wo))
            # always: the post hook keeps the step count that locations and PERIODIC use
            attempt(
                f"{wo.label}.step",
                {Event.STEP_PRE, Event.PERIODIC, Event.STEP_POST},
                functools.partial(self._hook_step, wo, wanted & {Event.STEP_PRE, Event.PERIODIC}),
            )
        if Event.LOADER_ITER in wanted:
            attempt("DataLoader.__iter__", {Event.LOADER_ITER}, lambda: hooks.add(LoaderPatch(self._loader_iter)))
        if self.ctx.clock is not None:  # the step clock times every loader's __next__ (torchdoctor.watch.timing)
            from torchdoctor.watch.timing import NextPatch

            clock = self.ctx.clock
            attempt("DataLoader iterators' __next__", set(), lambda: hooks.add(NextPatch(clock)))
        return failed

    def add_optimizer(self, wo: WatchedOptimizer) -> list[Any]:
        """Hook an optimizer adopted while the session runs (`torchdoctor.watch.follow`); returns its handles."""
        before = len(self.ctx.hooks)
        self._quiet_opt = None  # the schedule's shortcut holds for one optimizer only
        if Event.ZERO_GRAD in self.wanted:
            self._hook_zero_grad(wo)
        self._hook_step(wo, self.wanted & {Event.STEP_PRE, Event.PERIODIC})
        return self.ctx.hooks.added_since(before)

    def add_checks(self, checks: list[RuntimeCheck]) -> None:
        """Subscribe checks made while the session runs (the cross-rank ones, once torch.distributed is up),
        hook the step events they need that no check wanted so far, and run their START."""
        self._subscribe(checks)
        pre = {e for chk in checks for e in type(chk).subscribed_events()} & {Event.STEP_PRE, Event.PERIODIC}
        if pre - self.wanted:
            for wo in self.ctx.optimizers:
                if not self.wanted & {Event.STEP_PRE, Event.PERIODIC} and isinstance(
                    wo.optimizer.__dict__.get("_optimizer_step_pre_hooks"), dict
                ):
                    handle = self.ctx.hooks.add(
                        wo.optimizer.register_step_pre_hook(functools.partial(self._step_pre, wo))
                    )
                    getattr(wo, "handles", []).append(handle)
        self.wanted |= {e for chk in checks for e in type(chk).subscribed_events()}
        for chk in checks:
            try:
                found = list(chk.on_start() or ())
            except Exception as exc:
                self.disable(chk)
                self.on_fault(chk, exc)
                continue
            for finding in found:
                self.sink(chk, finding)

    def add_model(self, wm: WatchedModel) -> None:
        """Watch the forwards of a model adopted while the session runs (and of its submodules called alone)."""
        self._watched[id(wm.module)] = wm
        self._roots = self._watched
        for module in (*wm.inner.modules(), wm.module):
            self._members.setdefault(id(module), wm)
        if self._calls is not None:
            self._calls.listen((*wm.inner.modules(), wm.module))

    def _hook_zero_grad(self, wo: WatchedOptimizer) -> None:
        def after(*_: Any) -> None:
            wo.zero_grads += 1
            if not self.ctx.observing:
                if wo.zero_grads == 1 and not self._every_step:
                    return
                if wo.zero_grads > 1:  # cleared again without a step: news
                    self._news()
            self._per_step(Event.ZERO_GRAD, ZeroGradEvent(wo))

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
            hooks.add(
                MethodPatch(
                    opt,
                    "step",
                    before=functools.partial(self._step_pre, wo) if pre else None,
                    after=functools.partial(self._step_post, wo),
                )
            )

    def _transformed(self, module: torch.nn.Module) -> None:
        """A module outside the watched models returned inside a ``torch.func`` transform (`calls` asks)."""
        self.dispatch(Event.TRANSFORMED_FORWARD, TransformedForwardEvent(module, None, torch.is_grad_enabled()))

    def _forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        """A call of a watched model, or of one of its submodules outside the model's forward, returned
        (`torchdoctor.watch.calls` keeps `_depth` and calls this only for those, never while dynamo traces)."""
        key = id(module)
        wm = self._members.get(key)
        if wm is None or output is None:  # not watched; or the forward raised
            return
        root = self._watched.get(key) is wm
        if root:
            training = wm.inner.training
        elif self._depth:  # a submodule inside the model's forward
            return
        else:
            training = module.training
        grad_enabled = torch.is_grad_enabled()
        kind = (key, training, grad_enabled)
        if self._quiet is not None and kind in self._usual:  # a usual forward while nothing is due (`_hush`)
            return  # (a wrapped model's: the patch leaves those to this test)
        clock = self.ctx.clock
        if _is_compiling():  # an export traces it
            return
        if _in_functorch():  # the output is a functorch wrapper, without storage or autograd graph
            self.under_functorch += 1
            if root and self.subs[Event.TRANSFORMED_FORWARD]:
                self.dispatch(Event.TRANSFORMED_FORWARD, TransformedForwardEvent(module, wm, torch.is_grad_enabled()))
            return
        if root:
            wm.called = True
        elif not self._stepped and not wm.called:  # the model itself is never called (Lightning's training_step)
            wm.entry = type(module).__name__
        if clock is not None and clock.timing:  # a timed step (one in SAMPLE)
            try:
                clock.forward_end()
            except Exception as exc:
                self._clock_failed(exc)
        if self.ctx.observing:
            self._usual.add(kind)
            if not root or wm.inner is module:
                self._plain.add(kind)
        elif kind not in self._usual:  # a forward of a new kind (a validation pass, another model): news
            self._news()
        elif not self._every_step:
            return
        event = ForwardEvent(wm, output, training, grad_enabled, torch.is_inference_mode_enabled(), args=args)
        self.ctx.last_event = event  # read as `ctx.last_forward`
        try:
            self._per_step(Event.FORWARD, event)
        finally:
            event.output = event._args = None  # the session keeps no tensor of the user's

    def _step_pre(self, wo: WatchedOptimizer, optimizer: Any, args: Any, kwargs: Any) -> Any:
        if self._quiet is not None and self._stepped and len(self.ctx.optimizers) == 1:
            return None  # nothing is due and nothing is timed (`_hush`): the commonest step
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)  # args: (optimizer, closure?)
        if closure is None:
            self._stepped = True
            self._dispatch_step(wo)
            return None
        # LBFGS, Lightning's automatic optimization: forward and backward run inside step(), in the closure;
        # the checks see the step once its first evaluation has produced the gradients
        pending = [True]

        def closure_then_step_events() -> Any:
            loss = closure()
            if pending:  # the first step's forward may have run in here (no validation loop before it)
                pending.clear()
                self._stepped = True
                self._dispatch_step(wo)
            return loss

        if "closure" in kwargs:
            return args, {**kwargs, "closure": closure_then_step_events}
        return (args[0], closure_then_step_events, *args[2:]), kwargs

    def _dispatch_step(self, wo: WatchedOptimizer) -> None:
        if self.ctx.clock is not None and self.ctx.clock.timing:  # a timed step (one in SAMPLE)
            try:
                self.ctx.clock.step_pre()
            except Exception as exc:
                self._clock_failed(exc)
        observing = self.ctx.observing or bool(self.always[Event.STEP_PRE])
        # one optimizer's periodic steps are observed ones (`_schedule`); of several, one may be due meanwhile
        periodic = (observing or len(self.ctx.optimizers) > 1) and self.ctx.periodic(wo.steps)
        if not (periodic or observing):
            return
        event = StepEvent(wo, wo.steps)
        self._per_step(Event.STEP_PRE, event)
        if periodic:
            self.ctx.forget_names()
            self.ctx._ids = {}  # the checks of this event share the parameter id sets (nothing changes them meanwhile)
            try:
                subs = self.subs[Event.PERIODIC] if self.ctx.setup_due(wo.steps) else self.frequent
                self._deliver(subs, Event.PERIODIC, (event,))
            finally:
                self.ctx._ids = None

    def _step_post(self, wo: WatchedOptimizer, optimizer: Any, args: Any, kwargs: Any) -> None:
        ctx = self.ctx
        clock = ctx.clock
        if clock is not None:
            steps = clock.steps + 1
            if steps < clock.wake and not clock.timing and id(wo) == clock.first_optimizer:
                clock.steps = steps  # neither timed nor ending a block (`StepClock.wake`): counted here, a call less
            else:
                try:
                    clock.step_post(wo)
                except Exception as exc:
                    self._clock_failed(exc)
        try:
            if ctx.observing or self._every_step:
                self._per_step(Event.STEP_POST, StepEvent(wo, wo.steps))
        finally:
            wo.steps = steps = wo.steps + 1
            wo.zero_grads = 0
            if ctx.observing or self._hold or wo is not self._quiet_opt or steps >= self._quiet_until:
                self._schedule()  # else an unobserved step before the next observed one: nothing changes
            if clock is not None and (clock.timing or self._quiet is None):  # a timed step starts or ended
                self._hush()

    def _clock_failed(self, exc: BaseException) -> None:
        """The step clock failed: it stops (the report goes without a breakdown); training goes on."""
        clock, self.ctx.clock = self.ctx.clock, None
        self._hush()
        if clock is not None:
            clock.broken = True
        logger.warning("torchdoctor: the step clock stopped: %s: %s", type(exc).__name__, exc)

    def _loader_iter(self, loader: Any, iterator: Any) -> None:
        self._news()  # a new pass (an epoch, a validation loader): observe what follows
        self.dispatch(Event.LOADER_ITER, LoaderEvent(loader, iterator))


# True while dynamo traces: the forward hook must then add nothing to the graph (checked first, cheaply)
_is_compiling: Callable[[], bool] = (
    getattr(getattr(torch, "compiler", None), "is_compiling", None) or torch._dynamo.is_compiling
)
_functorch_stack: Any = getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack", None)


def _in_functorch() -> bool:
    """Inside a torch.func transform: outputs are functorch wrappers, without storage or autograd graph."""
    return _functorch_stack is not None and _functorch_stack() is not None
