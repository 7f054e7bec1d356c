"""What a watch session knows about the training loop, handed to every runtime check as ``ctx``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional

import torch
from torch import nn

from torchdoctor.watch.handles import HookSet
from torchdoctor.wrappers import unwrap, unwrap_optimizer

if TYPE_CHECKING:
    from torchdoctor.findings import Finding
    from torchdoctor.watch.contract import RuntimeCheck
    from torchdoctor.watch.graphs import GraphTracker
    from torchdoctor.watch.timing import StepClock

# The layers whose behaviour train()/eval() switches.
MODE_DEPENDENT = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd)


class WatchedModel:
    """A model given to `watch`: `module` is what the user calls, `inner` the unwrapped model."""

    def __init__(self, module: nn.Module, label: str) -> None:
        self.module = module
        self.inner, self.wrappers = unwrap(module)
        self.label = label
        self._mode_layers: Optional[list[str]] = None
        self.called = False  # the model itself (not only its submodules) was called
        self.entry: Optional[str] = None  # the submodule it is seen through, when it is never called itself
        self._footprint: Optional[tuple[int, int]] = None

    def mode_dependent_layers(self) -> list[str]:
        """Type names of the layers whose behaviour depends on train()/eval() (BatchNorm, Dropout)."""
        if self._mode_layers is None:
            self._mode_layers = sorted(
                {type(m).__name__ for m in self.inner.modules() if isinstance(m, MODE_DEPENDENT)}
            )
        return self._mode_layers

    def graph_footprint(self, output: Optional[torch.Tensor]) -> tuple[int, int]:
        """(nodes, bytes saved for backward) of one forward's graph, measured on the first `output` given
        and cached; (0, 0) while nothing was measured."""
        if self._footprint is None:
            if output is None:
                return (0, 0)
            from torchdoctor.watch.graphs import footprint

            self._footprint = footprint(output, [*self.inner.parameters(), *self.inner.buffers()])
        return self._footprint

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        return self.inner.named_parameters()


class WatchedOptimizer:
    """An optimizer given to `watch`, with the count of its completed steps: `optimizer` is the torch
    optimizer inside the wrappers named by `wrappers` (accelerate, Lightning, DeepSpeed-style), if any."""

    def __init__(self, optimizer: Any, label: str) -> None:
        self.optimizer, self.wrappers = unwrap_optimizer(optimizer)
        self.label = label
        self.steps = 0
        self.zero_grads = 0  # zero_grad() calls since its last step (counted at every call, observed or not)

    def params(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]


# Every step of each optimizer's first DENSE_STEPS is observed in full; after that, the PERIODIC steps
# (`WatchContext.observes`) plus whatever is new (`torchdoctor.watch.events`). PERIODIC comes every `every`
# steps, and every 10 * `every` from step SPARSE_AFTER * `every` on (`WatchContext.periodic`): a long run's
# repeated steps cost next to nothing, and what a loop does at every step is still seen within a few seconds.
DENSE_STEPS = 32
SPARSE_AFTER = 100


@dataclass
class LastForward:
    """Mode of the most recent watched forward, for the exception diagnosis."""

    label: str
    training: bool
    grad_enabled: bool
    inference_mode: bool


@dataclass
class WatchContext:
    """The session's view of the loop, shared by all checks of one session."""

    models: list[WatchedModel]
    optimizers: list[WatchedOptimizer]
    loaders: list[Any]
    every: int
    deterministic: bool
    graphs: "GraphTracker"
    emit: Callable[["RuntimeCheck", "Finding"], None]
    fault: Callable[["RuntimeCheck", BaseException], None]
    hooks: HookSet = field(default_factory=HookSet)
    last_event: Any = None  # the most recent watched forward's `ForwardEvent`, its output and input dropped
    exception: Optional[BaseException] = None  # what the watched code raised (SystemExit too), once it stops
    crash_explained_by: tuple[str, ...] = ()  # the crash pitfalls that explained `exception`, before STOP
    rank: int = 0
    world_size: int = 1
    clock: Optional["StepClock"] = None  # where each step's time goes, when a check asked for it (uses_clock)
    observing: bool = True  # this step's per-step events reach the checks (`observes`; set by the event hub)
    _names: Optional[dict[int, str]] = None
    # while PERIODIC is dispatched: the id sets below, computed once for all its checks (None: not cached)
    _ids: Optional[dict[str, set[int]]] = None

    @property
    def last_forward(self) -> Optional[LastForward]:
        """Mode of the most recent watched forward (None before any)."""
        e = self.last_event
        return None if e is None else LastForward(e.model.label, e.training, e.grad_enabled, e.inference_mode)

    @property
    def step(self) -> int:
        """Completed steps of the first optimizer (0 without one): the step findings are located at."""
        return self.optimizers[0].steps if self.optimizers else 0

    def periodic(self, step: int) -> bool:
        """Whether PERIODIC comes at the step numbered `step` (completed steps before it): every `every`-th
        step, and from step ``SPARSE_AFTER * every`` on every ``10 * every``-th. It depends on the step count
        only, so it is the same on every rank."""
        every = self.every
        return step % (every if step < SPARSE_AFTER * every else 10 * every) == 0

    def setup_due(self, step: int) -> bool:
        """Whether the set-up checks (``RuntimeCheck.setup``) run at the step numbered `step`: the periodic
        steps of the first `DENSE_STEPS`, then every ``10 * every``-th, and from step ``SPARSE_AFTER * every``
        on (where every periodic step is such a step) every ``100 * every``-th: what they read (settings, which
        parameters the optimizers hold, every weight) seldom changes, and reading it costs a 1 ms step's worth."""
        if not self.periodic(step):
            return False
        if step < DENSE_STEPS:
            return True
        return step % ((10 if step < SPARSE_AFTER * self.every else 100) * self.every) == 0

    def observes(self, step: int) -> bool:
        """Whether the schedule observes the step numbered `step` in full: the first `DENSE_STEPS`, then the
        PERIODIC ones. Unusual events (a forward of a new kind, a new loader pass) make the hub observe other
        steps too (`torchdoctor.watch.events`)."""
        return step < DENSE_STEPS or self.periodic(step)

    def next_observed(self, step: int) -> int:
        """The number of the first step from `step` on that the schedule observes (`observes`)."""
        if step < DENSE_STEPS:
            return step
        period = self.every if step < SPARSE_AFTER * self.every else 10 * self.every
        return -(-step // period) * period  # SPARSE_AFTER * every is a multiple of both periods

    def param_name(self, param: torch.Tensor) -> Optional[str]:
        """The parameter's name in its model (prefixed with the model's label when several are watched)."""
        if self._names is None:
            self._names = {}
            for wm in self.models:
                prefix = f"{wm.label}." if len(self.models) > 1 else ""
                for name, p in wm.named_parameters():
                    self._names.setdefault(id(p), prefix + name)
        return self._names.get(id(param))

    def forget_names(self) -> None:
        """Drop the name cache (parameters may have been re-bound since it was built)."""
        self._names = None

    def model_param_ids(self) -> set[int]:
        """Ids of the watched models' parameters (read only: the set may be shared during a PERIODIC event)."""
        if self._ids is not None and "model" in self._ids:
            return self._ids["model"]
        ids = {id(p) for wm in self.models for p in wm.inner.parameters()}
        if self._ids is not None:
            self._ids["model"] = ids
        return ids

    def optimizer_param_ids(self) -> set[int]:
        """Ids of the watched optimizers' parameters (read only, as `model_param_ids`)."""
        if self._ids is not None and "optimizer" in self._ids:
            return self._ids["optimizer"]
        ids = {id(p) for wo in self.optimizers for p in wo.params()}
        if self._ids is not None:
            self._ids["optimizer"] = ids
        return ids

    def release(self) -> None:
        """Forget models, optimizers and loaders so that a finished session keeps nothing alive."""
        self.models, self.optimizers, self.loaders = [], [], []
        self._names = None
        self.last_event = self.exception = None


def first_graph_tensor(output: Any, depth: int = 0) -> Optional[torch.Tensor]:
    """The first tensor with a ``grad_fn`` in a forward's output (tensor, tuple/list, dict, ModelOutput)."""
    if isinstance(output, torch.Tensor):
        return output if output.grad_fn is not None else None
    if depth > 2:
        return None
    items: Iterable[Any]
    if isinstance(output, dict):
        items = output.values()
    elif isinstance(output, (tuple, list)):
        items = output
    else:
        return None
    for item in items:
        found = first_graph_tensor(item, depth + 1)
        if found is not None:
            return found
    return None
