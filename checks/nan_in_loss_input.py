"""nan-in-loss-input: BCE or sampling got NaN or values outside [0, 1]; from the forward, the batch, or the weights."""

from __future__ import annotations

from typing import Any, Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import CrashEvent, RuntimeCheck

_SETUP = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 1))  # raw scores, not probabilities
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 8) * 3, torch.rand(16, 1).round()
"""

NAN_IN_LOSS_INPUT = Pitfall(
    code="TD337",
    name="nan-in-loss-input",
    severity="error",
    summary="binary_cross_entropy (or multinomial/bernoulli sampling) got NaN or values outside [0, 1]: raw "
    "scores where probabilities belong, or NaN from the batch or the weights.",
    why="""
        `binary_cross_entropy` takes probabilities. Fed raw scores (a model without a final sigmoid) it
        stops with "all elements of input should be between 0 and 1" (on CUDA, a device-side assert); fed
        NaN, the same. Sampling with `torch.multinomial`/`torch.bernoulli` from NaN probabilities fails
        alike. The NaN comes from the batch (a corrupt sample, a division by zero in preprocessing) or from
        weights that training already broke, and the two need different fixes.
    """,
    fix="""
        Give raw scores to `BCEWithLogitsLoss` / `binary_cross_entropy_with_logits` (numerically safe, no
        sigmoid in the model). For NaN: check the batch (`torch.isfinite(x).all()`), and run
        `torchdoctor.watch` (nonfinite-values) to find the step where NaN began.
    """,
    bad=Example(
        """
        optimizer.zero_grad()
        scores = model(x)  # raw scores, not probabilities
        loss = nn.functional.binary_cross_entropy(scores, y)
        loss.backward()
        optimizer.step()
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        optimizer.zero_grad()
        scores = model(x)  # raw scores, not probabilities
        loss = nn.functional.binary_cross_entropy_with_logits(scores, y)
        loss.backward()
        optimizer.step()
        """,
        setup=_SETUP,
    ),
    details={
        "runtime": """
            When the watched code (or the program, under `torchdoctor run`) ends with binary cross-entropy's
            "between 0 and 1" error (or its CUDA assert, or multinomial/bernoulli's invalid probabilities),
            the check reads the failing call's `input` from the traceback where it is readable (NaN count,
            smallest and largest value) and checks whether the watched models' parameters are still finite,
            to tell raw scores from NaN and a broken batch from broken weights. Quiet for other errors.
        """,
    },
)

_TEXTS = (
    "elements of input should be between 0 and 1",
    "input_val >= zero && input_val <= one",
    "probability tensor contains either `inf`, `nan`",
    "p_in >= 0 && p_in <= 1",
)


@NAN_IN_LOSS_INPUT.runtime
class NanInLossInput(RuntimeCheck):
    """At BCE's or sampling's range error: what the input held, and whether the weights are finite."""

    def on_crash(self, event: CrashEvent) -> Iterator[Finding]:
        from torchdoctor.sdk.runtime import evidence

        exc = event.exception
        if not isinstance(exc, RuntimeError) or not any(t in str(exc) for t in _TEXTS):
            return
        values = _input_values(evidence.frames(exc))
        broken = self._broken_weights()
        if broken:
            cause = f"the weights already hold NaN/Inf ({broken}): training broke them before this step"
            fix = Fix(
                title="Find where NaN began with torchdoctor.watch (nonfinite-values), then lower the learning rate "
                "or clip gradients:",
                code="torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
            )
        elif values is not None and values[0]:
            cause = (
                f"the input holds {values[0]} NaN value(s) while the weights are finite: the NaN came from "
                "this batch or the forward"
            )
            fix = Fix(
                title="Check the batch where it is made:", code="assert torch.isfinite(x).all(), 'a corrupt sample'"
            )
        elif values is not None:
            cause = (
                f"the input ranges from {values[1]:.3g} to {values[2]:.3g}: raw scores, not probabilities "
                "(no sigmoid before the loss)"
            )
            fix = Fix(
                title="Give the raw scores to the with-logits loss (numerically safe):",
                code="loss = nn.functional.binary_cross_entropy_with_logits(scores, y)",
            )
        else:
            cause = "the input could not be read (a CUDA assert leaves it unreadable); the weights are finite"
            fix = Fix(
                title="Use the with-logits loss on raw scores, and check the batch for NaN:",
                code="loss = nn.functional.binary_cross_entropy_with_logits(scores, y)",
            )
        yield Finding(
            f"A loss or sampling call got values outside [0, 1] at step {self.ctx.step}: {cause}.",
            fix=fix,
            location=Location(),
        )

    def _broken_weights(self) -> str:
        import torch

        for wm in self.ctx.models:
            for name, p in wm.named_parameters():
                if p.is_floating_point() and p.device.type != "meta" and not bool(torch.isfinite(p).all()):
                    return f"{wm.label} `{name}`"
        return ""


def _input_values(frames: list[Any]) -> Optional[tuple[int, float, float]]:
    """(NaN count, min, max of the finite values) of the failing call's `input` (or `probs`/`p`), if readable."""
    import torch

    for frame in reversed(frames):
        for key in ("input", "probs", "p"):
            value = frame.f_locals.get(key)
            if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
                try:
                    nan = int(torch.isnan(value).sum())
                    finite = value.detach()[torch.isfinite(value)]
                    low, high = (float(finite.min()), float(finite.max())) if finite.numel() else (0.0, 0.0)
                    return nan, low, high
                except RuntimeError:
                    return None
    return None
