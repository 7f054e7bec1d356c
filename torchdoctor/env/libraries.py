"""Shared libraries that LD_PRELOAD or LD_LIBRARY_PATH put before torch's own, and whether each is a whole ELF file.

The dynamic loader searches LD_LIBRARY_PATH before a library's RUNPATH, so a `libgomp.so.1` there replaces the one
torch ships; a zero-byte or half-copied file then fails as "file too short" or crashes the process (SIGBUS).
Only headers are read (a few hundred bytes per file); nothing is loaded or executed.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import IO, Mapping, Optional

from torchdoctor.env.facts import LibraryCopy

_PT_LOAD, _PT_DYNAMIC, _DT_NEEDED, _DT_STRTAB = 1, 2, 1, 5
_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")  # ELF64 little-endian file header
_PHDR = struct.Struct("<IIQQQQQQ")


def elf_state(path: str) -> "tuple[str, Optional[int]]":
    """("ok" | "empty" | "truncated" | "not ELF" | "wrong class" | "unreadable", size) of a library file."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(_HEADER.size)
            if size == 0:
                return "empty", 0
            if head[:4] != b"\x7fELF":
                return "not ELF", size
            if head[4] != 2 or head[5] != 1:
                return "wrong class", size  # 32-bit or big-endian: not for this 64-bit process
            if len(head) < _HEADER.size:
                return "truncated", size
            fields = _HEADER.unpack(head)
            phoff, shoff, phentsize, phnum, shentsize, shnum = (
                fields[5],
                fields[6],
                fields[9],
                fields[10],
                fields[11],
                fields[12],
            )
            end = max(phoff + phentsize * phnum, shoff + shentsize * shnum if shnum else 0)
            for offset, filesz in _segments(f, phoff, phentsize, phnum):
                end = max(end, offset + filesz)
    except OSError:
        return "unreadable", None
    except struct.error:
        return "truncated", size
    return ("truncated" if end > size else "ok"), size


def _segments(f: IO[bytes], phoff: int, phentsize: int, phnum: int) -> "list[tuple[int, int]]":
    """(file offset, size in the file) of every program header's segment."""
    f.seek(phoff)
    table = f.read(phentsize * phnum)
    out = []
    for i in range(phnum):
        entry = table[i * phentsize : i * phentsize + _PHDR.size]
        if len(entry) < _PHDR.size:
            raise struct.error("program header table cut short")
        _, _, offset, _, _, filesz, _, _ = _PHDR.unpack(entry)
        out.append((offset, filesz))
    return out


def needed(path: str) -> list[str]:
    """The DT_NEEDED names of an ELF64 library (the libraries the loader looks up for it); [] when unreadable."""
    try:
        with open(path, "rb") as f:
            fields = _HEADER.unpack(f.read(_HEADER.size))
            phoff, phentsize, phnum = fields[5], fields[9], fields[10]
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            loads, dynamic = [], None
            for i in range(phnum):
                p_type, _, offset, vaddr, _, filesz, _, _ = _PHDR.unpack(
                    table[i * phentsize : i * phentsize + _PHDR.size]
                )
                if p_type == _PT_LOAD:
                    loads.append((vaddr, offset, filesz))
                elif p_type == _PT_DYNAMIC:
                    dynamic = (offset, filesz)
            if dynamic is None:
                return []
            f.seek(dynamic[0])
            raw = f.read(dynamic[1])
            entries = [struct.unpack_from("<qQ", raw, i) for i in range(0, len(raw) - 15, 16)]
            strtab = next((v for t, v in entries if t == _DT_STRTAB), None)
            if strtab is None:
                return []
            base = next((off + strtab - va for va, off, size in loads if va <= strtab < va + size), None)
            if base is None:
                return []
            names = []
            for tag, value in entries:
                if tag == _DT_NEEDED:
                    f.seek(base + value)
                    names.append(f.read(256).split(b"\0", 1)[0].decode("utf-8", "replace"))
            return names
    except (OSError, struct.error):
        return []


def torch_library_names(torch_location: Optional[str]) -> set[str]:
    """The library names torch loads: the files in torch/lib and what torch's own libraries need."""
    if not torch_location:
        return set()
    lib = Path(torch_location) / "lib"
    try:
        files = [p for p in lib.iterdir() if ".so" in p.name]
    except OSError:
        return set()
    names = {p.name for p in files}
    for p in files:
        if p.name.startswith(("libtorch", "libc10")):
            names.update(needed(str(p)))
    return names


def library_copies(environ: Mapping[str, str], torch_location: Optional[str]) -> list[LibraryCopy]:
    """Every LD_PRELOAD library, and every library in an LD_LIBRARY_PATH folder with the name of one torch loads,
    with the state of its file."""
    found: list[LibraryCopy] = []
    for entry in environ.get("LD_PRELOAD", "").replace(":", " ").split():
        state, size = elf_state(entry) if os.path.isfile(entry) else ("missing", None)
        found.append(LibraryCopy(path=entry, via="LD_PRELOAD", entry=entry, state=state, size=size))
    folders = [d for d in environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    if not folders:
        return found
    names = torch_library_names(torch_location)
    for folder in folders:
        try:
            hits = sorted(n for n in os.listdir(folder) if n in names)
        except OSError:
            continue
        for name in hits:
            path = os.path.join(folder, name)
            state, size = elf_state(path)
            found.append(LibraryCopy(path=path, via="LD_LIBRARY_PATH", entry=folder, state=state, size=size))
    return found


def damaged_torch_files(torch_location: Optional[str]) -> list[str]:
    """The shared libraries in torch's own lib folder that are not whole ELF files (a half-finished download or
    copy): the install itself is damaged."""
    if not torch_location:
        return []
    lib = Path(torch_location) / "lib"
    try:
        files = sorted(p for p in lib.iterdir() if ".so" in p.name and p.is_file())
    except OSError:
        return []
    return [str(p) for p in files if elf_state(str(p))[0] not in ("ok",)]
