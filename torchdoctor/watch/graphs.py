"""Watching autograd graphs without holding them: sentinels on graph nodes, and the size of one graph.

A sentinel is a pre-hook registered on a forward output's ``grad_fn``. The node owns it, so it lives
exactly as long as the graph: it notes when backward reaches the node, and its finaliser reports when
the graph is freed. Callbacks only update counters; checks turn them into findings at their next event.
No default ``saved_tensors_hooks`` are used: they would turn off autograd's in-place checks for saved
tensors and make ``torch.func`` transforms refuse to run inside the session.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any, Callable, Iterable, Optional

import torch


class _Sentinel:
    """The one pre-hook on a tracked graph's output node: every check that tracks the graph adds its callbacks."""

    __slots__ = ("tracker", "key", "on_backward", "on_free", "reached", "__weakref__")

    def __init__(self, tracker: "GraphTracker", key: int) -> None:
        self.tracker, self.key = tracker, key
        self.on_backward: list[Callable[[], None]] = []
        self.on_free: list[Callable[[bool], None]] = []
        self.reached = False

    def add(self, on_backward: Optional[Callable[[], None]], on_free: Optional[Callable[[bool], None]]) -> None:
        if on_backward is not None:
            self.on_backward.append(on_backward)
        if on_free is not None:
            self.on_free.append(on_free)

    def __call__(self, grad_outputs: Any) -> None:
        if not self.reached:
            self.reached = True
            if self.tracker.active:
                for callback in self.on_backward:
                    try:
                        callback()
                    except Exception:  # runs inside backward: counters only, and never raise there
                        pass
        return None

    def __del__(self) -> None:
        self.tracker._handles.pop(self.key, None)
        if self.tracker.active:
            for callback in self.on_free:
                try:
                    callback(self.reached)
                except Exception:  # a finaliser must never raise into the user's code
                    pass


class GraphTracker:
    """Sentinels on autograd graphs, one per graph; `stop()` removes those of graphs that are still alive."""

    def __init__(self) -> None:
        self.active = True
        self._handles: dict[int, Any] = {}
        self._keys = itertools.count()
        # The output tracked last and its sentinel (weakly: neither the graph nor its finaliser is held), so the
        # checks that look at one forward share one pre-hook.
        self._last: Optional[tuple[weakref.ref[torch.Tensor], weakref.ref[_Sentinel]]] = None

    def stop(self) -> None:
        self.active = False
        for handle in list(self._handles.values()):
            handle.remove()
        self._handles.clear()
        self._last = None

    @property
    def sentinels(self) -> int:
        """Tracked graphs still alive."""
        return len(self._handles)

    def track(
        self,
        tensor: torch.Tensor,
        on_backward: Optional[Callable[[], None]] = None,
        on_free: Optional[Callable[[bool], None]] = None,
    ) -> bool:
        """Call `on_backward` when backward first reaches `tensor`'s graph and `on_free(reached)` when the graph
        is freed; False when it has none (no grad, or an inference tensor)."""
        fn = tensor.grad_fn
        if fn is None or not self.active:
            return False
        last = self._last
        sentinel = last[1]() if last is not None and last[0]() is tensor else None
        if sentinel is None or sentinel.reached:
            sentinel = _Sentinel(self, next(self._keys))
            self._handles[sentinel.key] = fn.register_prehook(sentinel)
            self._last = (weakref.ref(tensor), weakref.ref(sentinel))
        sentinel.add(on_backward, on_free)
        return True


def footprint(tensor: torch.Tensor, owned: Iterable[torch.Tensor] = (), limit: int = 100_000) -> tuple[int, int]:
    """(nodes, bytes) of the graph behind `tensor`: its autograd nodes and the storages they saved for
    backward, not counting the storages of `owned` tensors (parameters and buffers, alive anyway).
    Walks the graph once; call it for one forward per model, never per step."""
    skip = {_storage(t)[0] for t in owned}
    storages: dict[int, int] = {}
    nodes: dict[Any, None] = {}  # keeps the node wrappers alive while walking
    stack = [tensor.grad_fn]
    while stack and len(nodes) < limit:
        fn = stack.pop()
        if fn is None or fn in nodes:
            continue
        nodes[fn] = None
        for saved in _saved_tensors(fn):
            ptr, nbytes = _storage(saved)
            if ptr is not None and ptr not in skip:
                storages[ptr] = nbytes
        stack.extend(f for f, _ in fn.next_functions)
    return len(nodes), sum(storages.values())


def _storage(tensor: torch.Tensor) -> tuple[Optional[int], int]:
    """(data pointer, bytes) of a tensor's storage; (None, 0) for tensors without one of their own
    (FSDP2's DTensor shards, functorch wrappers, tensor subclasses)."""
    try:
        storage = tensor.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):
        return None, 0


def _saved_tensors(fn: Any) -> list[torch.Tensor]:
    found = []
    names = [a for a in dir(fn) if a.startswith("_saved_")] + (
        ["saved_tensors"] if hasattr(fn, "saved_tensors") else []
    )
    for name in names:
        try:
            value = getattr(fn, name)
        except RuntimeError:  # already freed by backward()
            continue
        for item in value if isinstance(value, (tuple, list)) else [value]:
            if isinstance(item, torch.Tensor) and item.device.type != "meta":
                found.append(item)
    return found
