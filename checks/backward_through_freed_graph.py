"""backward-through-freed-graph: backward() reached a graph that an earlier backward already freed."""

from __future__ import annotations

from typing import Any, Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import CrashEvent, RuntimeCheck

_SETUP = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.RNN(4, 8, batch_first=True)
head = nn.Linear(8, 1)
optimizer = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.1)
batches = [(torch.randn(2, 5, 4), torch.randn(2, 1)) for _ in range(3)]
"""

BACKWARD_THROUGH_FREED_GRAPH = Pitfall(
    code="TD338",
    name="backward-through-freed-graph",
    severity="error",
    summary="backward() went through a graph an earlier backward() freed: a tensor carried across steps "
    "(an RNN hidden state, a running loss) is still attached to the old graph.",
    why="""
        "Trying to backward through the graph a second time" means this loss's graph reaches into the graph
        of an earlier step, whose saved tensors the earlier `backward()` released. The tensor that links
        them is almost always carried across steps without `.detach()`: an RNN's hidden state passed to the
        next batch (truncated backpropagation through time), a running total of losses that is itself
        back-propagated, or a GAN's generated batch used for both the discriminator and the generator
        steps. `retain_graph=True` silences the error by keeping every old graph alive: memory grows each
        step and the gradients are wrong.
    """,
    fix="""
        Detach what is carried to the next step (`hidden = hidden.detach()`), accumulate `loss.item()` for
        logging, and give the discriminator `fake.detach()`. Keep `retain_graph=True` for the rare case
        where the same graph really is back-propagated twice.
    """,
    bad=Example(
        """
        hidden = torch.zeros(1, 2, 8)
        for x, y in batches:
            optimizer.zero_grad()
            out, hidden = model(x, hidden)  # hidden still belongs to the previous step's graph
            loss = nn.functional.mse_loss(head(out[:, -1]), y)
            loss.backward()
            optimizer.step()
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        hidden = torch.zeros(1, 2, 8)
        for x, y in batches:
            hidden = hidden.detach()  # cut from the previous step's graph
            optimizer.zero_grad()
            out, hidden = model(x, hidden)
            loss = nn.functional.mse_loss(head(out[:, -1]), y)
            loss.backward()
            optimizer.step()
        """,
        setup=_SETUP,
    ),
    details={
        "runtime": """
            When the watched code (or the program, under `torchdoctor run`) ends with autograd's "backward
            through the graph a second time", the check lists the tensors in the failing frame of the user's
            code that are still attached to a graph (they have a `grad_fn`) other than the loss itself —
            the candidates for the missing `.detach()` — and the number of watched forwards' graphs still
            alive. Quiet for other errors.
        """,
    },
)


@BACKWARD_THROUGH_FREED_GRAPH.runtime
class BackwardThroughFreedGraph(RuntimeCheck):
    """At "backward through the graph a second time": the tensors of the user's frame still in a graph."""

    def on_crash(self, event: CrashEvent) -> Iterator[Finding]:
        from torchdoctor.sdk.runtime import evidence

        exc = event.exception
        if not isinstance(exc, RuntimeError) or "backward through the graph a second time" not in str(exc):
            return
        attached = _attached(evidence.frames(exc))
        carried = [n for n in attached if n not in ("loss", "output", "out", "outputs", "logits", "pred")]
        live = self.ctx.graphs.sentinels
        text = (
            f"backward() reached a graph that an earlier backward() freed, at step {self.ctx.step}: a tensor "
            "carried across steps is still attached to the old graph."
        )
        if carried:
            text += " Tensors of the failing frame still in a graph: " + ", ".join(f"`{n}`" for n in carried[:6]) + "."
        if live > 1:
            text += f" Graphs of watched forwards still alive: {live}."
        name = carried[0] if carried else "hidden"
        fix = Fix(
            title="Detach what is carried to the next step, where it is carried:",
            code=f"{name} = {name}.detach()\n# and log losses with loss.item(); do not add retain_graph=True",
        )
        yield Finding(text, fix=fix, location=Location())


def _attached(frames: list[Any]) -> list[str]:
    """Names of the tensors with a grad_fn in the innermost frame outside torch and torchdoctor (whose wrapper
    of ``torch.autograd.backward`` times the step) — the user's loop."""
    import os

    import torch

    torch_dir = os.path.dirname(torch.__file__)
    for frame in reversed(frames):
        if frame.f_code.co_filename.startswith(torch_dir) or _ours(frame):
            continue
        return [n for n, v in list(frame.f_locals.items()) if isinstance(v, torch.Tensor) and v.grad_fn is not None]
    return []


def _ours(frame: Any) -> bool:
    return str(frame.f_globals.get("__name__", "")).partition(".")[0] == "torchdoctor"
