"""Callbacks told of every watch session that starts: how the pytest plugin follows a test's sessions.

Torch-free, so that subscribing (the plugin does it when pytest starts a test) imports neither torch nor
the session.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from torchdoctor.watch.session import WatchSession

Observer = Callable[["WatchSession"], None]
_observers: list[Observer] = []
logger = logging.getLogger("torchdoctor")


def observe(callback: Observer) -> Callable[[], None]:
    """Call `callback(session)` whenever a watch session starts, until the returned function is called."""
    _observers.append(callback)
    return lambda: _observers.remove(callback)


def session_started(session: "WatchSession") -> None:
    """Tell every observer that `session` started; an observer's error is logged, never raised into training."""
    for callback in list(_observers):
        try:
            callback(session)
        except Exception as exc:
            logger.warning("torchdoctor: a watch observer failed: %s: %s", type(exc).__name__, exc)
