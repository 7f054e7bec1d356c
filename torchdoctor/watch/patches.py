"""Patches shared by all live sessions, so that sessions nest and stop in any order.

- ``DataLoader.__iter__`` reports each new pass (``iter()`` looks methods up on the type, so a loader's
  passes can only be seen by patching its class): `LoaderPatch`.
- An object's method (an optimizer's ``zero_grad``, or ``step`` where the optimizer has no hook
  dictionaries) calls listeners before and after the original: `MethodPatch`.

One wrapper per patched thing, installed when the first listener subscribes and removed when the last
one leaves, whichever session that is.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

Listener = Callable[[Any, Any], None]
CallListener = Callable[[Any, tuple, dict], None]

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


class _MethodWrapper:
    """The one wrapper of ``obj.<attr>``: the original bound method and the listeners of live sessions."""

    def __init__(self, obj: Any, attr: str) -> None:
        self.attr = attr
        self.had_own = attr in obj.__dict__
        self.original = getattr(obj, attr)
        self.before: list[CallListener] = []
        self.after: list[CallListener] = []
        wrapper = self

        @functools.wraps(self.original)
        def patched(*args: Any, **kwargs: Any) -> Any:
            for listener in wrapper.before:  # `MethodPatch` rebinds the lists: no copy per call
                listener(obj, args, kwargs)
            result = wrapper.original(*args, **kwargs)
            for listener in wrapper.after:
                listener(obj, args, kwargs)
            return result

        self.patched = patched
        setattr(obj, attr, patched)

    def restore(self, obj: Any) -> None:
        if obj.__dict__.get(self.attr) is not self.patched:
            return  # someone else replaced it since; leave theirs alone
        if self.had_own:
            setattr(obj, self.attr, self.original)
        else:
            delattr(obj, self.attr)

    def reattach(self, obj: Any) -> bool:
        """Put this wrapper back on `obj` after `restore`, unless something replaced the original since (then
        False: a new wrapper must wrap what is there now). Cheaper than a new wrapper (``functools.wraps``)."""
        if (self.attr in obj.__dict__) != self.had_own or getattr(obj, self.attr, None) != self.original:
            return False  # (a bound method is made anew at each lookup: equal, not identical)
        setattr(obj, self.attr, self.patched)
        return True


# (id(obj), attr) -> wrapper; an entry lives only while a session listens, and the wrapper's closure holds
# the object only as long as the patch is on it (or paused, `MethodPatch.pause`).
_wrappers: dict[tuple[int, str], _MethodWrapper] = {}


class MethodPatch:
    """Handle of one session's listeners on ``obj.<attr>()``; ``remove()`` unsubscribes them and takes the
    wrapper off when no session listens any more. ``pause()`` and ``resume()`` do the same for a while
    (instrumentation of the observed steps only, `torchdoctor.watch.handles.WhileObserving`), keeping the
    wrapper to put back."""

    def __init__(
        self, obj: Any, attr: str, before: Optional[CallListener] = None, after: Optional[CallListener] = None
    ) -> None:
        self.obj, self.key = obj, (id(obj), attr)
        self.wrapper: Optional[_MethodWrapper] = None
        self.listeners = [("before", before), ("after", after)]
        self.resume()

    def resume(self) -> None:
        """Subscribe the listeners (again), wrapping the method where no session does now."""
        obj, attr = self.obj, self.key[1]
        wrapper = _wrappers.get(self.key)
        if wrapper is None or obj.__dict__.get(attr) is not wrapper.patched:
            if wrapper is None and self.wrapper is not None and self.wrapper.reattach(obj):
                wrapper = self.wrapper  # ours, paused: put back as it was
            else:
                wrapper = _MethodWrapper(obj, attr)
            _wrappers[self.key] = wrapper
        self.wrapper = wrapper
        for where, listener in self.listeners:
            if listener is not None:
                setattr(wrapper, where, [*getattr(wrapper, where), listener])

    def pause(self) -> None:
        """Unsubscribe the listeners until `resume`; the wrapper comes off when no session listens any more."""
        wrapper = self.wrapper
        if wrapper is None:
            return
        for where, listener in self.listeners:
            if listener is not None:
                setattr(wrapper, where, [x for x in getattr(wrapper, where) if x is not listener])
        if not wrapper.before and not wrapper.after:
            wrapper.restore(self.obj)
            if _wrappers.get(self.key) is wrapper:
                del _wrappers[self.key]

    def remove(self) -> None:
        self.pause()
        self.obj = self.wrapper = None
