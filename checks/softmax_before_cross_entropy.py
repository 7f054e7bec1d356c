"""softmax-before-cross-entropy: probabilities fed to cross_entropy (which applies log_softmax itself) or to
nll_loss (which expects log-probabilities): the loss is computed on the wrong quantity and learning stalls."""

from __future__ import annotations

import ast
from typing import Any, Iterator, Optional

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
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
criterion = nn.CrossEntropyLoss()
x_all = torch.randn(256, 8)
y_all = (x_all[:, :4] * torch.tensor([1.0, -1.0, 2.0, 0.5])).argmax(dim=1)
loader = [(x_all[i:i + 32], y_all[i:i + 32]) for i in range(0, 256, 32)]
"""

SOFTMAX_BEFORE_CROSS_ENTROPY = Pitfall(
    code="TD320",
    name="softmax-before-cross-entropy",
    severity="error",
    summary="Probabilities (a softmax's output) are fed to cross_entropy or nll_loss, which expect logits or "
    "log-probabilities, so the model learns slowly and badly.",
    why="""
        `nn.CrossEntropyLoss` / `F.cross_entropy` apply `log_softmax` to their input themselves: they expect raw
        scores (logits). Given probabilities, they compute a softmax of a softmax: every input lies in [0, 1],
        the loss can never get close to 0, and its gradients shrink by up to the number of classes, so training
        crawls and ends worse, with no error (pytorch/pytorch#55902). `nn.NLLLoss` / `F.nll_loss` expect
        log-probabilities: given probabilities, it minimises `-p` instead of `-log p`, which barely punishes
        confident mistakes.
    """,
    fix="""
        Feed the logits: drop the softmax in front of `cross_entropy` (apply `softmax` only where you need
        probabilities, e.g. for reporting or at inference), or use `log_softmax` in front of `nll_loss`.
    """,
    bad=Example(
        """
        for x, target in loader:
            optimizer.zero_grad()
            logits = model(x)
            loss = criterion(torch.softmax(logits, dim=1), target)
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
            Every `every`-th call of `torch.nn.functional.cross_entropy` and `nll_loss` (the loss modules call
            them) is looked at: its input is reported when its autograd history ends in a softmax
            (`SoftmaxBackward0`, through views and reshapes), or when up to 64 of its rows are all non-negative
            and sum to 1 (one host sync). `log_softmax` in front of either loss, probability *targets* (label
            smoothing, soft labels) and softmaxes used elsewhere (attention, `kl_div` distillation) are quiet.
            A function imported before the session started (`from torch.nn.functional import cross_entropy`)
            is not seen.
        """,
        "source": """
            A call of `F.cross_entropy`/`F.nll_loss`, of `nn.CrossEntropyLoss()`/`nn.NLLLoss()`, or of a name
            (`criterion`, `self.criterion`) every binding of which builds one, is reported when the source shows
            its input to be a softmax's output: the softmax call itself (`torch.softmax`, `F.softmax`,
            `x.softmax`, `nn.Softmax(dim)(x)`), a name last bound to one in the same function, or the output of a
            model built in the file as `nn.Sequential(..., nn.Softmax(...))` or from a project class whose
            `forward` (in this file or an imported project module) returns a softmax on every `return`. A
            forward that returns the softmax only at inference (`if self.training: return logits`),
            `log_softmax`, `torch.log(softmax(...))` and softmax *targets* are quiet.
        """,
    },
)

_ROWS = 64


def _probabilities(inp: Any) -> bool:
    """Whether up to 64 rows of a classification input are non-negative and sum to 1 (one host sync)."""
    import torch

    if not isinstance(inp, torch.Tensor) or not inp.is_floating_point() or inp.dim() == 0 or inp.is_meta:
        return False
    dim = 1 if inp.dim() >= 2 else 0
    classes = inp.shape[dim]
    if classes < 2 or inp.numel() == 0:
        return False
    rows = inp.detach().movedim(dim, -1).reshape(-1, classes)[:_ROWS].float()
    low, off = torch.stack([rows.min(), (rows.sum(-1) - 1).abs().max()]).tolist()
    return low >= 0 and off <= (1e-2 if inp.dtype in (torch.float16, torch.bfloat16) else 1e-4)


@SOFTMAX_BEFORE_CROSS_ENTROPY.runtime
class SoftmaxBeforeCrossEntropy(RuntimeCheck):
    """Every `every`-th cross_entropy/nll_loss call: an input made by a softmax, or rows that are probabilities."""

    def on_start(self) -> None:
        self.reported: set[str] = set()
        tap_losses(self, ("cross_entropy", "nll_loss"), self._loss)

    def _loss(self, name: str, inp: Any, target: Any, kwargs: dict) -> None:
        if name in self.reported:
            return
        made_by = produced_by(inp, ("SoftmaxBackward0",))
        if made_by is None and not _probabilities(inp):
            return
        self.reported.add(name)
        where = user_location()
        how = "a softmax's output" if made_by else "probabilities (rows non-negative, summing to 1)"
        if name == "cross_entropy":
            message = (
                f"cross_entropy was given {how}: it applies log_softmax itself and expects logits, so this "
                "is a softmax of a softmax; the loss can't approach 0 and its gradients shrink."
            )
            line = fixed_user_line(where, lambda call, text: activation_argument(call, text, ("softmax",), "Softmax"))
            fix = Fix(
                title="Pass the logits; drop the softmax in front of the loss:",
                code=line or "loss = criterion(logits, target)",
            )
        else:
            message = (
                f"nll_loss was given {how}: it expects log-probabilities, so it minimises -p instead of "
                "-log p and barely punishes confident mistakes."
            )
            line = fixed_user_line(where, _log_softmax)
            fix = Fix(
                title="Use log_softmax in front of nll_loss (or cross_entropy on the logits):",
                code=line or "loss = F.nll_loss(F.log_softmax(logits, dim=1), target)",
            )
        self.ctx.emit(self, Finding(message, fix=fix, location=where))


def _log_softmax(call: ast.Call, text: str) -> Optional[str]:
    """`F.softmax(x, dim=1)` -> `F.log_softmax(x, dim=1)` (and `nn.Softmax` -> `nn.LogSoftmax`)."""
    if activation_argument(call, text, ("softmax",), "Softmax") is None:
        return None
    source = ast.get_source_segment(text, call) or ""
    return (
        source.replace("softmax(", "log_softmax(", 1)
        if "softmax(" in source
        else source.replace("Softmax(", "LogSoftmax(", 1)
    )


_SOFTMAX = Activation(frozenset({"softmax"}), "Softmax")


@SOFTMAX_BEFORE_CROSS_ENTROPY.source
def softmax_before_cross_entropy(src: SourceFile) -> Iterator[Finding]:
    """A cross_entropy/nll_loss call whose input the source shows to be a softmax's output."""
    if src.tree is None or not any(
        name in src.text for name in ("cross_entropy", "CrossEntropyLoss", "nll_loss", "NLLLoss")
    ):
        return
    for scope, call, loss, inp in loss_calls(
        src, frozenset({"cross_entropy", "nll_loss"}), frozenset({"CrossEntropyLoss", "NLLLoss"})
    ):
        found = evidence(src, scope, call, inp, _SOFTMAX)
        if found is None:
            continue
        cross = loss in ("cross_entropy", "CrossEntropyLoss")
        tensor = first_argument(src, found.node)
        if cross:
            line = fixed_line(src, call, found, tensor) if tensor else None
            fix = (
                Fix(title=f"Pass the logits: {loss} applies log_softmax itself:", code=line)
                if line
                else Fix(
                    title="Pass the logits: return them from the model (apply softmax only for probabilities at "
                    "inference):",
                    code="return self.classifier(features)  # logits; no softmax before CrossEntropyLoss",
                )
            )
        else:
            line = (
                fixed_line(
                    src,
                    call,
                    found,
                    src.segment(found.node).replace("softmax", "log_softmax").replace("Softmax", "LogSoftmax"),
                )
                if found.node is not None
                else None
            )
            fix = (
                Fix(title=f"Give {loss} log-probabilities:", code=line)
                if line
                else Fix(
                    title=f"Give {loss} log-probabilities: use log_softmax instead of softmax:",
                    code="return F.log_softmax(self.classifier(features), dim=1)",
                )
            )
        expects = "applies log_softmax itself and expects logits" if cross else "expects log-probabilities"
        yield Finding(
            f"`{src.snippet(call.node)}`: its input {found.how} a softmax, but {loss} {expects}"
            + (
                ": the softmax is applied twice and the gradients shrink."
                if cross
                else ": it minimises -p instead of -log p."
            ),
            fix=fix,
            location=src.location(call.node),
        )
