"""Discovery of plug-in checks: the installed distributions' `torchdoctor.checks` entry points.

`importlib.metadata` answers by reading every distribution's metadata, and importing it is most of that
cost (tens of milliseconds on every command). So the search path is surveyed first, the way
`importlib.metadata` finds distributions (each entry's `*.dist-info`/`*.egg-info` folders, an egg's
`EGG-INFO`): when no `entry_points.txt` there mentions the group, there is no plug-in and nothing more is
read. Otherwise the answer is kept in the per-user cache, keyed by everything it depends on: the search path,
the distributions on each entry and the modification time of each `entry_points.txt` (installing, removing
or editing a distribution changes one of them); the last few search paths keep their answer (the console
script and `python -m` from a project each see another). A search path the survey cannot read (a zip on
it, another finder of distributions installed) always asks. A cache that cannot be read or written only
means asking `importlib.metadata` again.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from dataclasses import dataclass
from importlib.machinery import PathFinder
from typing import Any, Optional

from torchdoctor.settings import cache_dir

GROUP = "torchdoctor.checks"
_FILE = "plugins.json"
_FORMAT = 3
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
    key, declared = _survey()
    if not declared:
        return []
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


def _survey() -> tuple[list[Any], bool]:
    """What discovery depends on (the interpreter, each search-path entry, its distributions and the modification
    times of their entry points), and whether any of them may declare the group."""
    key: list[Any] = [sys.version, sys.prefix]
    declared = any(f is not PathFinder and hasattr(f, "find_distributions") for f in sys.meta_path)
    for entry in sys.path:
        folder = entry or "."
        try:
            with os.scandir(folder) as children:
                names = sorted(c.name for c in children if _is_metadata(c.name, folder))
        except NotADirectoryError:  # a zip: its distributions are not surveyed here
            key.append([entry, _mtime(folder)])
            declared = True
            continue
        except OSError:
            key.append([entry, None])
            continue
        dists = []
        for name in names:
            mtime, mentions = _entry_points(os.path.join(folder, name, "entry_points.txt"))
            dists.append([name, mtime])
            declared = declared or mentions
        key.append([entry, dists])
    return key, declared


def _is_metadata(name: str, folder: str) -> bool:
    """A distribution's metadata folder, as `importlib.metadata` looks for them on a search-path entry."""
    low = name.lower()
    return low.endswith((".dist-info", ".egg-info")) or (low == "egg-info" and folder.lower().endswith(".egg"))


def _entry_points(path: str) -> tuple[Optional[int], bool]:
    """The modification time of an `entry_points.txt` (None: there is none) and whether it mentions the group."""
    try:
        with open(path, "rb") as f:
            return os.fstat(f.fileno()).st_mtime_ns, GROUP.encode() in f.read()
    except OSError:
        return None, False


def _mtime(path: str) -> Optional[int]:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None
