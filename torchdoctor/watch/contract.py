"""The runtime check contract: the events a watch session delivers and the base class of runtime checks.

This module is torch-free: the check modules in `checks/` import it when the registry loads.

A runtime check is a `RuntimeCheck` subclass attached to its pitfall with ``@PITFALL.runtime``. Each session builds one
instance per enabled check, ``Check(ctx)`` (`ctx` is the
session's `torchdoctor.watch.context.WatchContext`), and calls its ``on_<event>`` methods. Which events
a check receives is derived from the ``on_<event>`` methods it overrides, and the session installs only
the hooks that the union of those events needs. A handler returns ``None`` or an iterable of `Finding`
(usually it is a generator); the session fills in code, name and default severity (and the step, when
the location has none), folds repeats (same code, message and location apart from the step) into one
finding with a count that keeps the first step, and applies ``on_finding`` to each new one.

What ``ctx`` offers: ``models`` (`WatchedModel`: ``module`` as called, ``inner`` unwrapped, ``label``,
``wrappers``), ``optimizers`` (`WatchedOptimizer`: ``optimizer``, ``label``, ``steps``, ``params()``),
``loaders`` (those passed with ``loader=``), ``step`` (completed steps of the first optimizer), ``every``,
``deterministic``, ``rank``/``world_size``, ``param_name(p)``, ``model_param_ids()``,
``optimizer_param_ids()``, ``last_forward`` and ``clock`` (the step clock, when a check sets ``uses_clock``).

Events, in the order of a training step (payload types below):

===============  ====================================================================================
``START``        the session was entered; ``ctx`` lists models, optimizers and loaders. ``on_start()``
``FORWARD``      a watched model's (outermost wrapper's) forward returned. `ForwardEvent`
``ZERO_GRAD``    ``zero_grad()`` was called on a watched optimizer. `ZeroGradEvent`
``STEP_PRE``     a watched optimizer's ``step()`` is about to run (``GradScaler`` may skip it). `StepEvent`
``PERIODIC``     right after ``STEP_PRE`` at the steps ``ctx.periodic(step)`` names (the optimizer's completed-step
                 count a multiple of ``every``; from step ``100 * every`` on, of ``10 * every``). The schedule
                 depends only on the step count, so it is the same on every rank: a cross-rank check may
                 call collectives here. `StepEvent`
``STEP_POST``    a watched optimizer's ``step()`` returned. `StepEvent`
``LOADER_ITER``  any ``DataLoader`` started a pass (``iter(loader)``, i.e. usually a new epoch). `LoaderEvent`
``CRASH``        the watched code (the program, under ``torchdoctor run``) ended with this exception, just
                 before ``STOP``; models and optimizers are still there to look at. `CrashEvent`
``STOP``         the session is ending, also when the body raised. ``on_stop()``
===============  ====================================================================================

``TRANSFORMED_FORWARD`` comes instead of ``FORWARD`` inside a ``torch.func`` transform (vmap, grad): a watched
model's call, or any module's outside the watched ones (an ensemble's base copy under ``functional_call``).
`TransformedForwardEvent`

Observed steps: FORWARD, ZERO_GRAD, STEP_PRE and STEP_POST are delivered for whole steps (from just after one
``step()`` of an optimizer to the end of its next) at the steps the session observes: every step of each
optimizer's first 32, then the PERIODIC ones; and besides, from the moment something new happens until the end of
the next whole step: a forward of a kind not seen at an observed step (another model or submodule,
``train()``/``eval()``, grad on/off: a validation pass), a new loader pass, a second ``zero_grad()`` with no step
between. A loop's repeated work is seen at the PERIODIC steps, anything that changes at once; a check that needs
every step sets ``every_step``. ``ctx.observing`` says whether the current step is observed, ``ctx.observes(step)``
which steps the schedule observes. START, PERIODIC, LOADER_ITER, CRASH, TRANSFORMED_FORWARD and STOP always come.

Rules for handlers:

- Be cheap on per-step events: no ``.item()`` or other host sync in ``on_forward``; at most one sync per
  step elsewhere; anything heavier belongs in ``on_periodic``.
- Never keep a tensor from a payload beyond the handler: keep numbers, ids or ``weakref``s. The session
  must hold no strong reference to a tensor between steps.
- Code that runs from a finaliser or GC callback (e.g. `GraphTracker` callbacks) only updates counters;
  the check yields the finding from its next event.
- A handler that raises is disabled for the rest of the session and reported once as an internal error;
  training goes on.
- Services on ``ctx``: ``ctx.graphs`` (sentinels on autograd graphs, `torchdoctor.watch.graphs`),
  ``ctx.hooks`` (add any extra handle, e.g. a tensor hook; it is removed at exit), ``ctx.emit(self, finding)``
  for findings that a check's own instrumentation (a wrapper it installed) produces outside an event, and
  ``ctx.fault(self, exc)`` for an exception such instrumentation caught: it must never raise into the
  user's forward, backward or data loading.

Cross-rank checks: a pitfall's ``@PITFALL.distributed`` detector is a `RuntimeCheck` like any other; a session
runs it (subject to ``checks=``/``ignore=``) when ``torch.distributed`` is initialised, and prints its report on
rank 0 only (see ``WatchSession.start``). It uses the same events (``PERIODIC`` for collectives, ``FORWARD`` and
``LOADER_ITER`` for data fingerprints), ``ctx.rank``/``ctx.world_size``, and ``exchange_for`` from
``torchdoctor.sdk.runtime`` for the side group. A new kind of event is added as an `Event` member, an
``on_<event>`` default on `RuntimeCheck` (its signature is what every handler must accept), a payload dataclass
here and an installer in `torchdoctor.watch.events`.
"""

