"""Facts of installed-library functions, kept on disk per distribution version.

A library's source does not change while its version does not, so what a rule's declared fact says about
`timm.utils.cuda.NativeScaler.__call__` is worked out once per (distribution, version) and read back by later runs
(next to the lint results cache: `<cache>/lint/libraries/<name>==<version>.json`), instead of following that
function's calls through the library's modules again. An entry is keyed by the module's path inside its
distribution, the function (class, name, line), the fact and the call depth it was asked at (a fact followed
from a deeper call is followed less far, so the same key always means the same answer). The file is discarded
when lint's code changes (its fingerprint). Best effort: an unreadable or unwritable file only costs the work.
Values that are not booleans or sets of strings / effects are not kept.

Resolutions are kept too: which function a name looked up in a library module, or a method of a class it
defines or re-exports, turns out to be (module, class, name, line, its parameters and the names its body binds),
with the library files the answer read. A later run answers the same question from that without parsing
anything (torchdoctor.lint.stubs), so a run whose project files changed but whose libraries did not parses no
library file at all.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Optional, Sequence, cast

from torchdoctor.lint.facts import Effect, Fact
from torchdoctor.lint.index import FunctionScope
from torchdoctor.lint.stubs import LibraryScope

_FORMAT = 2  # 2: resolutions kept too
_SECTIONS = ("facts", "resolutions")
MISSING = object()


class LibraryFacts:
    """The per-version fact files of one run: read on first use of a distribution, written by `save()`."""

    def __init__(self, directory: str, fingerprint: Callable[[], str], folders: list[str]) -> None:
        self.directory, self.folders = directory, folders
        self._fingerprint, self._print = fingerprint, ""  # worked out on first use: most runs ask no library
        self._tables: dict[str, dict[str, dict[str, Any]]] = {}  # "name==version" -> section -> entries
        self._changed: set[str] = set()
        self._where: dict[str, Optional[tuple[str, str]]] = {}  # module path -> (distribution key, relative path)
        self._dists: dict[str, dict[str, str]] = {}  # library folder -> top-level name -> "name==version"
        self._located: dict[str, object] = {}  # kept relative path -> file in this environment (or None)

    def get(self, path: str, scope: FunctionScope, fact: Fact, depth: int) -> object:
        """The kept value of `fact` for the function, or MISSING."""
        place = self._place(path)
        if place is None:
            return MISSING
        found = self._table(place[0])["facts"].get(_entry(place[1], scope, fact, depth), MISSING)
        return MISSING if found is MISSING else _decode(found)

    def put(self, path: str, scope: FunctionScope, fact: Fact, depth: int, value: object) -> None:
        place = self._place(path)
        encoded = _encode(value) if place is not None else None
        if place is None or encoded is None:
            return
        self._table(place[0])["facts"][_entry(place[1], scope, fact, depth)] = encoded
        self._changed.add(place[0])

    def keeps(self, path: str) -> bool:
        """Whether `path` is a module of an installed distribution (whose answers are kept)."""
        return self._place(path) is not None

    def resolution(self, path: str, kind: str, args: tuple) -> object:
        """The kept answer of a resolution continuing in the library module at `path` ({"found", "read"}), or
        MISSING."""
        place = self._place(path)
        if place is None:
            return MISSING
        return self._table(place[0])["resolutions"].get(_resolution_entry(place[1], kind, args), MISSING)

    def keep_resolution(
        self,
        path: str,
        kind: str,
        args: tuple,
        found: Optional[tuple[str, Optional[str], str, int, Sequence[str], Sequence[str], Sequence[str]]],
        read: set[str],
    ) -> None:
        """Keep what a resolution found (module, class, name, line, positional parameters, every parameter, the
        names the body binds) and the files it read; not when any of them lies outside the library folders."""
        place = self._place(path)
        files = [self.relative(f) for f in sorted(read)]
        target = self.relative(found[0]) if found is not None else ""
        if place is None or target is None or any(f is None for f in files):
            return
        value: dict[str, Any] = {"read": files, "found": None}
        if found is not None:
            _, cls, name, line, params, keywords, bound = found
            value["found"] = {
                "module": target,
                "class": cls,
                "name": name,
                "line": line,
                "params": list(params),
                "keywords": list(keywords),
                "bound": list(bound),
            }
        self._table(place[0])["resolutions"][_resolution_entry(place[1], kind, args)] = value
        self._changed.add(place[0])

    def relative(self, path: str) -> Optional[str]:
        """`path` inside the library folder that holds it ('/'-separated), None outside them."""
        for folder in self.folders:
            prefix = os.path.join(folder, "")
            if path.startswith(prefix):
                return path[len(prefix) :].replace(os.sep, "/")
        return None

    def locate(self, rel: str) -> Optional[str]:
        """The file a kept relative path names in this environment's library folders (None: not there)."""
        found = self._located.get(rel, MISSING)
        if found is MISSING:
            found = next(
                (p for p in (os.path.join(f, *rel.split("/")) for f in self.folders) if os.path.isfile(p)), None
            )
            self._located[rel] = found
        return cast(Optional[str], found)

    def save(self) -> None:
        """Write the files that gained entries (merged with what another process wrote meanwhile)."""
        import tempfile

        for key in sorted(self._changed):
            path = self._file(key)
            there, here = self._read(path), self._tables[key]
            sections = {name: {**there[name], **here[name]} for name in _SECTIONS}
            text = json.dumps({"format": _FORMAT, "fingerprint": self.fingerprint(), **sections})
            try:
                os.makedirs(self.directory, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".lib-", suffix=".tmp")
                try:
                    with os.fdopen(fd, "w", encoding="utf-8") as fh:
                        fh.write(text)
                    os.replace(tmp, path)
                except BaseException:
                    os.unlink(tmp)
                    raise
            except OSError:
                pass
        self._changed.clear()

    def fingerprint(self) -> str:
        if not self._print:
            self._print = self._fingerprint()
        return self._print

    def _table(self, key: str) -> dict[str, dict[str, Any]]:
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = self._read(self._file(key))
        return table

    def _file(self, key: str) -> str:
        safe = "".join(c if c.isalnum() or c in "=.-_" else "_" for c in key)
        return os.path.join(self.directory, f"{safe}.json")

    def _read(self, path: str) -> dict[str, dict[str, Any]]:
        """The kept sections of a file ("facts", "resolutions"); empty ones when it is absent, unreadable, of
        another format or of another version of lint's code."""
        empty: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            return empty
        if not isinstance(data, dict) or data.get("format") != _FORMAT or data.get("fingerprint") != self.fingerprint():
            return empty
        return {name: data[name] if isinstance(data.get(name), dict) else {} for name in _SECTIONS}

    def _place(self, path: str) -> Optional[tuple[str, str]]:
        """(distribution "name==version", path inside the library folder) of a library module; None for a file
        outside the library folders or of no installed distribution (never kept)."""
        if path in self._where:
            return self._where[path]
        found = None
        for folder in self.folders:
            prefix = os.path.join(folder, "")
            if path.startswith(prefix):
                rel = path[len(prefix) :]
                top = rel.split(os.sep, 1)[0]
                top = top[:-3] if top.endswith(".py") else top
                dist = self._distributions(folder).get(top)
                found = (dist, rel.replace(os.sep, "/")) if dist else None
                break
        self._where[path] = found
        return found

    def _distributions(self, folder: str) -> dict[str, str]:
        """Top-level import name -> "name==version" for the distributions installed in `folder` (their
        top_level.txt, else the top-level entries of their RECORD), read once per run."""
        known = self._dists.get(folder)
        if known is None:
            import importlib.metadata

            known = self._dists[folder] = {}
            try:
                dists = list(importlib.metadata.distributions(path=[folder]))
            except Exception:  # a broken distribution's metadata only costs the cache
                dists = []
            for dist in dists:
                try:
                    key = f"{dist.metadata['Name']}=={dist.version}"
                    tops = (dist.read_text("top_level.txt") or "").split()
                    if not tops:
                        record = dist.read_text("RECORD") or ""
                        tops = sorted({line.split("/", 1)[0] for line in record.splitlines() if "/" in line})
                except Exception:
                    continue
                for top in tops:
                    known.setdefault(top, key)
        return known


def _entry(rel: str, scope: FunctionScope, fact: Fact, depth: int) -> str:
    line = scope.lineno if isinstance(scope, LibraryScope) else getattr(scope.node, "lineno", 0)
    return f"{rel}:{scope.class_name or ''}.{scope.name}:{line}:{fact.name}:{depth}"


def _resolution_entry(rel: str, kind: str, args: tuple) -> str:
    """A resolution's key: where it continues, what it looks for (`lookup`: a name; `instance-method`,
    `base-method`: a class and a method), and its hop count where it has one."""
    return "resolve:" + json.dumps([rel, kind, *args])


def _encode(value: object) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, frozenset):
        if all(isinstance(v, str) for v in value):
            return {"s": sorted(value)}
        if all(isinstance(v, Effect) for v in value):
            return {"e": sorted([e.receiver, e.condition, list(e.via)] for e in value)}
    return None


def _decode(found: Any) -> object:
    if isinstance(found, dict) and "s" in found:
        return frozenset(found["s"])
    if isinstance(found, dict) and "e" in found:
        return frozenset(Effect(r, c, tuple(v)) for r, c, v in found["e"])
    return found
