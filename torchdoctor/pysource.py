"""Parse Python source that torchdoctor reads but never runs (the user's files, libraries' modules, a running
frame's file) without the parser's warnings reaching the user."""

from __future__ import annotations

import ast
import warnings
from contextlib import contextmanager
from typing import Iterator, Union


def parse_quietly(source: Union[str, bytes], filename: str = "<unknown>") -> ast.Module:
    """`ast.parse`, minus the warnings the parser gives about the code it reads: an invalid escape sequence such as
    `"\\d"` is a SyntaxWarning on Python 3.12 (printed by default: noise on the user's terminal) and a
    DeprecationWarning before; under `-W error` either one made the parse fail as if the file were not Python."""
    if warnings.filters[:2] == _QUIET:  # inside `quiet_parsing()`: the filters ignore both already
        return ast.parse(source, filename)
    with warnings.catch_warnings():
        _ignore_parser_warnings()
        return ast.parse(source, filename)


@contextmanager
def quiet_parsing() -> Iterator[None]:
    """Every `parse_quietly` in the block is quiet through one change of the warning filters (lint parses
    thousands of files: a change per parse cost more than some checks)."""
    with warnings.catch_warnings():
        _ignore_parser_warnings()
        yield


def _ignore_parser_warnings() -> None:
    warnings.simplefilter("ignore", SyntaxWarning)
    warnings.simplefilter("ignore", DeprecationWarning)


def _quiet_filters() -> list:
    """The first filters while the parser's warnings are ignored, as `warnings` records them."""
    with warnings.catch_warnings():
        _ignore_parser_warnings()
        return list(warnings.filters[:2])


_QUIET = _quiet_filters()