from __future__ import annotations

import enum
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Iterable, Optional

from torchdoctor.findings import Finding

if TYPE_CHECKING:
    from torchdoctor.watch.context import WatchContext, WatchedModel, WatchedOptimizer


class Event(str, enum.Enum):
    """What happened in the training loop; ``RuntimeCheck.on_<value>`` receives it."""

    START = "start"
    FORWARD = "forward"
    ZERO_GRAD = "zero_grad"
    STEP_PRE = "step_pre"
    PERIODIC = "periodic"
    STEP_POST = "step_post"
    LOADER_ITER = "loader_iter"
    CRASH = "crash"
    TRANSFORMED_FORWARD = "transformed_forward"
    STOP = "stop"

    __hash__ = str.__hash__  # Enum's own hashes in Python (hash of the name): dispatch looks events up per call


class ForwardEvent:
    """A watched model's forward returned. `output` is only valid during the handler."""

    __slots__ = ("model", "output", "training", "grad_enabled", "inference_mode", "_args", "_input_ref")

    def __init__(
        self,
        model: "WatchedModel",
        output: Any,
        training: bool,
        grad_enabled: bool,
        inference_mode: bool,
        input_ref: Optional["weakref.ReferenceType[Any]"] = None,
        args: Any = None,
    ) -> None:
        self.model, self.output, self.training = model, output, training
        self.grad_enabled, self.inference_mode = grad_enabled, inference_mode
        self._input_ref, self._args = input_ref, args  # the weak reference is made on first use, from args

    @property
    def input_ref(self) -> Optional["weakref.ReferenceType[Any]"]:
        """A weak reference to the forward's first tensor argument (None without one): the same live object
        when one tensor is fed again (MC-dropout sampling), never a strong reference; an id or data pointer
        would not do, since a freed temporary's are reused by the next batch."""
        if self._input_ref is None and self._args is not None:
            first = next((a for a in self._args if _is_tensor(a)), None) if isinstance(self._args, tuple) else None
            try:
                self._input_ref = None if first is None else weakref.ref(first)
            except TypeError:  # a tensor-like that takes no weak references
                pass
            self._args = None
        return self._input_ref


def _is_tensor(value: Any) -> bool:
    import torch  # only when a check asks for the input: this module stays torch-free at import

    return isinstance(value, torch.Tensor)


