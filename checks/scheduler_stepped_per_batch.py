"""scheduler-stepped-per-batch: a per-epoch learning-rate schedule stepped after every batch decays
len(loader) times too fast."""

from __future__ import annotations

import weakref
from typing import Any, Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import LoaderEvent, MethodPatch, RuntimeCheck, unwrap_optimizer, user_line

_SETUP = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.1)   # "decay every 3 epochs"
loader = DataLoader(TensorDataset(torch.randn(96, 4), torch.randn(96, 1)), batch_size=8)
"""

SCHEDULER_STEPPED_PER_BATCH = Pitfall(
    code="TD317",
    name="scheduler-stepped-per-batch",
    severity="warning",
    summary="A per-epoch learning-rate schedule is stepped after every batch, so it decays len(loader) times too fast.",
    why="""
        `StepLR(step_size=30)`, `MultiStepLR(milestones=[30, 60])` and `ExponentialLR` count calls of
        `scheduler.step()`, not epochs. Written for epochs (as in the ImageNet example) but called inside the
        batch loop, the learning rate collapses during the first epoch: with 500 batches per epoch,
        `StepLR(step_size=30, gamma=0.1)` has divided it by 10^16 before the epoch ends. Training then barely
        moves, with no error. (Calling `scheduler.step()` before the first `optimizer.step()` is the other
        classic slip; PyTorch warns about that one itself.)
    """,
    fix="""
        Call `scheduler.step()` once per epoch, after the batch loop; or, for a per-iteration schedule,
        express its horizon in iterations (`step_size=30 * len(loader)`, `OneCycleLR(total_steps=...)`).
    """,
    bad=Example(
        """
        for epoch in range(2):
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
                scheduler.step()
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        epochs = 2
        for epoch in range(epochs):
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
            scheduler.step()
        """,
        setup=_SETUP,
    ),
    details={
        "runtime": """
            While a session runs, every `LRScheduler.step()` of a scheduler that drives a watched optimizer is
            counted. When the DataLoader that drives training (one whose pass was under way, its iterator alive
            and not exhausted, when the scheduler stepped; an eval loader run mid-epoch never is) starts its
            second pass (the first epoch is over) after at least 10 optimizer steps, a scheduler that was stepped about
            once per optimizer step during that epoch and
            has already brought the learning rate below 1/100 of its initial value is reported, with the
            numbers, at the line that calls `scheduler.step()`. Quiet: schedules stepped per epoch, per-iteration
            schedules whose horizon spans the run
            (OneCycleLR, warm-up, cosine over all steps), the periodic families (cosine annealing, warm
            restarts, cyclic) whose low point each epoch is by design, `ReduceLROnPlateau`, and one-epoch runs.
        """,
    },
    since="0.1.0",
)

_PERIODIC = ("CosineAnnealingLR", "CosineAnnealingWarmRestarts", "CyclicLR", "OneCycleLR")
MIN_EPOCH_STEPS = 10


class _Counted:
    def __init__(self, scheduler: Any, optimizer: Any, base_lr: float, line: tuple[str, int]) -> None:
        self.ref = weakref.ref(scheduler)
        self.optimizer, self.base_lr, self.steps, self.line = optimizer, base_lr, 0, line


@SCHEDULER_STEPPED_PER_BATCH.runtime
class SchedulerSteppedPerBatch(RuntimeCheck):
    """Scheduler steps per optimizer step over the first epoch of the loader that drives training, and how
    far the LR fell in it. A loader drives training when scheduler steps happen while one of its passes is
    under way (its iterator alive and not exhausted): an eval loader run mid-epoch never ends an epoch."""

    needs_optimizer = True

    def on_start(self) -> None:
        import torch

        self.counted: dict[int, _Counted] = {}
        self.first_pass: dict[int, tuple[int, dict[int, int]]] = {}  # id(loader) -> (steps, scheduler steps)
        self.done: set[int] = set()
        self.passes: list[tuple[int, Any]] = []  # (id(loader), weak iterator) of the latest passes, newest first
        self.drove: set[int] = set()  # loaders whose current pass saw a scheduler step
        base = getattr(torch.optim.lr_scheduler, "LRScheduler", None) or torch.optim.lr_scheduler._LRScheduler
        # also with no optimizer yet: `torchdoctor run` (and watch) adopt optimizers as they step
        self.ctx.hooks.add(MethodPatch(base, "step", after=self._stepped))

    def _stepped(self, cls: Any, args: tuple, kwargs: dict) -> None:
        """Runs in the user's scheduler.step(): counts only."""
        scheduler = args[0] if args else None
        try:
            key = id(scheduler)
            counted = self.counted.get(key)
            if counted is None or counted.ref() is not scheduler:
                inner = unwrap_optimizer(getattr(scheduler, "optimizer", None))[0]
                wo = next((wo for wo in self.ctx.optimizers if wo.optimizer is inner), None)
                base_lrs = getattr(scheduler, "base_lrs", None)
                if wo is None or not base_lrs or type(scheduler).__name__ in _PERIODIC:
                    return
                counted = self.counted[key] = _Counted(scheduler, wo, float(base_lrs[0]), user_line())
            counted.steps += 1
            driving = self._driving_pass()
            if driving is not None:
                self.drove.add(driving)
        except Exception as exc:  # never break the user's scheduler.step()
            self.ctx.fault(self, exc)

    def _driving_pass(self) -> Any:
        """The loader whose pass is under way: the newest pass whose iterator is alive and not exhausted."""
        for key, ref in self.passes:
            iterator = ref() if ref is not None else None
            if iterator is None:
                continue
            yielded = getattr(iterator, "_num_yielded", None)
            try:
                total = len(iterator)
            except TypeError:  # an IterableDataset without a length: under way while alive
                total = None
            if yielded is None or total is None or yielded < total:
                return key
        return None

    def on_loader_iter(self, event: LoaderEvent) -> Iterator[Finding]:
        key = id(event.loader)
        try:
            ref: Any = weakref.ref(event.iterator)
        except TypeError:
            ref = None
        self.passes = [(key, ref), *[p for p in self.passes if p[0] != key]][:8]
        drove = key in self.drove
        self.drove.discard(key)
        if key in self.done:
            return
        if key not in self.first_pass or not drove:  # its last pass drove no training step: measure the next one
            self.first_pass[key] = (self.ctx.step, {k: c.steps for k, c in self.counted.items()})
            return
        self.done.add(key)
        start, sched_start = self.first_pass.pop(key)
        epoch_steps = self.ctx.step - start
        if epoch_steps < MIN_EPOCH_STEPS:
            return
        for k, c in self.counted.items():
            scheduler = c.ref()
            stepped = c.steps - sched_start.get(k, 0)
            if scheduler is None or stepped < 0.9 * epoch_steps:
                continue
            lr = float(c.optimizer.optimizer.param_groups[0]["lr"])
            if c.base_lr > 0 and lr <= c.base_lr / 100:
                name = type(scheduler).__name__
                yield Finding(
                    f"{name} was stepped {stepped} times during the first epoch ({epoch_steps} optimizer steps) and "
                    f"has "
                    f"already cut {c.optimizer.label}'s learning rate from {c.base_lr:g} to {lr:g}: a per-epoch "
                    "schedule stepped after every batch.",
                    fix=Fix(
                        title="Step the scheduler once per epoch, after the batch loop:",
                        code="for epoch in range(epochs):\n"
                        "    for x, y in loader:\n"
                        "        ...\n"
                        "        optimizer.step()\n"
                        "    scheduler.step()",
                    ),
                    location=Location(file=c.line[0], line=c.line[1], key=name, step=self.ctx.step),
                )
                return
