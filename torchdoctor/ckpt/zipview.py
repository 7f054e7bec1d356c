"""Where a zip's central directory is, as Python's `zipfile` finds it and as torch's reader (miniz) finds it.

The two readers take the same end-of-central-directory record (the last one) but differ after it:
`zipfile` reads the zip64 end record just before the zip64 locator and places the central directory right
before the end records, shifting every offset by the difference (bytes prepended to the archive), while
miniz reads the zip64 end record at the offset the locator gives and takes the directory's offset as
written. Any difference between the two means one file holds two archives: a scanner using one reader and
`torch.load` the other see different pickles. When both agree (every file `torch.save` writes), the check
costs three small reads.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import IO, Optional

_EOCD = b"PK\x05\x06"
_END = struct.Struct("<4s4H2LH")
_LOCATOR = struct.Struct("<4sLQL")
_ZIP64_END = struct.Struct("<4sQ2H2L4Q")
_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")


@dataclass(frozen=True)
class Views:
    """The central directory (start, size) as each reader finds it, and zipfile's offset shift."""

    end_at: int  # where the end-of-central-directory record starts
    zipfile_start: int
    zipfile_size: int
    concat: int  # bytes before the archive, as zipfile computes them (added to every offset it reads)
    torch_start: int
    torch_size: int

    @property
    def agree(self) -> bool:
        """True when both readers find the same directory and zipfile sees no prepended bytes: the file
        holds one archive, read alike by the scanner and by `torch.load`.
        """
        return (self.zipfile_start, self.zipfile_size, self.concat) == (self.torch_start, self.torch_size, 0)


class _Window:
    """A read-only file object over bytes [start, start+length) of an open file (for zips stored back to back)."""

    def __init__(self, f: IO[bytes], start: int, length: int) -> None:
        self.f, self.start, self.length, self.pos = f, start, length, 0

    def seek(self, offset: int, whence: int = 0) -> int:
        """Move to `offset` from the window's start, current position or end (`whence` 0, 1, 2), as zipfile asks."""
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else self.length + offset
        return self.pos

    def tell(self) -> int:
        """The position within the window."""
        return self.pos

    def read(self, n: int = -1) -> bytes:
        """Up to `n` bytes from the position (all that remain for n None or < 0), never past the window's end."""
        n = self.length - self.pos if n is None or n < 0 else min(n, self.length - self.pos)
        if n <= 0:
            return b""
        self.f.seek(self.start + self.pos)
        data = self.f.read(n)
        self.pos += len(data)
        return data

    def seekable(self) -> bool:
        """Always True: zipfile seeks to find the central directory and each member."""
        return True

    def readable(self) -> bool:
        """Always True: the window is a readable file for zipfile."""
        return True


def window(f: IO[bytes], start: int, length: int) -> IO[bytes]:
    """`f` seen from `start` for `length` bytes, as a file of its own."""
    return _Window(f, start, length)  # type: ignore[return-value]


def views(f: IO[bytes], size: int) -> Optional[Views]:
    """Both readers' view of the directory; None when there is no usable end record (zipfile raised already)."""
    tail_start = max(0, size - (1 << 16) - _END.size)
    f.seek(tail_start)
    tail = f.read()
    at = tail.rfind(_EOCD, 0, len(tail) - _END.size + len(_EOCD))
    if at < 0:
        return None
    end_at = tail_start + at
    fields = _END.unpack(tail[at : at + _END.size])
    size_cd, offset_cd = fields[5], fields[6]
    z_size, z_offset, t_size, t_offset = size_cd, offset_cd, size_cd, offset_cd
    records = 0
    if end_at >= _LOCATOR.size:
        f.seek(end_at - _LOCATOR.size)
        magic, _, reloff, _ = _LOCATOR.unpack(f.read(_LOCATOR.size))
        if magic == b"PK\x06\x07":
            records = _LOCATOR.size + _ZIP64_END.size
            zipfile_record = _zip64(f, end_at - records)  # zipfile: right before the locator
            if zipfile_record is not None:
                z_size, z_offset = zipfile_record
            torch_record = _zip64(f, reloff) if reloff <= size - _ZIP64_END.size else None  # miniz: where it says
            if torch_record is not None:
                t_size, t_offset = torch_record
    z_start = end_at - records - z_size
    return Views(end_at, z_start, z_size, z_start - z_offset, t_offset, t_size)


def _zip64(f: IO[bytes], at: int) -> Optional[tuple[int, int]]:
    if at < 0:
        return None
    f.seek(at)
    record = f.read(_ZIP64_END.size)
    if len(record) < _ZIP64_END.size or record[:4] != b"PK\x06\x06":
        return None
    fields = _ZIP64_END.unpack(record)
    return fields[8], fields[9]


@dataclass(frozen=True)
class Member:
    """A record as torch's reader would locate it."""

    name: str
    header_offset: int
    compress_size: int
    file_size: int
    compress_type: int
    flag_bits: int


def torch_member(f: IO[bytes], v: Views, suffix: str, limit: int = 1 << 20) -> Optional[Member]:
    """The record torch's reader loads as `<first record's folder>/<suffix>` (None when it finds none)."""
    if v.torch_size > limit * 64:
        return None
    f.seek(v.torch_start)
    data = f.read(v.torch_size)
    pos, prefix, found = 0, None, None
    while pos + _CENTRAL.size <= len(data):
        fields = _CENTRAL.unpack_from(data, pos)
        if fields[0] != b"PK\x01\x02":
            return None
        name_len, extra_len, comment_len = fields[12], fields[13], fields[14]
        name = data[pos + _CENTRAL.size : pos + _CENTRAL.size + name_len].decode("utf-8", "replace")
        if prefix is None:
            prefix = name.split("/", 1)[0]
        if name == f"{prefix}/{suffix}" and found is None:
            sizes = [fields[11], fields[10], fields[18]]  # zip64 extra: the fields that are 0xFFFFFFFF, in order
            extra = data[pos + _CENTRAL.size + name_len : pos + _CENTRAL.size + name_len + extra_len]
            at = 0
            while at + 4 <= len(extra):
                tag, length = struct.unpack_from("<HH", extra, at)
                if tag == 1:
                    values = iter(struct.unpack_from(f"<{length // 8}Q", extra, at + 4))
                    sizes = [next(values, s) if s == 0xFFFFFFFF else s for s in sizes]
                at += 4 + length
            found = Member(name, sizes[2], sizes[1], sizes[0], fields[6], fields[5])
        pos += _CENTRAL.size + name_len + extra_len + comment_len
    return found
