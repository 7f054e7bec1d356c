"""Removable handles, torch-free: the session's `HookSet`, `Restore` for per-instance monkeypatches, and
`WarningFilter` for a warning filter that lives as long as the session."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Optional


class HookSet:
    """Every removable thing the session (or a check through ``ctx.hooks``) installed; removed at exit."""

    def __init__(self) -> None:
        self._handles: list[Any] = []
        self._observed: list["WhileObserving"] = []

    def add(self, handle: Any) -> Any:
        """Keep `handle` (anything with ``.remove()``) to remove it when the session ends."""
        self._handles.append(handle)
        return handle

    def add_observed(self, install: Callable[[], Any], keep: Optional[Callable[[], bool]] = None) -> "WhileObserving":
        """Instrumentation that matters only at the steps the session observes: `install()` makes the handle
        now and whenever observing resumes, and it is removed whenever observing pauses (`observe`), so the
        steps in between pay nothing for it. Once `keep()` says so at a pause, it stays on for the session
        (a patch that torch.compile guards on: taking it off and on would recompile)."""
        handle = WhileObserving(install, keep)
        self._observed.append(handle)
        return self.add(handle)

    def observe(self, on: bool) -> list[BaseException]:
        """Resume (`on`) or pause the `add_observed` instrumentation; returns the errors instead of raising."""
        errors: list[BaseException] = []
        for handle in self._observed:
            try:
                handle.resume() if on else handle.pause()
            except Exception as exc:
                errors.append(exc)
        return errors

    def remove(self, handle: Any) -> None:
        """Remove one handle now."""
        if handle in self._handles:
            self._handles.remove(handle)
        if handle in self._observed:
            self._observed.remove(handle)
        handle.remove()

    def remove_all(self) -> list[BaseException]:
        """Remove everything, newest first; returns the errors instead of raising them."""
        errors: list[BaseException] = []
        self._observed = []
        while self._handles:
            try:
                self._handles.pop().remove()
            except Exception as exc:
                errors.append(exc)
        return errors

    def added_since(self, count: int) -> list[Any]:
        """The handles added after the set held `count` of them."""
        return self._handles[count:]

    def __len__(self) -> int:
        return len(self._handles)


class WhileObserving:
    """A handle made by `install` while the session observes steps, and removed while it does not (or paused
    and resumed, where the handle can: a `MethodPatch` keeps its wrapper)."""

    def __init__(self, install: Callable[[], Any], keep: Optional[Callable[[], bool]] = None) -> None:
        self.install = install
        self.keep = keep
        self.kept = False
        self.paused = False
        self.handle: Any = install()

    def pause(self) -> None:
        if self.kept or (self.handle is not None and self.keep is not None and self.keep()):
            self.kept = True
            return
        if self.handle is None or self.paused:
            return
        if hasattr(self.handle, "pause"):
            self.handle.pause()
            self.paused = True
        else:
            handle, self.handle = self.handle, None
            handle.remove()

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self.handle.resume()
        elif self.handle is None:
            self.handle = self.install()

    def remove(self) -> None:
        self.kept = self.paused = False
        if self.handle is not None:
            handle, self.handle = self.handle, None
            handle.remove()


class Restore:
    """A handle that undoes a monkeypatch: puts `original` back as `obj.attr` (or deletes the attribute)."""

    _MISSING = object()

    def __init__(self, obj: Any, attr: str, patched: Any, original: Any = _MISSING) -> None:
        self.obj, self.attr, self.patched, self.original = obj, attr, patched, original

    def remove(self) -> None:
        if self.obj.__dict__.get(self.attr) is not self.patched:
            return  # someone else replaced it since; leave theirs alone
        if self.original is Restore._MISSING:
            delattr(self.obj, self.attr)
        else:
            setattr(self.obj, self.attr, self.original)


class WarningFilter:
    """An "ignore" filter for one warning message while the session runs; `remove()` takes it out again."""

    def __init__(self, message: str, category: type[Warning] = UserWarning) -> None:
        warnings.filterwarnings("ignore", message=message, category=category)
        self.entry = warnings.filters[0]

    def remove(self) -> None:
        if self.entry in warnings.filters:
            warnings.filters.remove(self.entry)  # type: ignore[attr-defined]  # typeshed: a Sequence; it is a list
            # invalidate the per-module "already warned" caches (the name differs across Python versions)
            mutated = getattr(warnings, "_filters_mutated", None) or getattr(
                warnings, "_filters_mutated_lock_held", None
            )
            if mutated is not None:
                mutated()
