"""eval-without-no-grad inside ``torch.func.vmap``: an ensemble (``stack_module_state`` + ``functional_call``)
evaluated with autograd on records the graph of every member for nothing. Watch's forward hooks stand aside
inside transforms, so this is judged from the parameters the call ran on: the tensors outside the transform
that they wrap, when they require grad, get a gradient hook; calls under vmap alone (nothing differentiates
inside) with autograd on whose parameters no backward ever reaches built graphs that nobody used."""

from __future__ import annotations

import sys
import weakref
from typing import TYPE_CHECKING, Any, Iterator, Optional

from torchdoctor.sdk import Finding, Fix, Location, byte_size

if TYPE_CHECKING:
    from torchdoctor.sdk.runtime import TransformedForwardEvent

MIN_CALLS = 2  # as for plain eval forwards: one call may be a forward whose backward comes later


class VmapGraphs:
    """The parameters used inside vmap with autograd on: how often each was used, and whether a backward
    reached any of them (a trained ensemble: quiet)."""

    def __init__(self) -> None:
        self.uses: dict[int, "weakref.ReferenceType[Any]"] = {}  # id -> the tensor, hooked once
        self.reached = False
        self.reported = False
        self.label = ""
        self.widest = 0  # parameters of the widest module seen: the outermost of the call, whose label names it
        self.widest_calls: dict[int, int] = {}  # calls of each module that had that many (a submodule's are not)
        self.calls = 0  # calls of the widest module
        self.broken = False  # functorch could not be read: look no further
        self.site: Optional[tuple[str, int]] = None  # the user's line that called the transform

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
        if not leaves or len(leaves) < self.widest:
            return
        if len(leaves) > self.widest:
            self.widest, self.widest_calls, self.calls = len(leaves), {}, 0
        if self.site is None:
            self.site = _call_site()
        calls = self.widest_calls[id(event.module)] = self.widest_calls.get(id(event.module), 0) + 1
        if calls >= self.calls:
            self.calls = calls
            self.label = event.watched.label if event.watched is not None else type(event.module).__name__
        for t in leaves:
            known = self.uses.get(id(t))
            if known is None or known() is not t:
                self.uses[id(t)] = weakref.ref(t)
                hooks.add(t.register_hook(self._hook()))  # a leaf's hook: removed with the session's hooks

    def _hook(self) -> Any:
        """The gradient hook: notes that a backward reached the ensemble; `torch.save` of the user's tensor
        while the session runs leaves it out without a warning."""
        from torch.utils.hooks import unserializable_hook

        def reached(grad: Any) -> None:
            self.reached = True

        return unserializable_hook(reached)

    def verdict(self, step: int) -> Iterator[Finding]:
        if self.reported or self.reached or self.calls < MIN_CALLS:
            return
        alive = [t for ref in self.uses.values() if (t := ref()) is not None]
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
            location=Location(
                file=self.site[0] if self.site else None,
                line=self.site[1] if self.site else None,
                module=self.label,
                step=step,
            ),
        )


def _call_site() -> Optional[tuple[str, int]]:
    """(file, line) of the user's call of the transform: the first user frame outside the outermost of
    torch.func's own (not `functional_call`'s caller inside the vmapped function)."""
    from torchdoctor.sdk.runtime import is_library

    frame = sys._getframe(1)
    inside = False
    site: Optional[tuple[str, int]] = None
    while frame is not None:
        if "_functorch" in frame.f_code.co_filename:
            inside, site = True, None
        elif inside and site is None and not is_library(frame):
            site = frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back  # type: ignore[assignment]
    return site
