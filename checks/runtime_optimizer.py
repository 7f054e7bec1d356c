"""Runtime checks on the optimizer/model wiring: zero_grad, stale or missing parameters, state placement."""
from __future__ import annotations

import weakref
from typing import Any, Iterator

from torchdoctor.findings import Finding, Location, Severity
from torchdoctor.registry import Scope, check
from torchdoctor.watch.contract import RuntimeCheck, StepEvent, ZeroGradEvent

LOOP_ORDER = """for x, y in loader:
    optimizer.zero_grad()          # or model.zero_grad(); set_to_none is fine
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()"""


class _Sentinel:
    """Per optimizer: one small parameter whose gradient tells whether grads were cleared between steps."""

    def __init__(self, param: Any) -> None:
        self.param = weakref.ref(param)
        self.stepped = False   # a step() was seen since the sentinel was chosen
        self.cleared = False   # a zero_grad() or an empty/zero gradient was seen since the last step
        self.backwards = 0     # backward passes into the sentinel since the last step
        self.zero_flags: list[Any] = []  # one-element bool tensors: "grad was all zero before this backward"


@check(code="TD301", name="missing-zero-grad", scope=Scope.RUNTIME, severity="error",
       summary="optimizer.step() applies gradients that still hold those of the previous step (no zero_grad).")
class MissingZeroGrad(RuntimeCheck):
    """Before each backward into a sentinel parameter, note whether its .grad was cleared since the last
    step; at the next step, flag when it never was. Accumulation (several backwards, one step) is fine."""

    def on_start(self) -> None:
        self.sentinels: dict[int, _Sentinel] = {}

    def on_step_pre(self, event: StepEvent) -> Iterator[Finding]:
        s = self.sentinels.get(id(event.optimizer))
        param = s.param() if s is not None else None
        if s is None or param is None:
            self._choose(event)
            return
        if not s.stepped or s.backwards == 0 or s.cleared:
            return
        if any(bool(flag) for flag in s.zero_flags):  # a host sync only on this rare path
            return
        name = self.ctx.param_name(param) or "a parameter"
        yield Finding(
            f"{event.optimizer.label}.step() applied gradients that still contained those of the previous step: "
            f"the gradient of `{name}` was not cleared after the last step() (no zero_grad() was seen), "
            "so gradients add up across steps and the updates grow.",
            fix="Clear the gradients once per optimizer step:\n" + LOOP_ORDER,
            location=Location(param=name, step=event.step))

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
        with_grad = [p for p in event.optimizer.params() if p.grad is not None and p.requires_grad]
        if not with_grad:
            return
        param = min(with_grad, key=lambda p: p.numel())
        s = _Sentinel(param)
        self.sentinels[id(event.optimizer)] = s
        self.ctx.hooks.add(param.register_hook(lambda grad, s=s: self._before_accumulate(s)))

    def _before_accumulate(self, s: _Sentinel) -> None:
        """Runs inside backward, just before the gradient is added into ``param.grad``."""
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


@check(code="TD302", name="stale-optimizer-params", scope=Scope.RUNTIME, severity="error",
       summary="The optimizer updates Parameter objects that are no longer in the model.")
class StaleOptimizerParams(RuntimeCheck):
    """Compare the optimizer's parameter identities with the model's, at start and every `every` steps."""

    def on_start(self) -> Iterator[Finding]:
        self.reported: set[frozenset[int]] = set()
        yield from self._check()

    def on_periodic(self, event: StepEvent) -> Iterator[Finding]:
        yield from self._check()

    def _check(self) -> Iterator[Finding]:
        model_ids = self.ctx.model_param_ids()
        held = self.ctx.optimizer_param_ids()
        lone = len(self.ctx.models) == 1 and len(self.ctx.optimizers) == 1
        for wo in self.ctx.optimizers:
            foreign = [(g, i, p) for g, group in enumerate(wo.optimizer.param_groups)
                       for i, p in enumerate(group["params"]) if id(p) not in model_ids]
            if not foreign or frozenset(id(p) for _, _, p in foreign) in self.reported:
                continue
            if len(foreign) == len(wo.params()) and not lone:
                continue  # maybe the optimizer of a model that was not given to watch()
            self.reported.add(frozenset(id(p) for _, _, p in foreign))
            orphans = {tuple(p.shape): name for wm in self.ctx.models for name, p in wm.named_parameters()
                       if p.requires_grad and id(p) not in held}
            listed = ", ".join(f"param_groups[{g}]['params'][{i}] {tuple(p.shape)}" for g, i, p in foreign[:4])
            twins = [orphans[tuple(p.shape)] for _, _, p in foreign if tuple(p.shape) in orphans]
            guess = (f" The model's `{'`, `'.join(twins[:4])}` (same shape, in no optimizer) were probably re-bound "
                     "after the optimizer was built.") if twins else ""
            yield Finding(
                f"{wo.label} updates {len(foreign)} of its {len(wo.params())} parameters that are not in the model "
                f"any more ({listed}{', ...' if len(foreign) > 4 else ''}): its steps change nothing the model uses."
                + guess,
                fix="Build the optimizer after the last change to the model (re-assigning a layer, "
                    "replacing or re-wrapping the model):\n"
                    "model.fc = nn.Linear(512, 10)\n"
                    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                    "or change weights in place: `with torch.no_grad(): model.fc.weight.copy_(w)`",
                location=Location(param=twins[0] if twins else None, step=self.ctx.step))


