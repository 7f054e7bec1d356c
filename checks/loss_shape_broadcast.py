"""loss-shape-broadcast: a regression loss whose input and target shapes differ and broadcast to a bigger
tensor ([N, 1] against [N] gives N x N), so it averages every prediction against every target."""

from __future__ import annotations

import ast
import math
from typing import Any, Optional

from torchdoctor.sdk import Example, Finding, Fix, Pitfall
from torchdoctor.sdk.runtime import RuntimeCheck

from ._losstap import fixed_line, segment, tap_losses, user_location

_SETUP = """
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
x_all = torch.randn(256, 4)
y_all = x_all @ torch.tensor([1.0, -2.0, 0.5, 3.0])          # shape [256]: one target per sample
loader = [(x_all[i:i + 32], y_all[i:i + 32]) for i in range(0, 256, 32)]
"""

_REGRESSION = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")

LOSS_SHAPE_BROADCAST = Pitfall(
    code="TD322",
    name="loss-shape-broadcast",
    severity="error",
    summary="A regression loss gets input and target of different shapes that broadcast ([N, 1] against [N] "
    "gives an N x N loss), so the model learns to predict the mean target.",
    why="""
        `mse_loss`, `l1_loss`, `smooth_l1_loss` and `huber_loss` broadcast their input against their target.
        A model that returns `[N, 1]` compared with targets of shape `[N]` gives an `[N, N]` tensor: every
        prediction against every target of the batch. The mean of that is minimised by predicting the batch's
        average target for every sample, so the loss plateaus and the model learns nothing about the inputs.
        torch emits a `UserWarning` that points inside torch and is easy to miss among others.
    """,
    fix="""
        Make the shapes equal before the loss: `pred.squeeze(-1)` (or `target.unsqueeze(-1)`, or
        `target.view_as(pred)`).
    """,
    bad=Example(
        """
        for x, target in loader:
            optimizer.zero_grad()
            pred = model(x)
            loss = F.mse_loss(pred, target)
            loss.backward()
            optimizer.step()
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        for x, target in loader:
            optimizer.zero_grad()
            pred = model(x)
            loss = F.mse_loss(pred.squeeze(-1), target)
            loss.backward()
            optimizer.step()
        """,
        setup=_SETUP,
    ),
    details={
        "runtime": """
            Every `every`-th call of `torch.nn.functional.mse_loss`, `l1_loss`, `smooth_l1_loss` and `huber_loss`
            (the loss modules call them) compares the shapes of input and target (no host sync): reported when
            they differ and broadcast to a tensor bigger than both (`[N, 1]` against `[N]`), or when the input
            (the prediction) is the one expanded (`[1, C]` against `[N, C]`). Equal shapes, a target that only
            expands to the input's shape (a scalar, or `[C]` against `[N, C]`, which gives the same mean; also
            `[N, 1, ...]` against `[N, K, ...]`, which multi-hypothesis losses do on purpose) and
            `reduction="none"` (the caller handles the elementwise result) are quiet.
        """,
    },
)


@LOSS_SHAPE_BROADCAST.runtime
class LossShapeBroadcast(RuntimeCheck):
    """Every `every`-th regression loss call: input and target shapes that broadcast to something bigger."""

    def on_start(self) -> None:
        self.reported: set[tuple[str, tuple[int, ...], tuple[int, ...]]] = set()
        tap_losses(self, _REGRESSION, self._loss)

    def _loss(self, name: str, inp: Any, target: Any, kwargs: dict) -> None:
        import torch

        if not isinstance(inp, torch.Tensor) or not isinstance(target, torch.Tensor) or inp.shape == target.shape:
            return
        if kwargs.get("reduction", "mean") == "none" or kwargs.get("reduce", True) is False:
            return
        try:
            shape = torch.broadcast_shapes(inp.shape, target.shape)
        except RuntimeError:
            return  # torch raises its own error
        a, b, full = tuple(inp.shape), tuple(target.shape), tuple(shape)
        if full == a or (name, a, b) in self.reported:
            return  # only the target expands (a scalar, `[C]` against `[N, C]`, ...): the same mean
        self.reported.add((name, a, b))
        if math.prod(full) > max(math.prod(a), math.prod(b)):
            what = (
                f"they broadcast to {list(full)}, so every prediction is compared with every target of the "
                "batch and the model learns the mean target."
            )
        else:
            what = (
                f"the input is broadcast to {list(full)}, so the same predictions are compared with the "
                "targets of other samples."
            )
        where = user_location()
        squeeze = a[-1:] == (1,) and len(a) == len(b) + 1
        if math.prod(a) != math.prod(b):
            fix = Fix(
                title="Check that the prediction has one row per target (the model's batch and the target's):",
                code="assert pred.shape == target.shape, (pred.shape, target.shape)",
            )
        else:
            line = fixed_line(where, lambda call, text: _same_shape(call, text, squeeze))
            fix = Fix(
                title="Give input and target the same shape:",
                code=line
                or (
                    f"loss = F.{name}(pred.squeeze(-1), target)"
                    if squeeze
                    else f"loss = F.{name}(pred, target.view_as(pred))"
                ),
            )
        self.ctx.emit(
            self, Finding(f"{name} got input {list(a)} and target {list(b)}: {what}", fix=fix, location=where)
        )


def _same_shape(call: ast.Call, text: str, squeeze: bool) -> Optional[str]:
    """The loss call of the user's line with `pred.squeeze(-1)` (or `target.view_as(pred)`) in it."""
    func = call.func
    named = func.func if isinstance(func, ast.Call) else func  # `nn.MSELoss()(pred, target)`
    name = named.attr if isinstance(named, ast.Attribute) else named.id if isinstance(named, ast.Name) else ""
    if len(call.args) < 2 or not (name in _REGRESSION or "loss" in name.lower() or "crit" in name.lower()):
        return None
    pred, target = (segment(text, arg) for arg in call.args[:2])
    if not isinstance(call.args[0], (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
        pred = f"({pred})"
    args = [f"{pred}.squeeze(-1)", target] if squeeze else [pred, f"{target}.view_as({pred})"]
    rest = [segment(text, arg) for arg in call.args[2:]] + [segment(text, kw) for kw in call.keywords]
    return f"{segment(text, func)}({', '.join(args + rest)})"
