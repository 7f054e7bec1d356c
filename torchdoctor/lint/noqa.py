"""`torchdoctor lint --add-noqa`: silence every current finding with a `# noqa: CODE` comment on its line, as
`ruff check --add-noqa` does (an existing `# noqa: ...` of the line gets the new codes added)."""

from __future__ import annotations

import io
import re
import tokenize
from typing import Iterable, Optional

from torchdoctor.findings import Finding
from torchdoctor.lint.runner import NOQA

_LINE_KEEP = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")
_NEVER = frozenset({"TD507"})  # source-unreadable: the file's comments are not trusted, so a noqa would not hold


def codes_by_line(findings: Iterable[Finding], path: str) -> dict[int, set[str]]:
    """line -> codes of the findings of `path` that a comment on that line can silence."""
    out: dict[int, set[str]] = {}
    for f in findings:
        loc = f.location
        if loc is not None and loc.file == path and loc.line and f.code not in _NEVER:
            out.setdefault(loc.line, set()).add(f.code)
    return out


def add_noqa(text: str, codes: dict[int, set[str]]) -> tuple[Optional[str], int, list[int]]:
    """The text with `# noqa: CODES` at the end of each line of `codes`; how many lines got one, and the lines
    where a comment cannot go (inside a multi-line string, or ending in a backslash). None if `text` does not
    tokenize (then nothing is added)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return None, 0, []
    inside: set[int] = set()  # lines whose end lies inside a string token
    comments: dict[int, tokenize.TokenInfo] = {}
    for tok in tokens:
        if tok.start[0] < tok.end[0] and tok.type not in (tokenize.NEWLINE, tokenize.NL):
            inside.update(range(tok.start[0], tok.end[0]))
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok
    lines = _LINE_KEEP.findall(text)
    added, refused = 0, []
    for number in sorted(codes):
        if not 0 < number <= len(lines):
            continue
        line = lines[number - 1]
        body = line.rstrip("\r\n")
        ending = line[len(body) :]
        if number in inside or body.rstrip().endswith("\\"):
            refused.append(number)
            continue
        wanted = sorted(codes[number])
        comment = comments.get(number)
        match = NOQA.search(comment.string) if comment is not None else None
        if match is not None and match.group("codes") is None:
            continue  # a bare noqa comment silences everything already
        if match is not None:
            have = re.split(r"[,\s]+", match.group("codes"))
            new = [c for c in wanted if c not in {h.upper() for h in have}]
            if not new:
                continue
            start = comment.start[1] + match.end("codes")  # type: ignore[union-attr]
            body = _char_insert(body, start, ", " + ", ".join(new))
        else:
            body = body.rstrip() + "  # noqa: " + ", ".join(wanted)
        lines[number - 1] = body + ending
        added += 1
    return "".join(lines), added, refused


def _char_insert(body: str, column: int, text: str) -> str:
    """`text` inserted at character `column` of `body` (tokenize counts characters, not bytes)."""
    return body[:column] + text + body[column:]
