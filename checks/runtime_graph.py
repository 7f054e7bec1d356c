"""Runtime check for autograd graphs kept alive across steps (``losses.append(loss)``, ``total += loss``)."""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Iterator, Optional

from torchdoctor.findings import Finding, Location
from torchdoctor.registry import Scope, check
from torchdoctor.units import byte_size
from torchdoctor.watch.contract import ForwardEvent, RuntimeCheck, StepEvent

if TYPE_CHECKING:
    from torchdoctor.watch.context import WatchedModel


def _cuda_allocated() -> Optional[int]:
    """The CUDA caching allocator's allocated bytes, when CUDA is in use in this process."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.memory_allocated())
    return None


class _Live:
    def __init__(self) -> None:
        self.graphs = 0        # tracked forward graphs alive
        self.unreached = 0     # ...of which backward never went through (their activations are still saved)


@check(code="TD308", name="graph-retention-leak", scope=Scope.RUNTIME, severity="error",
       summary="Autograd graphs of past steps stay alive: memory grows step over step.")
class GraphRetentionLeak(RuntimeCheck):
    """Sentinels count the forward graphs still alive; a count that grows by about one graph per step over
    `window` steps means something holds every step's graph. Bytes: the saved activations of one forward
    (measured once per model) for graphs never back-propagated, and the CUDA allocator's slope."""

    window = 50

    def on_start(self) -> None:
        self.live: dict[str, _Live] = {}
        self.samples: deque[tuple[int, int, Optional[int]]] = deque(maxlen=self.window + 1)
        self.reported = False

    def on_forward(self, event: ForwardEvent) -> None:
        if not event.grad_enabled or self.reported:
            return
        from torchdoctor.watch.context import first_graph_tensor

        out = first_graph_tensor(event.output)
        if out is None:
            return
        live = self.live.setdefault(event.model.label, _Live())

        def backward() -> None:
            live.unreached -= 1

        def freed(reached: bool) -> None:
            live.graphs -= 1
            live.unreached -= not reached

        if self.ctx.graphs.track(out, on_backward=backward, on_free=freed):
            live.graphs += 1
            live.unreached += 1
            event.model.graph_footprint(out)

    def on_step_post(self, event: StepEvent) -> Iterator[Finding]:
        if self.reported or event.optimizer is not self.ctx.optimizers[0]:
            return
        activations = sum(v.unreached * self._model(k).graph_footprint(None)[1]
                          for k, v in self.live.items() if v.unreached)
        # torch.cuda.memory_allocated() builds the allocator's whole stats dict (~0.3 ms): every `every` steps
        cuda = _cuda_allocated() if event.step % self.ctx.every == 0 else None
        self.samples.append((sum(v.graphs for v in self.live.values()), activations, cuda))
        if len(self.samples) <= self.window:
            return
        (live0, saved0, _), (live1, saved1, _) = self.samples[0], self.samples[-1]
        if live1 - live0 < 0.9 * self.window:
            return
        self.reported = True
        label = max(self.live, key=lambda k: self.live[k].graphs)
        nodes = self._model(label).graph_footprint(None)[0]
        per_step = (live1 - live0) / self.window
        saved = (saved1 - saved0) / self.window
        memory = (f"their saved activations grow by about {byte_size(saved)} per step" if saved > 0 else
                  f"backward() freed their saved activations, so each costs its ~{nodes} graph nodes, and memory "
                  "grows slowly but without bound")
        sampled = [(i, c) for i, (_, _, c) in enumerate(self.samples) if c is not None]
        if len(sampled) >= 2:
            (i0, cuda0), (i1, cuda1) = sampled[0], sampled[-1]
            memory += f"; CUDA allocated memory grows by {byte_size((cuda1 - cuda0) / (i1 - i0))} per step"
        yield Finding(
            f"Autograd graphs of {label}'s forward outputs stay alive across steps: {live1} are alive now, "
            f"{per_step:.1f} more per step over the last {self.window} steps ({memory}). Something keeps a "
            "tensor that is still attached to its graph, e.g. `losses.append(loss)` or `total_loss += loss`.",
            fix="Keep numbers, not graphs, across steps:\n"
                "total_loss += loss.item()      # or loss.detach()\n"
                "losses.append(loss.item())",
            location=Location(module=label, step=event.step))

    def _model(self, label: str) -> "WatchedModel":
        return next(wm for wm in self.ctx.models if wm.label == label)
