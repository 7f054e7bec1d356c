"""Lint results kept between runs, so that linting on every save re-checks only the files that changed.

One JSON file per project root holds, for each linted file: a digest of its bytes (and, for a file not modified
in the last seconds, its size, modification time and inode, so that an unchanged file is not read again), the
questions it asked about the rest of the project (with their answers) and its findings. A result is reused only when the
bytes are the same, every recorded answer still holds, and the fingerprint (torchdoctor's version and
lint code, the selected checks and their code, the Python version) is unchanged. The cache is best effort:
an unreadable, corrupt or unwritable cache only means the files are checked again.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, fields
from typing import Any, Optional, Sequence

from torchdoctor import __version__, registry
from torchdoctor.findings import Finding
from torchdoctor.lint.source import Edit, FixableFinding, ProjectFacts

_FORMAT = 4


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


# A file whose modification time is at least this much older than the moment it was stat'ed and read can only
# change by getting a later time (coarse file systems, FAT, tick in 2 s), so (size, mtime, inode) identifies
# those bytes as git's index does; a younger file is hashed on every run ("racily clean" in git's terms).
_SETTLED_NS = 3_000_000_000


def signature(st: os.stat_result) -> Optional[list[int]]:
    """What identifies a settled file's bytes without reading them; None for a file modified too recently."""
    if time.time_ns() - st.st_mtime_ns < _SETTLED_NS:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino]


@dataclass
class FileResult:
    """What linting one file produced: its findings and the project questions it asked, with their answers."""

    findings: list[Finding]
    asked: list[tuple]
    cacheable: bool = True  # False when a check crashed: such a result is not worth keeping
    problem: Optional[str] = None  # why the file could not be read or parsed (then it was not checked)


class LintCache:
    """The cached results of one project root (see the module docstring)."""

    def __init__(self, directory: str, root: str, checks: Sequence[registry.Pitfall]) -> None:
        name = digest(os.path.abspath(root).encode("utf-8", "surrogatepass"))
        self.path = os.path.join(directory, "lint", f"{name}.json")
        self.fingerprint = _fingerprint(checks)
        self.entries: dict[str, dict[str, Any]] = self._read()
        self._signatures: dict[str, Optional[list[int]]] = {}  # path -> signature of the bytes digested this run
        self.changed = False

    def file_digest(self, path: str) -> Optional[str]:
        """The digest of the file at absolute `path`: the cached one while its signature is unchanged (a stat,
        not a read), else read and hashed now; None when it cannot be read."""
        entry = self.entries.get(path)
        if isinstance(entry, dict) and entry.get("stat") is not None:
            try:
                if signature(os.stat(path)) == entry["stat"] and isinstance(entry.get("digest"), str):
                    self._signatures[path] = entry["stat"]
                    return str(entry["digest"])
            except OSError:
                return None
        try:
            with open(path, "rb") as fh:
                sig = signature(os.fstat(fh.fileno()))  # before reading: a later write changes it
                data = fh.read()
        except OSError:
            return None
        self._signatures[path] = sig
        return digest(data)

    def lookup(self, path: str, data_digest: str, display: str, project: ProjectFacts) -> Optional[FileResult]:
        """The result of the file at absolute `path` (shown as `display`) if its cached result still holds."""
        entry = self.entries.get(path)
        if not isinstance(entry, dict) or entry.get("digest") != data_digest:
            return None
        try:
            if any(project.answer(display, *question[:-1]) != question[-1] for question in entry["asked"]):
                return None
            findings = [_finding(d, display) for d in entry["findings"]]
            return FileResult(findings, entry["asked"], problem=entry["problem"])
        except (KeyError, TypeError, ValueError):
            return None

    def store(self, path: str, data_digest: str, result: FileResult) -> None:
        """Remember the result of the file at absolute `path` (unless a check crashed on it)."""
        if not result.cacheable:
            return
        findings = [f.to_dict() for f in result.findings]
        for f, d in zip(result.findings, findings):
            if d["location"]:
                d["location"].pop("file", None)
            if isinstance(f, FixableFinding) and f.edits:
                d["edits"] = [[list(e.start), list(e.end), e.text] for e in f.edits]
        self.entries[path] = {
            "digest": data_digest,
            "stat": self._signatures.get(path),
            "asked": [list(q) for q in result.asked],
            "findings": findings,
            "problem": result.problem,
        }
        self.changed = True

    def save(self) -> None:
        """Write the cache atomically (entries of files that no longer exist are dropped); errors are ignored."""
        if not self.changed:
            return
        import tempfile  # only a run that checked something writes

        entries = {path: entry for path, entry in self.entries.items() if os.path.exists(path)}
        # json.dumps, not json.dump: only the one-shot form uses the C encoder (several times faster).
        text = json.dumps({"format": _FORMAT, "fingerprint": self.fingerprint, "files": entries}, separators=(",", ":"))
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path), prefix=".lint-", suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(text)
                os.replace(tmp, self.path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError:
            pass

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("format") != _FORMAT or data.get("fingerprint") != self.fingerprint:
            return {}
        files = data.get("files")
        return files if isinstance(files, dict) else {}


_FINDING_FIELDS = tuple(f.name for f in fields(Finding))


def _finding(d: dict[str, Any], display: str) -> Finding:
    """A cached finding, shown at `display`; one that --fix can rewrite comes back with its edits."""
    d = dict(d)  # the cache entry itself keeps its edits for the next run
    edits = d.pop("edits", None)
    finding = Finding.from_dict({**d, "location": {**d["location"], "file": display} if d["location"] else None})
    if not edits:
        return finding
    fixable = FixableFinding(**{name: getattr(finding, name) for name in _FINDING_FIELDS})
    fixable.edits = tuple(Edit(tuple(start), tuple(end), text) for start, end, text in edits)
    return fixable


def library_fingerprint() -> str:
    """What installed libraries' kept facts depend on: the lint engine and the built-in checks (which declare the
    facts), not the selection."""
    return _fingerprint(())


def _fingerprint(checks: Sequence[registry.Pitfall]) -> str:
    """Changes whenever a result could: torchdoctor's lint engine, a built-in check module or a selected
    plug-in check's module is edited, the selection changes, or another Python (another `ast`) runs it."""
    import torchdoctor.checks

    files = {
        os.path.join(folder, name)
        for folder in (os.path.dirname(os.path.abspath(__file__)), *torchdoctor.checks.__path__)
        for name in os.listdir(folder)
        if name.endswith(".py")
    }  # the lint engine and every built-in check
    files.update(sys.modules[name].__file__ for name in ("torchdoctor.findings", "torchdoctor.registry"))
    files.update(
        getattr(sys.modules.get(info.impl(registry.Scope.SOURCE).__module__), "__file__", None) or "" for info in checks
    )
    parts = [__version__, sys.implementation.name, ".".join(map(str, sys.version_info[:3]))]
    parts += sorted(f"{info.code} {info.name} {info.severity}" for info in checks)
    for file in sorted(files):
        try:
            st = os.stat(file)
            parts.append(f"{file} {st.st_mtime_ns} {st.st_size}")
        except OSError:
            parts.append(file)
    return digest("\n".join(parts).encode("utf-8", "surrogatepass"))
