"""Watching autograd graphs without holding them: sentinels on graph nodes, and the size of one graph.

A sentinel is a pre-hook registered on a forward output's ``grad_fn``. The node owns it, so it lives
exactly as long as the graph: it notes when backward reaches the node, and its finaliser reports when
the graph is freed. Callbacks only update counters; checks turn them into findings at their next event.
No default ``saved_tensors_hooks`` are used: they would turn off autograd's in-place checks for saved
tensors and make ``torch.func`` transforms refuse to run inside the session.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable, Optional

import torch


class _Sentinel:
    __slots__ = ("tracker", "key", "on_backward", "on_free", "reached")

    def __init__(self, tracker: "GraphTracker", key: int, on_backward: Optional[Callable[[], None]],
                 on_free: Optional[Callable[[bool], None]]) -> None:
        self.tracker, self.key = tracker, key
        self.on_backward, self.on_free = on_backward, on_free
        self.reached = False

    def __call__(self, grad_outputs: Any) -> None:
        if not self.reached:
            self.reached = True
            if self.on_backward is not None and self.tracker.active:
                try:
                    self.on_backward()
                except Exception:  # runs inside backward: counters only, and never raise there
                    pass
        return None

    def __del__(self) -> None:
        self.tracker._handles.pop(self.key, None)
        self.tracker._counted.discard(self.key)
        if self.on_free is not None and self.tracker.active:
            try:
                self.on_free(self.reached)
            except Exception:  # a finaliser must never raise into the user's code
                pass


class GraphTracker:
    """Sentinels on autograd graphs; `stop()` removes those of graphs that are still alive."""

    def __init__(self) -> None:
        self.active = True
        self._handles: dict[int, Any] = {}
        self._counted: set[int] = set()  # the sentinels that stand for a graph in `sentinels`
        self._keys = itertools.count()

    def stop(self) -> None:
        self.active = False
        for handle in list(self._handles.values()):
            handle.remove()
        self._handles.clear()
        self._counted.clear()

    @property
    def sentinels(self) -> int:
        """Tracked graphs still alive (sentinels put with `count=True`)."""
        return len(self._counted)

    def track(self, tensor: torch.Tensor, on_backward: Optional[Callable[[], None]] = None,
              on_free: Optional[Callable[[bool], None]] = None, count: bool = True) -> bool:
        """Put a sentinel on `tensor`'s graph; False when it has none (no grad, or an inference tensor).
        `count=False` for a second sentinel on a graph that another check already counts."""
        fn = tensor.grad_fn
        if fn is None or not self.active:
            return False
        key = next(self._keys)
        self._handles[key] = fn.register_prehook(_Sentinel(self, key, on_backward, on_free))
        if count:
            self._counted.add(key)
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
    names = [a for a in dir(fn) if a.startswith("_saved_")] + (["saved_tensors"] if hasattr(fn, "saved_tensors") else [])
    for name in names:
        try:
            value = getattr(fn, name)
        except RuntimeError:  # already freed by backward()
            continue
        for item in value if isinstance(value, (tuple, list)) else [value]:
            if isinstance(item, torch.Tensor) and item.device.type != "meta":
                found.append(item)
    return found