@check(code="TD303", name="param-not-in-optimizer", scope=Scope.RUNTIME, severity="warning",
       summary="A trainable parameter receives gradients but no optimizer holds it, so it never changes.")
class ParamNotInOptimizer(RuntimeCheck):
    """Every `every` steps: parameters of a model some optimizer trains that have a .grad but no optimizer."""

    def on_start(self) -> None:
        self.reported: set[str] = set()

    def on_periodic(self, event: StepEvent) -> Iterator[Finding]:
        held = self.ctx.optimizer_param_ids()
        for wm in self.ctx.models:
            params = list(wm.named_parameters())
            if not any(id(p) in held for _, p in params):
                continue  # no optimizer given to watch() trains this model
            missing = [name for name, p in params
                       if p.requires_grad and p.grad is not None and id(p) not in held and name not in self.reported]
            if not missing:
                continue
            self.reported.update(missing)
            names = ", ".join(f"`{n}`" for n in missing[:6]) + (", ..." if len(missing) > 6 else "")
            yield Finding(
                f"{len(missing)} parameter(s) of {wm.label} receive gradients but no optimizer given to watch() "
                f"holds them, so they never change: {names}.",
                fix="Build the optimizer from all parameters (after adding layers), or freeze them:\n"
                    "optimizer = torch.optim.AdamW(model.parameters())\n"
                    "# or: model.head.requires_grad_(False)",
                location=Location(module=wm.label, param=missing[0], step=event.step))


@check(code="TD304", name="optimizer-state-device", scope=Scope.RUNTIME, severity="error",
       summary="Optimizer state (momentum, exp_avg, ...) lives on another device or dtype than its parameter.")
class OptimizerStateDevice(RuntimeCheck):
    """At start and every `every` steps: compare state tensors with their parameters (metadata only, no sync)."""

    def on_start(self) -> Iterator[Finding]:
        self.reported: set[tuple[str, str]] = set()
        for wo in self.ctx.optimizers:
            yield from self._check(wo)

    def on_periodic(self, event: StepEvent) -> Iterator[Finding]:
        yield from self._check(event.optimizer)

    def _check(self, wo: Any) -> Iterator[Finding]:
        builtin = type(wo.optimizer).__module__.startswith("torch.optim")
        bad: list[tuple[Any, str, Any]] = []
        for p in wo.params():
            for key, value in wo.optimizer.state.get(p, {}).items():
                if getattr(value, "shape", None) != p.shape or value.dim() == 0:
                    continue  # scalars such as Adam's `step` live on the CPU on purpose
                if value.device != p.device or (builtin and value.is_floating_point() and p.is_floating_point()
                                                and value.dtype != p.dtype):
                    bad.append((p, key, value))
        if not bad:
            return
        p, key, value = bad[0]
        what = "device" if value.device != p.device else "dtype"
        if (wo.label, what) in self.reported:
            return
        self.reported.add((wo.label, what))
        name = self.ctx.param_name(p) or "a parameter"
        got, want = (value.device, p.device) if what == "device" else (value.dtype, p.dtype)
        yield Finding(
            f"{wo.label} state `{key}` of `{name}` is on {got} but the parameter is on {want} "
            f"({len(bad)} state tensor(s) affected): the state was loaded or created before the model was moved "
            "or cast, and step() will fail or mix precisions.",
            fix="Move the model first, then build the optimizer and load its state:\n"
                "model.to(device)\n"
                "optimizer = torch.optim.Adam(model.parameters())\n"
                "optimizer.load_state_dict(ckpt['optimizer'])  # casts state to each parameter's device",
            location=Location(param=name, key=str(key), device=str(p.device), step=self.ctx.step))


@check(code="TD305", name="unused-parameters", scope=Scope.RUNTIME, severity="info",
       summary="Parameters the optimizer holds never receive a gradient over several checked steps.")
class UnusedParameters(RuntimeCheck):
    """Every `every` steps: optimizer parameters of the model whose .grad is None at step time."""

    checks_needed = 3

    def on_start(self) -> None:
        self.misses: dict[int, int] = {}
        self.reported: set[int] = set()

    def on_periodic(self, event: StepEvent) -> Iterator[Finding]:
        in_model = self.ctx.model_param_ids()
        unused: list[str] = []
        for p in event.optimizer.params():
            if not p.requires_grad or id(p) not in in_model:
                continue
            if p.grad is not None:
                self.misses.pop(id(p), None)
                continue
            self.misses[id(p)] = n = self.misses.get(id(p), 0) + 1
            if n >= self.checks_needed and id(p) not in self.reported:
                self.reported.add(id(p))
                unused.append(self.ctx.param_name(p) or "?")
        if not unused:
            return
        ddp = any("DistributedDataParallel" in wm.wrappers for wm in self.ctx.models)
        names = ", ".join(f"`{n}`" for n in unused[:6]) + (", ..." if len(unused) > 6 else "")
        yield Finding(
            f"{len(unused)} parameter(s) in {event.optimizer.label} got no gradient at {self.checks_needed} checked "
            f"steps in a row: {names}. A branch of the model is not used by forward()"
            + (" (DDP needs find_unused_parameters=True for that)." if ddp else "."),
            fix="Remove the unused layers, or freeze them so that nobody expects them to learn:\n"
                "model.unused_head.requires_grad_(False)",
            location=Location(param=unused[0], step=event.step),
            severity=Severity.WARNING if ddp else None)
