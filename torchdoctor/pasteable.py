"""Output a person can paste: ASCII stand-ins for what a stream can't encode, and no padding at line ends."""

from __future__ import annotations

import codecs
import io
from typing import IO

STAND_INS = "torchdoctor-ascii"  # the codecs error handler registered below
_ASCII = {
    "✓": "OK",
    "✗": "X",
    "×": "x",
    "·": "-",
    "…": "...",
    "≥": ">=",
    "≤": "<=",
    "→": "->",
    "←": "<-",
    "—": "--",
    "–": "-",
    "‘": "'",
    "’": "'",
    "“": '"',
    "”": '"',
    "°": " deg",
    "\u00a0": " ",
}


def _stand_ins(exc: UnicodeError) -> tuple[str, int]:
    """For `str.encode(errors=STAND_INS)`: an ASCII look-alike for each character, else its backslash escape."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    text = exc.object[exc.start : exc.end]
    return "".join(_ASCII.get(ch) or ch.encode("ascii", "backslashreplace").decode("ascii") for ch in text), exc.end


codecs.register_error(STAND_INS, _stand_ins)


def can_encode(stream: IO[str], text: str) -> bool:
    """Whether `stream` can write `text` as it is (its encoding has every character)."""
    try:
        text.encode(getattr(stream, "encoding", None) or "utf-8")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def use_stand_ins(*streams: IO[str]) -> None:
    """Make the process's own text streams write ASCII stand-ins instead of raising UnicodeEncodeError (CLI only)."""
    for stream in streams:
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors=STAND_INS)


class PasteableStream:
    """What rich writes through to a stream that is not a terminal or lacks the symbols: characters the stream
    can't encode become ASCII stand-ins (✓ → OK, … → ...) instead of a crash, and, off a terminal, no line
    ends in the spaces that rich pads with."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._terminal = stream.isatty()
        self._spaces = ""  # held back until the line goes on: trailing ones are dropped
        self.encoding = getattr(stream, "encoding", None) or "utf-8"

    def isatty(self) -> bool:
        return self._terminal

    def write(self, text: str) -> int:
        out = text.encode(self.encoding, STAND_INS).decode(self.encoding)
        if not self._terminal:
            *ended, last = (self._spaces + out).split("\n")
            kept = last.rstrip(" ")
            self._spaces = last[len(kept) :]
            out = "\n".join([*(line.rstrip(" ") for line in ended), kept])
        self._stream.write(out)
        return len(text)

    def flush(self) -> None:
        self._stream.flush()
