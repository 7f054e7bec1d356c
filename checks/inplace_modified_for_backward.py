"""inplace-modified-for-backward: a tensor saved for backward was changed in place before the backward."""

from __future__ import annotations

import re
from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import CrashEvent, RuntimeCheck

_SETUP = """
import torch
from torch import nn

torch.manual_seed(0)
G = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 6))
D = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
opt_g = torch.optim.SGD(G.parameters(), lr=0.1)
opt_d = torch.optim.SGD(D.parameters(), lr=0.1)
bce = nn.BCEWithLogitsLoss()
z, real = torch.randn(8, 4), torch.randn(8, 6)
ones, zeros = torch.ones(8, 1), torch.zeros(8, 1)
model, optimizer = D, opt_d
"""

INPLACE_MODIFIED_FOR_BACKWARD = Pitfall(
    code="TD339",
    name="inplace-modified-for-backward",
    severity="error",
    summary="A tensor saved for backward was changed in place before the backward: optimizer.step() between a "
    "forward and its backward (GANs), or an in-place operation on an activation.",
    why="""
        Autograd saves some inputs and outputs of each operation for the backward pass and checks their
        version counters. "one of the variables needed for gradient computation has been modified by an
        inplace operation ... is at version 1; expected version 0" means one was changed in between. When
        the tensor has the shape of a weight, an `optimizer.step()` (which updates weights in place) ran
        between the forward and this backward: the GAN whose discriminator is stepped before the generator's
        loss, computed through the old discriminator forward, is back-propagated. Otherwise an in-place
        operation changed an activation: `x += ...`, `x[mask] = 0`, `relu(inplace=True)` after a sigmoid.
    """,
    fix="""
        Back-propagate every loss before the step that changes its weights (compute the generator's loss with
        a fresh discriminator forward after `opt_d.step()`), and replace the in-place operation on an
        activation by its out-of-place form (`x = x + ...`). `torch.autograd.set_detect_anomaly(True)` names
        the forward line that saved the tensor.
    """,
    bad=Example(
        """
        fake = G(z)
        out_fake = D(fake)                      # used by both losses
        d_loss = bce(D(real), ones) + bce(out_fake, zeros)
        g_loss = bce(out_fake, ones)
        opt_d.zero_grad()
        d_loss.backward(retain_graph=True)
        opt_d.step()                            # D's weights change in place
        opt_g.zero_grad()
        g_loss.backward()                       # ... through D's old forward
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        fake = G(z)
        out_fake = D(fake)
        d_loss = bce(D(real), ones) + bce(out_fake, zeros)
        opt_d.zero_grad()
        d_loss.backward(retain_graph=True)  # G's graph is used again by g_loss
        opt_d.step()
        g_loss = bce(D(fake), ones)  # a fresh forward through the updated D
        opt_g.zero_grad()
        g_loss.backward()
        """,
        setup=_SETUP,
    ),
    details={
        "runtime": """
            When the watched code (or the program, under `torchdoctor run`) ends with autograd's "modified by
            an inplace operation", the check reads the tensor's shape, the operation that saved it and the
            versions from the error, and looks for watched parameters of that shape: when there are, it
            names them (a linear layer saves its weight transposed) and the optimizer step that changed them; otherwise
            it points at an in-place
            operation on an activation. Quiet for other errors.
        """,
    },
)

_SAVED = re.compile(
    r"\[torch\.\w+ \[([\d, ]*)\]\], which is output (\d+) of (\w+), is at version (\d+); "
    r"expected version (\d+)"
)


@INPLACE_MODIFIED_FOR_BACKWARD.runtime
class InplaceModifiedForBackward(RuntimeCheck):
    """At autograd's version-counter error: a weight changed by a step, or an activation changed in place."""

    def on_crash(self, event: CrashEvent) -> Iterator[Finding]:
        exc = event.exception
        text = str(exc)
        if not isinstance(exc, RuntimeError) or "modified by an inplace operation" not in text:
            return
        m = _SAVED.search(text)
        shape = tuple(int(d) for d in m.group(1).split(",") if d.strip()) if m else None
        op = m.group(3) if m else "an operation"
        weights = (
            [
                (wm.label, name)
                for wm in self.ctx.models
                for name, p in wm.named_parameters()
                if shape in (tuple(p.shape), tuple(reversed(p.shape)))
            ]
            if shape is not None
            else []
        )
        steps = ", ".join(f"{wo.label} {wo.steps}" for wo in self.ctx.optimizers)
        saved = f"a {list(shape)} tensor saved by {op}" if shape is not None else "a tensor saved for backward"
        if weights:
            names = ", ".join(f"{label} `{name}`" for label, name in weights[:4])
            yield Finding(
                f"backward() found {saved} changed in place at step {self.ctx.step}; it has the shape of {names} (or "
                f"its transpose): "
                f"an optimizer.step() (steps so far: {steps or 'none watched'}) updated those weights between the "
                "forward and this backward.",
                fix=Fix(
                    title="Back-propagate each loss before the step that changes the weights it went through, e.g. a "
                    "fresh discriminator forward after its step:",
                    code="opt_d.step()\n"
                    "g_loss = bce(D(fake), ones)  # not the output of D's forward from before opt_d.step()\n"
                    "g_loss.backward()",
                ),
                location=Location(module=weights[0][0], param=weights[0][1]),
            )
        else:
            yield Finding(
                f"backward() found {saved} changed in place at step {self.ctx.step} (no watched weight has that "
                "shape: an activation was modified, e.g. `x += ...`, `x[mask] = 0`, `relu(inplace=True)`).",
                fix=Fix(
                    title="Use the out-of-place form, and let anomaly mode name the forward line that saved it:",
                    code="x = x + residual  # not x += residual\n"
                    "torch.autograd.set_detect_anomaly(True)  # once, to locate",
                ),
                location=Location(),
            )
