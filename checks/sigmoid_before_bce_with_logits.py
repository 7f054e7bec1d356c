"""sigmoid-before-bce-with-logits: a sigmoid's output fed to BCEWithLogitsLoss, which applies the sigmoid itself."""

from __future__ import annotations

from typing import Any, Iterator

from torchdoctor.sdk import Example, Finding, Fix, Pitfall
from torchdoctor.sdk.runtime import RuntimeCheck
from torchdoctor.sdk.source import SourceFile

from ._activation_source import Activation, evidence, first_argument, fixed_line, loss_calls
from ._losstap import activation_argument, produced_by, tap_losses, user_location
from ._losstap import fixed_line as fixed_user_line

_SETUP = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
criterion = nn.BCEWithLogitsLoss()
x_all = torch.randn(256, 8)
y_all = (x_all[:, 0] + x_all[:, 1] > 0).float().unsqueeze(1)
loader = [(x_all[i:i + 32], y_all[i:i + 32]) for i in range(0, 256, 32)]
"""

SIGMOID_BEFORE_BCE_WITH_LOGITS = Pitfall(
    code="TD321",
    name="sigmoid-before-bce-with-logits",
    severity="error",
    summary="A sigmoid's output is fed to BCEWithLogitsLoss, which applies the sigmoid itself, so the model "
    "learns slowly and can never be confident.",
    why="""
        `nn.BCEWithLogitsLoss` / `F.binary_cross_entropy_with_logits` take raw scores (logits) and apply the
        sigmoid inside, in a numerically stable way. Given a sigmoid's output, they compute
        `sigmoid(sigmoid(z))`, which lies between 0.5 and 0.73: the predicted probability of the positive class
        can never drop below one half, the loss never approaches 0, and the gradients are a fraction of what
        they should be. Training goes on without an error and ends worse.
    """,
    fix="""
        Feed the logits to `BCEWithLogitsLoss` (apply `torch.sigmoid` only where you need probabilities, for
        metrics or at inference), or keep the sigmoid and use `nn.BCELoss`.
    """,
    bad=Example(
        """
        for x, target in loader:
            optimizer.zero_grad()
            logits = model(x)
            loss = criterion(torch.sigmoid(logits), target)
            loss.backward()
            optimizer.step()
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        for x, target in loader:
            optimizer.zero_grad()
            logits = model(x)
            loss = criterion(logits, target)
            loss.backward()
            optimizer.step()
        """,
        setup=_SETUP,
    ),
    details={
        "runtime": """
            Every `every`-th call of `torch.nn.functional.binary_cross_entropy_with_logits` (which
            `BCEWithLogitsLoss` calls) is looked at: its input is reported when its autograd history ends in a
            sigmoid (`SigmoidBackward0`, through views and reshapes). Values alone do not decide (logits may
            happen to lie in [0, 1]), so an input without autograd history is not judged. A sigmoid in front of
            `BCELoss` is correct and quiet (that loss is not looked at).
        """,
        "source": """
            A call of `F.binary_cross_entropy_with_logits`, of `nn.BCEWithLogitsLoss()`, or of a name every binding
            of which builds one, is reported when the source shows its input to be a sigmoid's output: the
            sigmoid call itself (`torch.sigmoid`, `F.sigmoid`, `x.sigmoid()`, `nn.Sigmoid()(x)`), a name last
            bound to one in the same function, or the output of a model built in the file as
            `nn.Sequential(..., nn.Sigmoid())` or from a project class whose `forward` returns a sigmoid on every
            `return`. A sigmoid in front of `BCELoss` is correct and quiet.
        """,
    },
)


@SIGMOID_BEFORE_BCE_WITH_LOGITS.runtime
class SigmoidBeforeBceWithLogits(RuntimeCheck):
    """Every `every`-th binary_cross_entropy_with_logits call: an input whose history ends in a sigmoid."""

    def on_start(self) -> None:
        self.reported = False
        tap_losses(self, ("binary_cross_entropy_with_logits",), self._loss)

    def _loss(self, name: str, inp: Any, target: Any, kwargs: dict) -> None:
        if self.reported or produced_by(inp, ("SigmoidBackward0",)) is None:
            return
        self.reported = True
        where = user_location()
        line = fixed_user_line(
            where, lambda call, text: activation_argument(call, text, ("sigmoid", "expit"), "Sigmoid")
        )
        self.ctx.emit(
            self,
            Finding(
                "binary_cross_entropy_with_logits was given a sigmoid's output: it applies the sigmoid itself, so "
                "this is sigmoid(sigmoid(z)), which never drops below 0.5; the loss can't approach 0 and its "
                "gradients shrink.",
                fix=Fix(
                    title="Pass the logits; drop the sigmoid in front of the loss:",
                    code=line or "loss = criterion(logits, target)",
                ),
                location=where,
            ),
        )


_SIGMOID = Activation(frozenset({"sigmoid", "expit"}), "Sigmoid")


@SIGMOID_BEFORE_BCE_WITH_LOGITS.source
def sigmoid_before_bce_with_logits(src: SourceFile) -> Iterator[Finding]:
    """A binary_cross_entropy_with_logits call whose input the source shows to be a sigmoid's output."""
    if src.tree is None or ("with_logits" not in src.text and "BCEWithLogitsLoss" not in src.text):
        return
    for scope, call, loss, inp in loss_calls(
        src, frozenset({"binary_cross_entropy_with_logits"}), frozenset({"BCEWithLogitsLoss"})
    ):
        found = evidence(src, scope, call, inp, _SIGMOID)
        if found is None:
            continue
        tensor = first_argument(src, found.node)
        line = fixed_line(src, call, found, tensor) if tensor else None
        fix = (
            Fix(title=f"Pass the logits: {loss} applies the sigmoid itself:", code=line)
            if line
            else Fix(
                title="Pass the logits: return them from the model (apply sigmoid only for probabilities at "
                "inference):",
                code="return self.head(features)  # logits; no sigmoid before BCEWithLogitsLoss",
            )
        )
        yield Finding(
            f"`{src.snippet(call.node)}`: its input {found.how} a sigmoid, but {loss} applies the sigmoid itself: "
            "sigmoid(sigmoid(z)) never drops below 0.5 and the gradients shrink.",
            fix=fix,
            location=src.location(call.node),
        )
