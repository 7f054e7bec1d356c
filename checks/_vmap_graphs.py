"""eval-without-no-grad inside ``torch.func.vmap``: an ensemble (``stack_module_state`` + ``functional_call``)
evaluated with autograd on records the graph of every member for nothing. Watch's forward hooks stand aside
inside transforms, so this is judged from the parameters the call ran on: the tensors outside the transform
that they wrap, when they require grad, get a gradient hook; calls under vmap alone (nothing differentiates
inside) with autograd on whose parameters no backward ever reaches built graphs that nobody used."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Iterator

from torchdoctor.findings import Fix
from torchdoctor.sdk import Finding, Location, byte_size

if TYPE_CHECKING:
    from torchdoctor.sdk.runtime import TransformedForwardEvent

MIN_CALLS = 2  # as for plain eval forwards: one call may be a forward whose backward comes later


class VmapGraphs:
    """The parameters used inside vmap with autograd on: how often each was used, and whether a backward
    reached any of them (a trained ensemble: quiet)."""

    def __init__(self) -> None:
        self.uses: dict[int, tuple["weakref.ReferenceType[Any]", int]] = {}  # id -> (tensor, calls using it)
        self.reached = False
        self.reported = False
        self.label = ""
        self.widest = 0  # parameters of the widest module seen: its label names the call
        self.broken = False  # functorch could not be read: look no further

    @property
    def calls(self) -> int:
        return max((n for _, n in self.uses.values()), default=0)

    def saw(self, event: "TransformedForwardEvent", hooks: Any) -> None:
        """A forward inside a transform: note its leaves when the call builds a graph that vmap alone made."""
        if self.broken or self.reported or not event.grad_enabled:
            return
        from torchdoctor.sdk.runtime import only_vmap, transformed_leaves

        try:
            if not only_vmap():
                return
            leaves = transformed_leaves(event.module)
        except Exception:  # a functorch this version does not know: nothing here can be read
            self.broken = True
            return
        if leaves and len(leaves) >= self.widest:
            self.widest = len(leaves)
            self.label = event.watched.label if event.watched is not None else type(event.module).__name__
        for t in leaves:
            known = self.uses.get(id(t))
            if known is not None and known[0]() is t:
                self.uses[id(t)] = (known[0], known[1] + 1)
                continue
            self.uses[id(t)] = (weakref.ref(t), 1)
            hooks.add(t.register_hook(self._reached))  # a leaf's hook: removed with the session's hooks

    def _reached(self, grad: Any) -> None:
        self.reached = True

    def verdict(self, step: int) -> Iterator[Finding]:
        if self.reported or self.reached or self.calls < MIN_CALLS:
            return
        alive = [t for ref, _ in self.uses.values() if (t := ref()) is not None]
        if not alive:
            return
        self.reported = True
        size = byte_size(sum(t.numel() * t.element_size() for t in alive))
        yield Finding(
            f"`{self.label}` ran {self.calls} time(s) inside `torch.func.vmap` with autograd on, over "
            f"{len(alive)} parameter tensor(s) that require grad ({size}, e.g. stacked by `stack_module_state`), "
            "and no backward ever reached them: each call records the autograd graph of every member and keeps "
            "its activations alive as long as the output is. vmap, like eval(), does not turn off autograd.",
            fix=Fix(
                "Evaluate the ensemble without autograd",
                "with torch.no_grad():\n    predictions = vmap(fmodel, in_dims=(0, 0, None))(params, buffers, x)",
            ),
            location=Location(module=self.label, step=step),
        )
