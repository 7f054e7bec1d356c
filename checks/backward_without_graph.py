"""backward-without-graph: backward() on a loss that has no autograd graph; why it has none."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import CrashEvent, ForwardEvent, RuntimeCheck

_SETUP = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
"""

BACKWARD_WITHOUT_GRAPH = Pitfall(
    code="TD336",
    name="backward-without-graph",
    severity="error",
    summary="backward() on a loss with no autograd graph: the forward ran under no_grad/inference_mode, the "
    "parameters are frozen, or the loss was rebuilt from detached values.",
    why="""
        "element 0 of tensors does not require grad and does not have a grad_fn" means the loss is a plain
        number as far as autograd knows. Either the forward ran under `torch.no_grad()` or
        `torch.inference_mode()` (a validation helper reused for training, a decorator on the training
        function), or every parameter has `requires_grad=False` (a model frozen for fine-tuning and never
        unfrozen), or the loss was rebuilt from `.item()`, `.detach()` or numpy values.
    """,
    fix="""
        Run the training forward with gradients enabled (move it out of the `no_grad` block, remove the
        decorator), unfreeze the parameters to train (`requires_grad_(True)`), and compute the loss from the
        model's output tensors, not from `.item()` values.
    """,
    bad=Example(
        """
        optimizer.zero_grad()
        with torch.no_grad():  # left over from the validation code
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        """,
        setup=_SETUP,
    ),
    details={
        "runtime": """
            When the watched code (or the program, under `torchdoctor run`) ends with autograd's "does not
            require grad and does not have a grad_fn", the check says how the last watched forward ran (grad
            mode: enabled, `no_grad`, `inference_mode`; train or eval) and how many of each model's
            parameters require grad, and names the cause those facts point at. Quiet for other errors.
        """,
    },
)


@BACKWARD_WITHOUT_GRAPH.runtime
class BackwardWithoutGraph(RuntimeCheck):
    """At autograd's "does not require grad" error: how the last forward ran and what can be trained."""

    needs_forward = False  # it listens to forwards only to know how they ran; it judges crashes

    def on_forward(self, event: ForwardEvent) -> None:
        """Nothing to do: subscribing makes the session record how each forward ran (`ctx.last_forward`),
        also when this check runs alone."""

    def on_crash(self, event: CrashEvent) -> Iterator[Finding]:
        exc = event.exception
        if not isinstance(exc, RuntimeError) or "does not require grad and does not have a grad_fn" not in str(exc):
            return
        trainable = {
            wm.label: (sum(p.requires_grad for p in wm.inner.parameters()), sum(1 for _ in wm.inner.parameters()))
            for wm in self.ctx.models
        }
        lf = self.ctx.last_forward
        facts = []
        if lf is not None:
            mode = (
                "torch.inference_mode()"
                if lf.inference_mode
                else ("gradients enabled" if lf.grad_enabled else "torch.no_grad()")
            )
            facts.append(f"the last forward of {lf.label} ran with {mode}")
        facts += [
            f"{label} has {n} of {total} parameter tensors with requires_grad=True"
            for label, (n, total) in trainable.items()
        ]
        if lf is not None and (lf.inference_mode or not lf.grad_enabled):
            cause = "the forward ran without gradients"
            block = "torch.inference_mode()" if lf.inference_mode else "torch.no_grad()"
            fix = Fix(
                title=f"Move the training forward and its loss out of the `{block}` block, or remove that decorator "
                "from the training function: the loss needs the graph the forward records"
            )
        elif trainable and all(n == 0 for n, _ in trainable.values()):
            cause = "no parameter requires grad: the model is frozen"
            fix = Fix(
                title="Unfreeze what should train:",
                code="for p in model.parameters():\n    p.requires_grad_(True)",
            )
        else:
            cause = (
                "the forward kept gradients, so the loss was rebuilt from values without a graph "
                "(`.item()`, `.detach()`, numpy, `torch.tensor(...)` of outputs)"
            )
            fix = Fix(
                title="Build the loss from the model's output tensors:",
                code="loss = criterion(output, target)  # not torch.tensor(loss_value)",
            )
        yield Finding(
            f"backward() got a loss without an autograd graph at step {self.ctx.step}: {cause} ("
            + "; ".join(facts)
            + ").",
            fix=fix,
            location=Location(module=lf.label if lf is not None else None),
        )
