"""loss-shape-broadcast: a regression loss whose input and target shapes differ and broadcast to a bigger
tensor ([N, 1] against [N] gives N x N), so it averages every prediction against every target."""
from __future__ import annotations

import math
from typing import Any

from ._losstap import tap_losses, user_location
from torchdoctor.sdk import Example, Finding, Pitfall
from torchdoctor.sdk.runtime import RuntimeCheck

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
            what = (f"they broadcast to {list(full)}, so every prediction is compared with every target of the "
                    "batch and the model learns the mean target.")
        else:
            what = (f"the input is broadcast to {list(full)}, so the same predictions are compared with the "
                    "targets of other samples.")
        fix = (f"Give input and target the same shape, e.g.:\nloss = F.{name}(pred.squeeze(-1), target)"
               if a[-1:] == (1,) and len(a) == len(b) + 1 else
               f"Give input and target the same shape, e.g.:\nloss = F.{name}(pred, target.view_as(pred))")
        self.ctx.emit(self, Finding(f"{name} got input {list(a)} and target {list(b)}: {what}",
                                    fix=fix, location=user_location()))
