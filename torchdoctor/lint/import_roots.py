"""The top-level names a module's imports start from (`torch` for `from torch.nn import Linear`), read from its
bytes without parsing or resolving anything (the index records the same for a parsed module): a file that imports
no project module cannot call another file's function, so the callers search needs neither to parse it nor to
keep it."""

from __future__ import annotations

import re
from typing import Optional

# The root given for a relative import (`from . import x`, `from ..pkg import y`), here and in the index.
RELATIVE = "."

_FROM = re.compile(rb"[ \t]*from[ \t]+(\.*)[ \t]*([A-Za-z_][\w.]*)?[ \t]+import\b")
_NAME = rb"[A-Za-z_][\w.]*(?:[ \t]+as[ \t]+\w+)?"  # `a.b` or `a.b as c`
_IMPORT = re.compile(rb"[ \t]*import[ \t]+(" + _NAME + rb"(?:[ \t]*,[ \t]*" + _NAME + rb")*)[ \t]*(?:#.*)?\r?$")
_WORD = re.compile(rb"(?<![\w.])import\b")


def from_text(data: bytes) -> Optional[set[str]]:
    """The roots of every import statement in the file's bytes; None when a line holds the word `import` outside
    a statement this reads whole (`try: import x`, `x = 1; import y`, a continued line, a string): then any
    import is possible. Comment lines are skipped; a docstring's example import counts (more, never fewer)."""
    roots: set[str] = set()
    at = data.find(b"import")
    while at >= 0:
        start = data.rfind(b"\n", 0, at) + 1
        end = data.find(b"\n", at)
        if end < 0:
            end = len(data)
        line = data[start:end]
        found = _FROM.match(line)
        if found is not None and (found.group(1) or found.group(2)):
            roots.add(RELATIVE if found.group(1) else found.group(2).split(b".", 1)[0].decode())
        else:
            found = _IMPORT.match(line)
            if found is not None:
                for part in found.group(1).split(b","):
                    roots.add(part.split()[0].split(b".", 1)[0].decode())
            elif not line.lstrip().startswith(b"#") and _WORD.search(line):
                return None
        at = data.find(b"import", end)
    return roots
