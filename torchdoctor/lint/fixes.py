"""Apply the safe rewrites that findings carry (`--fix`) or show them as a unified diff (`--diff`)."""

from __future__ import annotations

import difflib
import re
from typing import Iterable, Optional

from torchdoctor.findings import Finding
from torchdoctor.lint.source import Edit
from torchdoctor.pysource import parse_quietly

_LINE_END = re.compile(r"\r\n|\r|\n")
_LINE_KEEP = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")  # lines as `ast` counts them, with their endings


def file_edits(findings: Iterable[Finding]) -> dict[str, list[Edit]]:
    """path -> the edits of its fixable findings."""
    out: dict[str, list[Edit]] = {}
    for f in findings:
        edits = getattr(f, "edits", ())
        if edits and f.location is not None and f.location.file:
            out.setdefault(f.location.file, []).extend(edits)
    return out


def newline_of(text: str) -> str:
    """The line ending a file uses (its first one; `\n` when it has none)."""
    match = _LINE_END.search(text)
    return match.group() if match else "\n"


def apply_edits(text: str, edits: Iterable[Edit]) -> Optional[str]:
    """The text with `edits` applied (last first); None when two edits overlap or the result is not valid Python.
    Inserted line breaks take the file's own line ending (a CRLF file stays CRLF)."""
    newline = newline_of(text)
    lines = _LINE_KEEP.findall(text)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(pos: tuple[int, int]) -> int:
        line, col = pos
        return starts[min(line - 1, len(lines))] + col

    spans = sorted({(offset(e.start), offset(e.end), e.text) for e in edits}, reverse=True)
    for (_, end, _), (prev_start, _, _) in zip(spans[1:], spans):
        if end > prev_start:
            return None
    out = text
    for start, end, new in spans:
        out = out[:start] + (new.replace("\n", newline) if newline != "\n" else new) + out[end:]
    try:
        parse_quietly(out)
    except (SyntaxError, ValueError):
        return None
    return out


def unified_diff(path: str, before: str, after: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True), after.splitlines(keepends=True), fromfile=f"a/{path}", tofile=f"b/{path}"
        )
    )
