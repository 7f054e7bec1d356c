"""update-underflow: parameters that receive gradients but never change: bf16/fp16 weights whose updates
round away (below half their precision), or a learning rate of 0."""

from __future__ import annotations

import statistics
import weakref
from typing import Any, Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import RuntimeCheck, StepEvent

_SETUP = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).to(torch.bfloat16)  # pure bf16 weights
optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
x_all = torch.randn(512, 16)
y_all = x_all @ torch.linspace(-1, 1, 16)
loader = [(x_all[i:i + 64], y_all[i:i + 64]) for i in range(0, 512, 64)]
"""

_LOOP = """
for epoch in range(4):
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x.to(model[0].weight.dtype)).float().squeeze(-1), y)
        loss.backward()
        optimizer.step()
"""

UPDATE_UNDERFLOW = Pitfall(
    code="TD324",
    name="update-underflow",
    severity="warning",
    summary="Parameters receive gradients but the optimizer's steps leave them unchanged: bf16/fp16 weights whose "
    "updates are below half their precision, or a learning rate of 0.",
    why="""
        A step adds `-lr * update` to each weight and rounds the result to the weight's dtype. bfloat16 keeps 8
        significant bits: near a weight of 0.05 its numbers are 0.0002 apart, so any update smaller than 0.0001
        rounds back to the same weight. Pure-bf16 (or fp16) training with a small learning rate therefore loses
        most of its updates: the loss stalls while every step "succeeds". The general case is the same symptom
        from another cause: a learning rate of 0 (a scheduler that reached 0, a group built with `lr=0`), or
        fp32 weights so large against their updates that they round away too.
    """,
    fix="""
        Keep fp32 master weights and compute in low precision: leave the model in fp32 and use
        `torch.autocast(device_type, dtype=torch.bfloat16)` (mixed precision). If the weights must stay in bf16,
        use an optimizer with stochastic rounding or Kahan summation, or a larger learning rate. For a learning
        rate of 0, check the scheduler and the parameter groups.
    """,
    bad=Example(_LOOP, setup=_SETUP),
    good=Example(
        "model.float()  # fp32 master weights (compute in bf16 under torch.autocast for speed)" + _LOOP,
        setup=_SETUP,
    ),
    details={
        "runtime": """
            Every `every` steps of each watched optimizer, just before its step, up to 32 evenly spaced elements
            of every parameter it holds that has a gradient are copied, with where their gradient is non-zero;
            right after the step they are compared (one host sync per device); an optimizer with neither a
            bf16/fp16 parameter nor a learning rate of 0 is not sampled at all (nothing in it could be judged).
            A parameter at least half of whose
            sampled elements with a non-zero gradient (at least 4) did not change is stuck for that check; a
            parameter stuck at 3 checks in a row spanning at least 20 steps is reported when it is stored in
            bf16/fp16 (its updates fell below half its precision) or its learning rate is 0. Quiet: fp32 weights
            whose updates round away (huge embeddings under a tiny learning rate; too often harmless to judge),
            frozen parameters (no gradient), parameters whose sampled gradient is below 1e-4 of the median
            parameter's (a bias in front of a BatchNorm gets only rounding noise), parameters no watched
            optimizer holds, a learning-rate warm-up from 0 over a few steps, and steps that GradScaler skips
            (the optimizer's step never runs).
        """,
    },
)

_SAMPLES = 32
_MIN_SAMPLED = 4
_STUCK_SHARE = 0.5
_CHECKS_IN_A_ROW = 3
_MIN_SPAN = 20
_LISTED = 6
_LOW_PRECISION = ("torch.bfloat16", "torch.float16")
_NOISE = 1e-4  # a parameter whose gradient is this small against the median parameter's has none to speak of


class _Pending:
    """One optimizer's snapshot between its step's pre and post hooks: sampled values and non-zero-grad masks."""

    def __init__(self) -> None:
        self.params: list[tuple["weakref.ReferenceType[Any]", int, Any, Any, Any, float]] = []


def _sample(flat: Any, stride: int) -> Any:
    return flat[::stride][:_SAMPLES]


def _judgeable(groups: Any) -> bool:
    """Whether a step of these parameter groups could be judged at all: a group with a learning rate of 0 or
    a bf16/fp16 parameter (fp32 steps are not judged, see `_judge`); otherwise nothing is sampled."""
    for group in groups:
        lr = group.get("lr", 0.0)
        if not isinstance(lr, (int, float)) or lr == 0:  # a tensor learning rate is read when sampled
            return True
        if any(str(getattr(p, "dtype", "")) in _LOW_PRECISION for p in group["params"]):
            return True
    return False


def _flat(tensor: Any) -> Any:
    """The elements this process holds, flattened: a DTensor's (FSDP2) local shard, else the tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return (to_local() if callable(to_local) else tensor).detach().reshape(-1)


@UPDATE_UNDERFLOW.runtime
class UpdateUnderflow(RuntimeCheck):
    """Every `every` steps: sampled elements with a gradient that the step did not change."""

    def on_start(self) -> None:
        self.pending: dict[int, _Pending] = {}
        self.stuck: dict[int, tuple[int, int]] = {}  # id(param) -> (checks in a row, step of the first)
        self.reported: set[int] = set()  # ids of optimizers already reported (once each)

    def on_periodic(self, event: StepEvent) -> None:
        import torch

        if id(event.optimizer) in self.reported or not _judgeable(event.optimizer.optimizer.param_groups):
            return
        pending = _Pending()
        with torch.no_grad():
            for group in event.optimizer.optimizer.param_groups:
                lr = group.get("lr", 0.0)
                lr = float(lr) if not isinstance(lr, torch.Tensor) else float(lr.item())
                for p in group["params"]:
                    grad = p.grad
                    if (
                        not isinstance(p, torch.Tensor)
                        or grad is None
                        or grad.is_sparse
                        or not p.is_floating_point()
                        or p.numel() == 0
                        or grad.shape != p.shape
                        or p.is_meta
                    ):
                        continue
                    values, grads = _flat(p), _flat(grad)
                    if values.numel() == 0 or values.shape != grads.shape:
                        continue
                    stride = max(1, values.numel() // _SAMPLES)
                    before = _sample(values, stride).clone()
                    grads = _sample(grads, stride)
                    pending.params.append((weakref.ref(p), stride, before, grads != 0, grads.abs().float().mean(), lr))
        if pending.params:
            self.pending[id(event.optimizer)] = pending

    def on_step_post(self, event: StepEvent) -> Optional[Iterator[Finding]]:
        pending = self.pending.pop(id(event.optimizer), None)
        if pending is None:
            return None
        return self._judge(event, pending)

    def _judge(self, event: StepEvent, pending: _Pending) -> Iterator[Finding]:
        import torch

        counts: dict[Any, list[Any]] = {}  # device -> [changed, sampled] per parameter: one host sync per device
        kept: dict[Any, list[tuple[Any, float]]] = {}
        with torch.no_grad():
            for ref, stride, before, moved, scale, lr in pending.params:
                p = ref()
                if p is None:
                    continue
                after = _sample(_flat(p), stride)
                if after.shape != before.shape:
                    continue
                counts.setdefault(p.device, []).append(
                    torch.stack([((after != before) & moved).sum().float(), moved.sum().float(), scale])
                )
                kept.setdefault(p.device, []).append((p, lr))
        judged = [
            (param, numbers)
            for device, rows in counts.items()
            for param, numbers in zip(kept[device], torch.stack(rows).tolist())
        ]
        if not judged:
            return
        typical = statistics.median(numbers[2] for _, numbers in judged)
        step = event.step
        stuck_now: list[tuple[Any, float]] = []
        for (p, lr), (changed, sampled, scale) in judged:
            if lr != 0 and str(p.dtype) not in _LOW_PRECISION:
                continue  # fp32 steps that round away (huge weights, tiny updates) are not judged: too often harmless
            if sampled < _MIN_SAMPLED or changed > (1 - _STUCK_SHARE) * sampled or scale < _NOISE * typical:
                # too few elements to judge, moving, or a gradient that is numerically zero (a bias before a
                # BatchNorm gets only rounding noise: its steps may leave it unchanged, harmlessly)
                self.stuck.pop(id(p), None)
                continue
            row, first = self.stuck.get(id(p), (0, step))
            self.stuck[id(p)] = (row + 1, first)
            if row + 1 >= _CHECKS_IN_A_ROW and step - first >= _MIN_SPAN:
                stuck_now.append((p, lr))
        if stuck_now:
            yield from self._report(event, stuck_now)

    def _report(self, event: StepEvent, stuck: list[tuple[Any, float]]) -> Iterator[Finding]:
        import torch

        self.reported.add(id(event.optimizer))
        names = [self.ctx.param_name(p) or f"{tuple(p.shape)}" for p, _ in stuck]
        listed = ", ".join(f"`{n}`" for n in names[:_LISTED]) + (", ..." if len(names) > _LISTED else "")
        since = self.stuck[id(stuck[0][0])][1]
        low = [(q, r) for q, r in stuck if r != 0]  # the others have lr 0; these are bf16/fp16 (see _judge)
        label = event.optimizer.label
        if not low:
            cause = f"the learning rate of {label} is 0"
            fix = Fix(
                title="Check the scheduler and the parameter groups: the learning rate must be above 0 after warm-up:",
                code="print([g['lr'] for g in optimizer.param_groups])",
            )
        else:
            q, lr = low[0]
            with torch.no_grad():
                scale = float(q.detach().abs().float().mean())
            spacing = torch.finfo(q.dtype).eps * scale
            cause = (
                f"they are stored in {str(q.dtype).replace('torch.', '')}, whose numbers near their size "
                f"(mean |w| {scale:.2g}) are {spacing:.2g} apart: the updates "
                f"(lr {lr:g}) fall below half of that and round away"
            )
            fix = Fix(
                title="Keep fp32 master weights and compute in bf16 with autocast:",
                code="model.float()  # fp32 master weights (compute in bf16 under torch.autocast for speed)",
            )
        yield Finding(
            f"{len(stuck)} parameter(s) held by {label} have received gradients since step {since}, but its "
            f"steps leave them unchanged: {cause}. Stuck: {listed}.",
            fix=fix,
            location=Location(key=label, step=event.step),
        )
