"""softmax-before-cross-entropy: probabilities fed to cross_entropy (which applies log_softmax itself) or to
nll_loss (which expects log-probabilities): the loss is computed on the wrong quantity and learning stalls."""
from __future__ import annotations

from typing import Any

from ._losstap import produced_by, tap_losses, user_location
from torchdoctor.sdk import Example, Finding, Pitfall
from torchdoctor.sdk.runtime import RuntimeCheck

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
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(torch.softmax(model(x), dim=1), y)
            loss.backward()
            optimizer.step()
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
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
    },
)

_ROWS = 64


def _probabilities(inp: Any) -> bool:
    """Whether up to 64 rows of a classification input are non-negative and sum to 1 (one host sync)."""
    import torch

    if not isinstance(inp, torch.Tensor) or not inp.is_floating_point() or inp.dim() == 0:
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
        how = "a softmax's output" if made_by else "probabilities (rows non-negative, summing to 1)"
        if name == "cross_entropy":
            message = (f"cross_entropy was given {how}: it applies log_softmax itself and expects logits, so this "
                       "is a softmax of a softmax; the loss can't approach 0 and its gradients shrink.")
            fix = "Pass the logits; drop the softmax in front of the loss:\nloss = criterion(logits, target)"
        else:
            message = (f"nll_loss was given {how}: it expects log-probabilities, so it minimises -p instead of "
                       "-log p and barely punishes confident mistakes.")
            fix = ("Use log_softmax in front of nll_loss (or cross_entropy on the logits):\n"
                   "loss = F.nll_loss(F.log_softmax(logits, dim=1), target)")
        self.ctx.emit(self, Finding(message, fix=fix, location=user_location()))
