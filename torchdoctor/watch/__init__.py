"""`torchdoctor.watch`: the runtime doctor around a training loop.

``with torchdoctor.watch(model, optimizer):`` (see `torchdoctor.watch.session`). The check contract,
events and extension points are documented in `torchdoctor.watch.contract`; the hooks behind each event
in `torchdoctor.watch.events`. This package's ``__init__`` and `contract` stay torch-free, because the
built-in check modules import the contract when the registry loads.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from torchdoctor.watch.contract import Event, RuntimeCheck

__all__ = ["Event", "RuntimeCheck", "watch", "WatchSession"]


def __getattr__(name: str) -> Any:
    if name in ("watch", "WatchSession"):
        from torchdoctor.watch import session

        return getattr(session, name)
    raise AttributeError(f"module 'torchdoctor.watch' has no attribute {name!r}")


class _CallableModule(types.ModuleType):
    """Importing ``torchdoctor.watch`` binds the package over the lazy function; keep it callable."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from torchdoctor.watch.session import watch

        return watch(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
