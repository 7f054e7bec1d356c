"""Discovery of plug-in checks: the installed distributions' `torchdoctor.checks` entry points.

`importlib.metadata` answers by reading every distribution's metadata, and importing it is most of that
cost (tens of milliseconds on every command). The answer is kept in the per-user cache, keyed by
everything it depends on: the search path, and the modification time of each distribution's
`entry_points.txt` on it (installing, removing or editing a distribution changes one of them); the last few
search paths keep their answer (the console script and `python -m` from a project each see another). A cache
that cannot be read or written only means asking `importlib.metadata` again.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Optional

from torchdoctor.settings import cache_dir

GROUP = "torchdoctor.checks"
_FILE = "plugins.json"
_FORMAT = 2
_KEPT = 8  # answers kept: the console script and `python -m` from a few folders see different search paths


@dataclass(frozen=True)
class Plugin:
    """One entry point: its name, its `module:attribute` value and the distribution that declares it."""

    name: str
    value: str
    dist: str

    def load(self) -> Any:
        """Import what the entry point names, as `importlib.metadata.EntryPoint.load` does (extras ignored)."""
        module, _, attrs = self.value.split("[", 1)[0].partition(":")
        obj = importlib.import_module(module.strip())
        for attr in filter(None, attrs.strip().split(".")):
            obj = getattr(obj, attr)
        return obj


def plugins() -> list[Plugin]:
    """The entry points of group `torchdoctor.checks`, from the cache when nothing they depend on changed."""
    key = _fingerprint()
    path = os.path.join(cache_dir(), _FILE)
    answers: list[Any] = []
    try:
        with open(path, encoding="utf-8") as f:
            cached = json.load(f)
        if cached.get("format") == _FORMAT:
            answers = [a for a in cached["answers"] if isinstance(a, list) and len(a) == 2]
        for known, rows in answers:
            if known == key:
                return [Plugin(*row) for row in rows]
    except (OSError, ValueError, TypeError, AttributeError, KeyError):
        pass
    found = _discover()
    answers = [[key, [[p.name, p.value, p.dist] for p in found]], *[a for a in answers if a[0] != key]][:_KEPT]
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"format": _FORMAT, "answers": answers}, f)
        os.replace(tmp, path)
    except OSError:
        pass
    return found


def _discover() -> list[Plugin]:
    from importlib import metadata

    out = []
    for ep in metadata.entry_points(group=GROUP):
        dist = getattr(ep, "dist", None)
        out.append(Plugin(ep.name, ep.value, dist.name if dist is not None else ""))
    return out


def _fingerprint() -> list[Any]:
    """What discovery depends on: the interpreter, each search-path entry and its distributions' entry points."""
    key: list[Any] = [sys.version, sys.prefix]
    for entry in sys.path:
        folder = entry or "."
        key.append([entry, _mtime(folder)])
        try:
            with os.scandir(folder) as children:
                names = sorted(c.name for c in children if c.name.endswith((".dist-info", ".egg-info")))
        except OSError:
            continue
        key.append([[n, _mtime(os.path.join(folder, n, "entry_points.txt"))] for n in names])
    return key


def _mtime(path: str) -> Optional[int]:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None
