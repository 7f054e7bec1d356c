"""`torchdoctor lint --watch`: lint, then lint again whenever a Python file under the paths (or the project's
pyproject.toml) is added, removed or changed. Changes are found by polling modification stamps: no
dependency, and the same on every platform."""

from __future__ import annotations

import os
import time
from typing import Callable, Iterable, Optional

from torchdoctor.lint.files import Pattern, discover
from torchdoctor.lint.program import stamp

POLL_SECONDS = 0.5


def snapshot(
    paths: Iterable[str], exclude: Iterable["str | Pattern"] = (), extra: Iterable[str] = ()
) -> dict[str, str]:
    """path -> modification stamp of every file a lint of `paths` reads, and of the `extra` files (settings)."""
    try:
        found = {path: stamp(path) for path in discover(paths, exclude)}
    except FileNotFoundError:  # a path was removed: that is a change too
        found = {}
    found.update({path: stamp(path) for path in extra})
    return found


def watch(
    lint_once: Callable[[], object],
    current: Callable[[], dict[str, str]],
    sleep: Optional[Callable[[float], None]] = None,
    rounds: Optional[int] = None,
    announce: Callable[[str], None] = lambda _: None,
) -> int:
    """Run `lint_once`, then again each time `current()` (a `snapshot`) changes, polling every POLL_SECONDS
    with `sleep` (default time.sleep); `rounds` bounds the polls (None: until interrupted, Ctrl-C).
    Returns how many times it linted."""
    sleep = sleep or time.sleep
    seen = current()
    lint_once()
    runs, polls = 1, 0
    try:
        while rounds is None or polls < rounds:
            sleep(POLL_SECONDS)
            polls += 1
            now = current()
            if now != seen:
                changed = sorted(p for p in set(now) | set(seen) if now.get(p) != seen.get(p))
                seen = now
                announce(
                    f"{len(changed)} file{'s' if len(changed) != 1 else ''} changed "
                    f"({os.path.basename(changed[0])}{', ...' if len(changed) > 1 else ''}): linting again"
                )
                lint_once()
                runs += 1
    except KeyboardInterrupt:
        pass
    return runs
