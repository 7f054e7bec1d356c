"""Parse Python source that torchdoctor reads but never runs (the user's files, libraries' modules, a running
frame's file) without the parser's warnings reaching the user."""

from __future__ import annotations

import ast
import warnings
from typing import Union


def parse_quietly(source: Union[str, bytes], filename: str = "<unknown>") -> ast.Module:
    """`ast.parse`, minus the warnings the parser gives about the code it reads: an invalid escape sequence such as
    `"\\d"` is a SyntaxWarning on Python 3.12 (printed by default: noise on the user's terminal) and a
    DeprecationWarning before; under `-W error` either one made the parse fail as if the file were not Python."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return ast.parse(source, filename)
