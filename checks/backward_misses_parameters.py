"""backward-misses-parameters: the optimizer steps but backward() never reached the model (a detached or
`.item()`-rebuilt loss), so nothing trains."""
from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Location, Pitfall
from torchdoctor.sdk.runtime import ForwardEvent, RuntimeCheck, StepEvent

_SETUP = """
import torch
from torch import nn

model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(3)]
"""

BACKWARD_MISSES_PARAMETERS = Pitfall(
    code="TD315",
    name="backward-misses-parameters",
    severity="error",
    summary="backward() runs on a loss with no path to the trained parameters, so every step changes nothing.",
    why="""
        A loss rebuilt from numbers (`torch.tensor(loss.item(), requires_grad=True)`), or detached and then
        given `requires_grad_()` to silence "element 0 of tensors does not require grad", is a new leaf: its
        `backward()` succeeds but stops there. No parameter gets a gradient, `optimizer.step()` skips every
        parameter, and the loss curve stays flat (or moves only through BatchNorm statistics), with no error.
    """,
    fix="""
        Back-propagate the loss that the model's output produced, without `.item()`, `.detach()`,
        `.data`, `torch.tensor(...)` or numpy in between; keep those for logging only.
    """,
    bad=Example(
        """
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss = torch.tensor(loss.item(), requires_grad=True)   # "fixes" a dtype/device complaint
            loss.backward()
            optimizer.step()
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        criterion = nn.MSELoss()
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            logged = loss.item()
        """,
        setup=_SETUP,
    ),
    details={
        "runtime": """
            `watch` puts a sentinel on the graph of each forward output built with gradients (see
            graph-retention-leak). At `optimizer.step()` it reports an error when, since the previous step, a
            watched model ran such a forward, backward reached none of those graphs, and none of the
            optimizer's trainable parameters has a gradient. Quiet: steps whose gradients exist (any
            backward that reached a parameter, gradient accumulation, closures), models whose parameters this
            optimizer does not hold (a frozen teacher), and steps with no forward since the last one.
        """,
    },
    since="0.1.0",
)


class _Since:
    """Per model: forward graphs built since the last step, and whether backward reached any of them."""

    def __init__(self) -> None:
        self.built = 0
        self.reached = False


@BACKWARD_MISSES_PARAMETERS.runtime
class BackwardMissesParameters(RuntimeCheck):
    """Forward graphs that backward never reaches, and a step with no gradient at all: nothing trains."""

    def on_start(self) -> None:
        self.since: dict[str, _Since] = {}
        self.reported = False

    def on_forward(self, event: ForwardEvent) -> None:
        if not event.grad_enabled or self.reported:
            return
        from torchdoctor.sdk.runtime import first_graph_tensor

        out = first_graph_tensor(event.output)
        if out is None:
            return
        since = self.since.setdefault(event.model.label, _Since())

        def backward() -> None:
            since.reached = True

        if self.ctx.graphs.track(out, on_backward=backward):
            since.built += 1

    def on_step_pre(self, event: StepEvent) -> Iterator[Finding]:
        if self.reported:
            return
        unreached = [wm for wm in self.ctx.models
                     if wm.label in self.since and self.since[wm.label].built and not self.since[wm.label].reached]
        if not unreached:  # the usual step: backward went through this step's forwards
            return
        params = [p for p in event.optimizer.params() if p.requires_grad]
        held = {id(p) for p in params}
        missed = [wm.label for wm in unreached if any(id(p) in held for p in wm.inner.parameters())]
        if missed and params and all(p.grad is None for p in params):
            self.reported = True
            yield Finding(
                f"{event.optimizer.label}.step() ran with no gradient on any of its {len(params)} parameter tensors, "
                f"and backward() never reached the graph of {missed[0]}'s forward since the last step: the loss "
                "that was back-propagated has no path to the parameters (rebuilt from .item(), .detach(), .data, "
                "torch.tensor(...) or numpy), so this step changes nothing.",
                fix="Back-propagate the loss built from the model's output; log numbers separately:\n"
                    "loss = criterion(model(x), y)\n"
                    "loss.backward()\n"
                    "logged = loss.item()",
                location=Location(module=missed[0], step=event.step))

    def on_step_post(self, event: StepEvent) -> None:
        for since in self.since.values():
            since.built, since.reached = 0, False
