"""Which files `torchdoctor lint PATH...` reads: Python files under the paths, minus `.gitignore`d and excluded ones."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

# Never worth descending into (also when no .gitignore says so).
SKIPPED_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        ".venv",
        "venv",
        ".tox",
        ".nox",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        "node_modules",
        "site-packages",
        ".eggs",
        "build",
        "dist",
    }
)


@dataclass(frozen=True)
class Pattern:
    """One gitignore-style line, compiled: matched against a '/'-separated path relative to `base`."""

    regex: re.Pattern
    negated: bool
    dir_only: bool
    base: str

    def matches(self, rel: str, is_dir: bool) -> bool:
        return (is_dir or not self.dir_only) and self.regex.match(rel) is not None


def compile_pattern(line: str, base: str = "") -> Optional[Pattern]:
    """Compile one line of a .gitignore (or an --exclude value); None for blanks and comments."""
    line = line.rstrip("\n").rstrip()
    if not line or line.startswith("#"):
        return None
    negated = line.startswith("!")
    if negated:
        line = line[1:]
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    line = line.lstrip("/")
    body = _glob_to_regex(line)
    prefix = "^" if anchored else "^(?:.*/)?"
    return Pattern(re.compile(prefix + body + "$"), negated, dir_only, base)


def _glob_to_regex(glob: str) -> str:
    out, i = [], 0
    while i < len(glob):
        c = glob[i]
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if glob.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = glob.find("]", i + 1)
            if end == -1:
                out.append(re.escape(c))
            else:
                cls = glob[i + 1 : end].replace("\\", "\\\\")
                out.append("[" + ("^" + cls[1:] if cls.startswith("!") else cls) + "]")
                i = end
        elif c == "\\" and i + 1 < len(glob):
            i += 1
            out.append(re.escape(glob[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _ignored(patterns: list[Pattern], path: str, is_dir: bool) -> bool:
    """Git's rule: the last pattern that matches decides."""
    verdict = False
    for p in patterns:
        rel = os.path.relpath(path, p.base).replace(os.sep, "/") if p.base else path.replace(os.sep, "/")
        if rel.startswith("../"):
            continue
        if p.matches(rel, is_dir):
            verdict = not p.negated
    return verdict


def _gitignore(directory: str) -> list[Pattern]:
    try:
        with open(os.path.join(directory, ".gitignore"), encoding="utf-8", errors="replace") as fh:
            lines = fh.readlines()
    except OSError:
        return []
    return [p for p in (compile_pattern(line, directory) for line in lines) if p is not None]


def _inherited_gitignores(directory: str) -> list[Pattern]:
    """The .gitignore files of the enclosing repository above `directory` (outermost first)."""
    chain: list[str] = []
    current = os.path.abspath(directory)
    while True:
        parent = os.path.dirname(current)
        if parent == current:
            return []  # not inside a git work tree: only the tree's own .gitignore files apply
        current = parent
        chain.append(current)
        if os.path.exists(os.path.join(current, ".git")):
            break
    patterns: list[Pattern] = []
    for d in reversed(chain):
        patterns.extend(_gitignore(d))
    return patterns


def discover(paths: Iterable[str], exclude: Iterable["str | Pattern"] = (), cwd: Optional[str] = None) -> Iterator[str]:
    """Yield the Python files to lint, in a stable order.

    A file named on the command line is always read unless `exclude` matches it; directories are
    walked for `*.py` files, skipping `SKIPPED_DIRS`, `.gitignore`d entries and `exclude` patterns
    (gitignore syntax; a string is relative to `cwd`, a compiled `Pattern` to its own base).
    Raises FileNotFoundError for a path that does not exist.
    """
    cwd = os.path.abspath(cwd or os.getcwd())
    excludes = [p for p in (e if isinstance(e, Pattern) else compile_pattern(e, cwd) for e in exclude) if p is not None]
    seen: set[str] = set()
    for raw in paths:
        path = os.path.abspath(raw)
        if not os.path.exists(path):
            raise FileNotFoundError(raw)
        if not os.path.isdir(path):
            if path not in seen and not _ignored(excludes, path, False):
                seen.add(path)
                yield path
            continue
        if _ignored(excludes, path, True):
            continue
        for found in _walk(path, _inherited_gitignores(path), excludes):
            if found not in seen:
                seen.add(found)
                yield found


def _walk(top: str, inherited: list[Pattern], excludes: list[Pattern]) -> Iterator[str]:
    patterns = inherited + _gitignore(top)
    try:
        entries = sorted(os.scandir(top), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        try:
            is_dir = entry.is_dir(follow_symlinks=False)  # a linked folder may loop back: not followed
        except OSError:
            continue
        if is_dir:
            if entry.name in SKIPPED_DIRS or entry.name.endswith(".egg-info"):
                continue
            if _ignored(patterns, entry.path, True) or _ignored(excludes, entry.path, True):
                continue
            yield from _walk(entry.path, patterns, excludes)
        elif entry.name.endswith(".py") and entry.is_file():
            if not _ignored(patterns, entry.path, False) and not _ignored(excludes, entry.path, False):
                yield entry.path


def display_path(path: str, cwd: Optional[str] = None) -> str:
    """The path as the user will click it: relative to the working directory when inside it."""
    cwd = cwd or os.getcwd()
    prefix = cwd.rstrip(os.sep) + os.sep
    if path.startswith(prefix) and os.path.isabs(path):  # the common case, without os.path.relpath's cost
        return path[len(prefix) :]
    rel = os.path.relpath(path, cwd)
    return path if rel.startswith("..") else rel
