"""backward-misses-parameters: the optimizer steps but backward() never reached the model (a detached or
`.item()`-rebuilt loss), so nothing trains."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
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
            `watch` counts the forwards of each watched model that built a graph. At `optimizer.step()` it
            reports an error when, since the previous step, a watched model holding some of the optimizer's
            parameters ran such a forward and none of the optimizer's trainable parameters has a gradient
            (a backward that reached any of them would have left one). Quiet: steps whose gradients exist (any
            backward that reached a parameter, gradient accumulation, closures), models whose parameters this
            optimizer does not hold (a frozen teacher), and steps with no forward since the last one.
        """,
    },
    since="0.1.0",
)


@BACKWARD_MISSES_PARAMETERS.runtime
class BackwardMissesParameters(RuntimeCheck):
    """Forward graphs built since the last step, and a step with no gradient at all: nothing trains. Counts
    only (no sentinel on the graph): a backward that reaches a trainable parameter leaves it a gradient."""

    def on_start(self) -> None:
        import torch

        from torchdoctor.sdk.runtime import first_graph_tensor

        self.first_graph_tensor = first_graph_tensor  # looked up once: on_forward runs at every step
        self.tensor_type = torch.Tensor
        self.built: dict[str, int] = {}  # per model: forwards with a graph since the last step
        self.reported = False

    def on_forward(self, event: ForwardEvent) -> None:
        if not event.grad_enabled or self.reported:
            return
        out = event.output
        if out.requires_grad if type(out) is self.tensor_type else self.first_graph_tensor(out) is not None:
            label = event.model.label
            self.built[label] = self.built.get(label, 0) + 1

    def on_step_pre(self, event: StepEvent) -> Iterator[Finding] | None:
        if self.reported or not self.built:
            return None
        for group in event.optimizer.optimizer.param_groups:  # the usual step: stops at the first gradient
            for p in group["params"]:
                if p.grad is not None:
                    return None
        params = [p for p in event.optimizer.params() if p.requires_grad]
        if not params:
            return None
        held = {id(p) for p in params}
        missed = [
            wm.label
            for wm in self.ctx.models
            if self.built.get(wm.label) and any(id(p) in held for p in wm.inner.parameters())
        ]
        return self._finding(event, len(params), missed[0]) if missed else None

    def _finding(self, event: StepEvent, count: int, model: str) -> Iterator[Finding]:
        self.reported = True
        yield Finding(
            f"{event.optimizer.label}.step() ran with no gradient on any of its {count} parameter tensors, "
            f"although {model} ran a forward with gradients since the last step: the loss that was "
            "back-propagated has no path to the parameters (rebuilt from .item(), .detach(), .data, "
            "torch.tensor(...) or numpy), so this step changes nothing.",
            fix=Fix(
                title="Back-propagate the loss built from the model's output; log numbers separately:",
                code="loss = criterion(model(x), y)\nloss.backward()\nlogged = loss.item()",
            ),
            location=Location(module=model, step=event.step),
        )

    def on_step_post(self, event: StepEvent) -> None:
        if self.built:
            self.built = {}