@dataclass
class ZeroGradEvent:
    """``zero_grad()`` ran on a watched optimizer (models are not wrapped: that would reach pickles)."""

    optimizer: "WatchedOptimizer"


@dataclass
class StepEvent:
    """An optimizer step; `step` counts that optimizer's completed steps before this one."""

    optimizer: "WatchedOptimizer"
    step: int


@dataclass
class LoaderEvent:
    """A ``DataLoader`` started a pass; `iterator` is the iterator it returned."""

    loader: Any
    iterator: Any


@dataclass
class CrashEvent:
    """The watched code raised `exception` (its traceback's frames hold the tensors of the failing line).
    Only valid during the handler: keep nothing of it."""

    exception: BaseException


@dataclass
class TransformedForwardEvent:
    """A module's forward returned inside a ``torch.func`` transform (vmap, grad, ...), where its parameters
    are the transform's wrappers (`torchdoctor.watch.transformed` reads what they wrap). `watched` is the
    watched model when `module` is one as the user calls it (its submodules' calls are not sent); None for a
    module outside every watched model (``functional_call`` of an ensemble's base copy), each of whose
    calls is sent, submodules included. Only valid during the handler: keep nothing of it."""

    module: Any
    watched: Optional["WatchedModel"]
    grad_enabled: bool


Findings = Optional[Iterable[Finding]]


def handler_names() -> set[str]:
    """The ``on_<event>`` method names a runtime check may define (anything else ``on_*`` is a typo)."""
    return {f"on_{e.value}" for e in Event}


class RuntimeCheck:
    """Base class of runtime checks: override the ``on_<event>`` handlers the check needs."""

    #: Whether the check judges optimizer steps, so that a session without one reports it as not run
    #: (None: it does when it listens to step events only).
    needs_optimizer: Optional[bool] = None
    #: Whether it judges forwards, so that a session that saw none reports it as not run (None: it does when
    #: it listens to forwards).
    needs_forward: Optional[bool] = None
    # True: the session keeps a step clock (``ctx.clock``, `torchdoctor.watch.timing.StepClock`) that times
    # a sample of the steps' data wait, forward, backward and optimizer; its breakdown goes into the report's facts
    uses_clock: ClassVar[bool] = False
    #: True: FORWARD, ZERO_GRAD, STEP_PRE and STEP_POST reach the check at every step, not only at the steps the
    #: session observes (see "Observed steps" in this module); its handlers of those events must then be cheap
    every_step: ClassVar[bool] = False
    #: True: a check of the loop's set-up (which parameters the optimizers hold, devices, flags), which changes
    #: seldom: PERIODIC reaches it at the steps ``ctx.setup_due(step)`` names (the periodic steps of the first
    #: 32, then every ``10 * every``-th, from step ``100 * every`` on every ``100 * every``-th), not at every
    #: periodic step
    setup: ClassVar[bool] = False

    def __init__(self, ctx: "WatchContext") -> None:
        self.ctx = ctx

    @classmethod
    def subscribed_events(cls) -> list[Event]:
        """The events whose handler this class overrides (the hooks it makes the session install)."""
        return [e for e in Event if getattr(cls, f"on_{e.value}") is not getattr(RuntimeCheck, f"on_{e.value}")]

    def on_start(self) -> Findings:
        return None

    def on_forward(self, event: ForwardEvent) -> Findings:
        return None

    def on_zero_grad(self, event: ZeroGradEvent) -> Findings:
        return None

    def on_step_pre(self, event: StepEvent) -> Findings:
        return None

    def on_periodic(self, event: StepEvent) -> Findings:
        return None

    def on_step_post(self, event: StepEvent) -> Findings:
        return None

    def on_loader_iter(self, event: LoaderEvent) -> Findings:
        return None

    def on_crash(self, event: CrashEvent) -> Findings:
        return None

    def on_transformed_forward(self, event: TransformedForwardEvent) -> Findings:
        return None

    def on_stop(self) -> Findings:
        return None
