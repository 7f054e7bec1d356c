"""Class-level patches shared by all live sessions: ``DataLoader.__iter__`` reports each new pass.

``iter()`` looks methods up on the type, so a loader's passes can only be seen by patching its class.
The patch is installed when the first session needs it and removed when the last one stops.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

Listener = Callable[[Any, Any], None]

_listeners: list[Listener] = []
_original: list[Callable[..., Any]] = []


def _patched_iter(self: Any) -> Any:
    iterator = _original[0](self)
    for listener in list(_listeners):
        listener(self, iterator)
    return iterator


class LoaderPatch:
    """Handle of one listener on ``DataLoader.__iter__``; ``remove()`` unsubscribes it."""

    def __init__(self, listener: Listener) -> None:
        from torch.utils.data import DataLoader

        self.listener = listener
        if not _original:
            _original.append(DataLoader.__iter__)
            DataLoader.__iter__ = functools.wraps(_original[0])(_patched_iter)  # type: ignore[method-assign]
        _listeners.append(listener)

    def remove(self) -> None:
        from torch.utils.data import DataLoader

        if self.listener in _listeners:
            _listeners.remove(self.listener)
        if not _listeners and _original:
            DataLoader.__iter__ = _original.pop()  # type: ignore[method-assign]
