"""Byte counts as people read them: one format for every front door's messages and reports."""

from __future__ import annotations

from typing import Optional

_UNITS = ("KiB", "MiB", "GiB", "TiB")


def byte_size(n: Optional[float]) -> str:
    """`512 bytes`, `1.5 KiB`, `64 MiB`, `3.2 GiB`, `1,536 TiB` (binary units; `?` when unknown)."""
    if n is None:
        return "?"
    if abs(n) < 1024:
        return "1 byte" if n == 1 else f"{n:,.0f} bytes"
    for unit in _UNITS:
        n /= 1024
        if round(abs(n), 1) < 1024 or unit == _UNITS[-1]:
            break
    text = f"{n:,.1f}"
    return f"{text[:-2] if text.endswith('.0') else text} {unit}"
