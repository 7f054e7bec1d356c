"""Open a checkpoint of any common format and interpret its pickles safely (no torch, no code execution).

Formats, sniffed by content as torch does (never by extension): the zip written by `torch.save`
(`<prefix>/data.pkl` + `data/<key>` records), TorchScript archives (zip with `constants.pkl`/`code/`),
the pre-1.6 stacked-pickle format (magic number, protocol, sys_info, object, storage keys, raw
storages), the ancient tar format, plain pickle files, and safetensors (header only).
Tensor bytes are never read here; `Locator`s say where they are for `--scan-values` and `--fix`.
"""

from __future__ import annotations

import copy
import functools
import io
import os
import re
import struct
import zipfile
import zlib
from dataclasses import dataclass, field
from itertools import chain
from operator import le
from typing import IO, Any, Mapping, Optional

from torchdoctor.ckpt.dtypes import SAFETENSORS_DTYPES, STORAGE_DTYPES, itemsize
from torchdoctor.ckpt.errors import CheckpointError
from torchdoctor.ckpt.objects import GlobalRef, Opaque, StorageRef, TensorMeta, contiguous_strides
from torchdoctor.ckpt.rebuild import read_inline_storages_with
from torchdoctor.ckpt.tables import HeaderTensors
from torchdoctor.ckpt.unpickler import Event, Limits, PickleParseError, PickleScan, Source, scan_pickle, short
from torchdoctor.ckpt.zipview import Views, torch_member, views, window

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_PROTO0_STARTS = frozenset(b"(}])cNKJIFSVXUTGld")
_OPCODE_BYTES = frozenset(b"BCMPQabeghijlopqrstu\x8c\x8d\x8e\x8f\x93\x94\x95")
_MAX_SAFETENSORS_HEADER = 100 << 20
_MAX_EXTRA_PICKLES = 32


@dataclass
class Locator:
    """Where a storage's bytes are: a byte range of the file, or a (compressed) zip member."""

    offset: int  # file offset of the first byte (of the compressed data for zip members)
    size: int  # bytes available (uncompressed)
    compressed_size: int = 0
    method: int = 0  # zip compression method; 0 = stored / plain file range


@dataclass
class Archive:
    """The raw result of reading a file: format, container details, pickles and where storages live."""

    path: str
    format: str  # zip, torchscript, legacy, legacy-tar, pickle, safetensors
    file_size: int
    details: dict[str, Any] = field(default_factory=dict)
    pickles: list[tuple[str, PickleScan]] = field(default_factory=list)
    root: Any = None
    storages: dict[str, StorageRef] = field(default_factory=dict)
    locators: dict[str, Locator] = field(default_factory=dict)
    zip_records: dict[str, zipfile.ZipInfo] = field(default_factory=dict)  # located on first use
    problems: list[str] = field(default_factory=list)
    events: list[tuple[str, Event]] = field(default_factory=list)  # container tricks (not tied to one pickle)

    def locator(self, key: str) -> Optional[Locator]:
        """Where storage `key`'s bytes are, or None when the file does not hold them."""
        loc = self.locators.get(key)
        if loc is None and isinstance(self.root, HeaderTensors):
            span = self.root.span(key)
            loc = None if span is None else Locator(*span)
        if loc is None and key in self.zip_records:
            with open(self.path, "rb") as f:
                loc = self.locators[key] = _locator(f, self.zip_records[key])
        return loc


class _Range(io.RawIOBase):
    """A read-only window [offset, offset+length) of an open file."""

    def __init__(self, f: IO[bytes], offset: int, length: int) -> None:
        self.f, self.pos, self.end = f, offset, offset + length

    def readable(self) -> bool:
        """True, overriding `io.RawIOBase`'s False: `io` wrappers refuse a raw stream that is not readable."""
        return True

    def read(self, n: int = -1) -> bytes:
        """Up to `n` bytes from the window (all that remain for n < 0); b"" at its end.

        Seeks before every read, so several windows (and other readers) can share one file object.
        """
        if n < 0 or self.pos + n > self.end:
            n = self.end - self.pos
        if n <= 0:
            return b""
        self.f.seek(self.pos)
        data = self.f.read(n)
        self.pos += len(data)
        return data


class _Inflate(io.RawIOBase):
    """Streaming raw-deflate decompression of a zip member (CRC not checked, as torch does not)."""

    def __init__(self, f: IO[bytes], offset: int, length: int) -> None:
        self.raw = _Range(f, offset, length)
        self.z = zlib.decompressobj(-15)
        self.pending = b""

    def readable(self) -> bool:
        """True, overriding `io.RawIOBase`'s False: `io` wrappers refuse a raw stream that is not readable."""
        return True

    def read(self, n: int = -1) -> bytes:
        """Up to `n` decompressed bytes (at most 1 MiB when n < 0: a member is never inflated whole).

        Each step inflates only what is still wanted (or 64 KiB), so a deflate bomb costs what is read;
        corrupt data raises `CheckpointError`.
        """
        n = 1 << 20 if n < 0 else n
        try:
            while len(self.pending) < n and not self.z.eof:
                chunk = self.z.unconsumed_tail or self.raw.read(1 << 16)
                if not chunk:
                    break
                self.pending += self.z.decompress(chunk, max(n - len(self.pending), 1 << 16))
        except zlib.error as exc:
            raise CheckpointError(f"corrupt compressed zip record ({exc})") from None
        data, self.pending = self.pending[:n], self.pending[n:]
        return data


def open_located(f: IO[bytes], loc: Locator) -> io.RawIOBase:
    """A stream over the bytes a `Locator` points to."""
    if loc.method == 8:
        return _Inflate(f, loc.offset, loc.compressed_size)
    return _Range(f, loc.offset, loc.size)


def read_archive(path: str, limits: Limits = Limits()) -> Archive:
    """Read `path` without executing it; raises `CheckpointError` when it is not a readable checkpoint."""
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: no such file")
    if os.path.isdir(path):
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file")
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(512)
            if not head:
                raise CheckpointError(f"{path}: empty file")
            return _dispatch(path, f, head, size, limits)
    except CheckpointError:
        raise
    except (
        PickleParseError,
        OSError,
        EOFError,
        ValueError,
        struct.error,
        zlib.error,
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        NotImplementedError,
        UnicodeDecodeError,
        OverflowError,
        KeyError,
        RecursionError,
        MemoryError,
    ) as exc:
        raise CheckpointError(f"{path}: cannot read the file: {type(exc).__name__}: {exc}"[:400]) from None


def _dispatch(path: str, f: IO[bytes], head: bytes, size: int, limits: Limits) -> Archive:
    archive = _dispatch_format(path, f, head, size, limits)
    _scan_nested(archive, limits)
    return archive


def _dispatch_format(path: str, f: IO[bytes], head: bytes, size: int, limits: Limits) -> Archive:
    if head[:4] == b"PK\x03\x04":
        return _read_zip(path, f, size, limits)
    if _is_tar(head):  # torch tries tarfile first: a v7 tar without the ustar magic is read too
        return _read_tar(path, f, size, limits)
    if head[:6] == b"\x93NUMPY":
        return _read_npy(path, f, size, limits)
    if _looks_like_safetensors(head, size):
        return _read_safetensors(path, f, size, head, limits)
    compression = _compression(head)
    if compression:
        return _read_compressed(path, f, size, compression, limits)
    if head[0] == 0x80 and len(head) > 1 and head[1] <= 5:
        return _read_stacked(path, f, size, limits)
    if head[0] in _PROTO0_STARTS or head[0] in _OPCODE_BYTES:  # a pickle needs no PROTO: pickle.load reads it
        return _read_stacked(path, f, size, limits, strict=True)
    raise CheckpointError(f"{path}: not a PyTorch checkpoint (unrecognised format, starts with {head[:8]!r})")


# -- compressed pickles (joblib.dump(..., compress=...)) -----------------------------------------------
def _compression(head: bytes) -> str:
    """The compressor joblib would detect from the first bytes ("" for none)."""
    if len(head) > 1 and head[0] == 0x78 and (head[0] << 8 | head[1]) % 31 == 0:
        return "zlib"
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if head[:3] == b"BZh" and head[4:10] == b"1AY&SY":
        return "bz2"
    if head[:6] == b"\xfd7zXZ\x00":
        return "xz"
    if head[:3] == b"\x5d\x00\x00" and len(head) > 12 and head[5:13] == b"\xff" * 8:
        return "lzma"
    if head[:4] == b"\x04\x22\x4d\x18":
        return "lz4"
    return ""


class _Decompress(io.RawIOBase):
    """A zlib stream decompressed as it is read."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.z, self.pending = f, zlib.decompressobj(), b""

    def readable(self) -> bool:
        """True, overriding `io.RawIOBase`'s False: `io` wrappers refuse a raw stream that is not readable."""
        return True

    def read(self, n: int = -1) -> bytes:
        """Up to `n` decompressed bytes (at most 1 MiB when n is None or < 0), inflating only what is
        still wanted (or 64 KiB) per step so a compression bomb costs what is read.
        """
        n = 1 << 20 if n is None or n < 0 else n
        while len(self.pending) < n and not self.z.eof:
            chunk = self.z.unconsumed_tail or self.f.read(1 << 16)
            if not chunk:
                break
            self.pending += self.z.decompress(chunk, max(n - len(self.pending), 1 << 16))
        data, self.pending = self.pending[:n], self.pending[n:]
        return data


def _read_compressed(path: str, f: IO[bytes], size: int, compression: str, limits: Limits) -> Archive:
    """A compressed pickle stream as joblib writes it: decompressed as it is read, never to disk or memory."""
    import bz2
    import gzip
    import lzma

    f.seek(0)
    stream: Any
    if compression == "zlib":
        stream = _Decompress(f)
    elif compression == "gzip":
        stream = gzip.GzipFile(fileobj=f, mode="rb")
    elif compression == "bz2":
        stream = bz2.BZ2File(f, "rb")
    elif compression in ("xz", "lzma"):
        stream = lzma.LZMAFile(f, "rb", format=lzma.FORMAT_XZ if compression == "xz" else lzma.FORMAT_ALONE)
    else:
        try:
            import lz4.frame  # type: ignore[import-not-found]
        except ImportError:
            raise CheckpointError(f"{path}: an lz4-compressed file (joblib); install lz4 to scan it") from None
        stream = lz4.frame.LZ4FrameFile(f, "rb")
    archive = Archive(path, "joblib", size)
    archive.details["compression"] = compression
    # deflate expands at most ~1032x; other codecs are held to that too (a decompression bomb ends as a problem)
    src = Source(stream, size * 1100 + (1 << 20), size)
    try:
        first = scan_pickle(src, None, limits)
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as exc:
        raise CheckpointError(f"{path}: corrupt {compression} stream ({exc})") from None
    if first.error and not first.globals and not first.events:
        raise CheckpointError(f"{path}: a {compression}-compressed file that holds no readable pickle ({first.error})")
    archive.pickles.append(("pickle 1", first))
    archive.root = first.value
    archive.details["protocol"] = first.protocol
    if first.error:
        archive.problems.append(f"pickle 1: {first.error}")
    else:
        _scan_trailing_pickles(archive, src, limits, 2)
    return archive


# -- zip ------------------------------------------------------------------------------------------
def _read_zip(path: str, f: IO[bytes], size: int, limits: Limits) -> Archive:
    try:
        infos = _zip_infos(f, size)
    except zipfile.BadZipFile as exc:
        raise CheckpointError(f"{path}: truncated or corrupt zip archive ({exc})") from None
    if not infos:
        raise CheckpointError(f"{path}: empty zip archive")
    view = views(f, size)
    if view is not None and view.concat > 0:  # bytes before the archive: zips back to back (a DCP shard)?
        sequence = _read_zip_sequence(path, f, size, view, limits)
        if sequence is not None:
            return sequence
    ambiguity = _zip_ambiguity(f, size, infos)
    if view is not None and not view.agree:
        ambiguity.append(
            "Python's zipfile and torch's reader find different central directories (zipfile: byte "
            f"{view.zipfile_start}, shifted by {view.concat}; torch: byte {view.torch_start}): the file holds two "
            "archives, and a scanner reading one does not see the pickle torch.load runs"
        )
    if not any(i.filename.endswith("/data.pkl") for i in infos):
        archive = _read_other_zip(path, f, size, infos, limits)
        archive.events += [("zip", Event(a, 0)) for a in ambiguity]
        return archive
    prefix = infos[0].filename.split("/", 1)[0]
    by_name = {i.filename: i for i in infos}
    code_dir = f"{prefix}/code/"
    is_script = f"{prefix}/constants.pkl" in by_name or any(n.startswith(code_dir) for n in by_name)
    archive = Archive(path, "torchscript" if is_script else "zip", size)
    archive.details["prefix"] = prefix
    archive.details["records"] = len(infos)
    for name, key in (
        ("format_version", ".format_version"),
        ("storage_alignment", ".storage_alignment"),
        ("byteorder", "byteorder"),
        ("version", "version"),
    ):
        info = by_name.get(f"{prefix}/{key}")
        if info is not None and info.file_size < 64:
            archive.details[name] = _read_member(f, info, limits).decode("ascii", "replace").strip()
    archive.details.setdefault("byteorder", "little (no byteorder record)")
    compressed = [i.filename for i in infos if i.compress_type != zipfile.ZIP_STORED]
    if compressed:
        archive.details["compressed_records"] = len(compressed)
    encrypted = [i.filename for i in infos if i.flag_bits & 0x1]
    if encrypted:
        archive.problems.append(f"{len(encrypted)} zip record(s) are marked encrypted (e.g. {encrypted[0]})")
    if is_script:
        archive.details["code_files"] = sum(1 for n in by_name if n.startswith(code_dir) and n.endswith(".py"))

    archive.events += [("zip", Event(a, 0)) for a in ambiguity]
    main = by_name.get(f"{prefix}/data.pkl")
    if main is None:
        others = [n for n in by_name if n.endswith("/data.pkl")]
        if not others:
            raise CheckpointError(f"{path}: a zip archive without a data.pkl record, not a torch.save checkpoint")
        main = by_name[others[0]]
        prefix = main.filename[: -len("/data.pkl")]
        archive.details["prefix"] = prefix
    loader = _ZipStorages(archive, by_name, prefix)
    scan = _scan_member(f, main, loader.load_for("data"), limits, archive)
    archive.pickles.append(("data.pkl", scan))
    other = torch_member(f, view, "data.pkl") if view is not None and not view.agree else None
    if other is not None and (other.header_offset, other.compress_size) != (main.header_offset, main.compress_size):
        info = zipfile.ZipInfo(other.name)
        info.header_offset, info.compress_size, info.file_size = (
            other.header_offset,
            other.compress_size,
            other.file_size,
        )
        info.compress_type, info.flag_bits = other.compress_type, other.flag_bits
        archive.pickles.append(("data.pkl as torch's reader finds it", _scan_member(f, info, None, limits, archive)))
    archive.root = scan.value
    extra = [i for i in infos if i.filename.endswith(".pkl") and i is not main][:_MAX_EXTRA_PICKLES]
    for info in extra:
        # scanned for safety; only TorchScript's constants.pkl holds model tensors (in constants/)
        load = loader.load_for("constants") if info.filename == f"{prefix}/constants.pkl" else None
        archive.pickles.append((info.filename.split("/", 1)[-1], _scan_member(f, info, load, limits, archive)))
    known = {"data.pkl", ".format_version", ".storage_alignment", "byteorder", "version", ".data/serialization_id"}
    data_dir = f"{prefix}/data/"
    odd = [
        n for n in by_name if not n.startswith(data_dir) and not n.endswith(".pkl") and n.split("/", 1)[-1] not in known
    ]
    if odd and not is_script:
        archive.details["extra_records"] = odd[:10]
    if is_script:
        _inspect_torchscript_code(archive, f, [i for i in infos if "/code/" in i.filename], limits)
    return archive


_MAX_ZIPS = 4096


def _read_zip_sequence(path: str, f: IO[bytes], size: int, view: Views, limits: Limits) -> Optional[Archive]:
    """Zips stored back to back, as torch.distributed.checkpoint writes a `.distcp` shard (one torch.save
    per item; its loader reads each by offset): each read as the archive it is. None when the bytes before
    the last archive are not such a sequence (then it is an archive with data prepended)."""
    bounds = [(view.concat, size)]
    while bounds[-1][0] > 0:
        end = bounds[-1][0]
        if len(bounds) > _MAX_ZIPS:
            return None
        before = views(window(f, 0, end), end)
        if before is None or before.end_at != end - 22 or not 0 <= before.concat < end:
            return None
        bounds.append((before.concat, end))
    if view.end_at != size - 22:
        return None
    archive = Archive(path, "zip-sequence", size)
    archive.details["zips"] = len(bounds)
    root: dict[str, Any] = {}
    for number, (start, end) in enumerate(reversed(bounds)):
        inner = window(f, start, end - start)
        if inner.read(4) != b"PK\x03\x04":
            return None
        try:
            part = _read_zip(path, inner, end - start, limits)
        except (CheckpointError, zipfile.BadZipFile):
            return None
        tag = f"{number}"
        root[tag] = part.root
        archive.pickles += [(f"zip {number} (byte {start}) > {name}", scan) for name, scan in part.pickles]
        archive.events += part.events
        archive.problems += [f"zip {number} (byte {start}): {p}" for p in part.problems]
        for key, ref in part.storages.items():
            ref.key = f"{tag}:{key}"
            archive.storages[ref.key] = ref
            if key in part.zip_records:
                record = copy.copy(part.zip_records[key])
                record.header_offset += start
                archive.zip_records[ref.key] = record
    archive.root = root
    return archive


_EOCD = b"PK\x05\x06"
_END_RECORD = struct.Struct("<4s4H2LH")  # zipfile.structEndArchive
_ZIP64_LOCATOR = struct.Struct("<4sLQL")  # zipfile.structEndArchive64Locator
_ZIP64_END = struct.Struct("<4sQ2H2L4Q")  # zipfile.structEndArchive64
_CENTRAL_RECORD = struct.Struct("<4s4B4HL2L5H2L")  # zipfile.structCentralDir
# the ZipInfo fields zipfile sets when it reads a central directory (CPython <= 3.11.7; later ones add fields)
_ZIPINFO_SLOTS = (
    "orig_filename",
    "filename",
    "date_time",
    "compress_type",
    "_compresslevel",
    "comment",
    "extra",
    "create_system",
    "create_version",
    "extract_version",
    "reserved",
    "flag_bits",
    "volume",
    "internal_attr",
    "external_attr",
    "header_offset",
    "CRC",
    "compress_size",
    "file_size",
    "_raw_time",
)


def _zip_infos(f: IO[bytes], size: int) -> list[zipfile.ZipInfo]:
    """The members as `zipfile.ZipFile(f).infolist()` lists them (and raising `zipfile.BadZipFile` likewise).

    The plain central directory torch writes (no archive comment, no extra fields) is read here in one pass:
    zipfile's per-record reads and `ZipInfo.__init__` are a fifth of the reading time of a file of 10^5
    tensors. Any other directory, a malformed one, or a Python whose `ZipInfo` has other fields goes to zipfile.
    """
    infos = _plain_central_directory(f, size) if zipfile.ZipInfo.__slots__ == _ZIPINFO_SLOTS else None
    return zipfile.ZipFile(f).infolist() if infos is None else infos


def _plain_central_directory(f: IO[bytes], size: int) -> Optional[list[zipfile.ZipInfo]]:
    """What zipfile's `_RealGetContents` builds, when the directory is of the plain kind; else None."""
    if size < _END_RECORD.size or os.sep != "/":
        return None
    location = size - _END_RECORD.size
    f.seek(location)
    end = f.read(_END_RECORD.size)
    if end[:4] != _EOCD or end[-2:] != b"\0\0":  # an archive comment: zipfile searches for the record
        return None
    size_cd, offset_cd = _END_RECORD.unpack(end)[5:7]
    concat = location - size_cd - offset_cd  # bytes before the archive
    if location >= _ZIP64_LOCATOR.size:  # torch writes zip64 end records: zipfile takes the directory from them
        f.seek(location - _ZIP64_LOCATOR.size)
        magic, disk, _, disks = _ZIP64_LOCATOR.unpack(f.read(_ZIP64_LOCATOR.size))
        if magic == b"PK\x06\x07":
            record_at = location - _ZIP64_LOCATOR.size - _ZIP64_END.size
            if disk != 0 or disks > 1 or record_at < 0:
                return None
            f.seek(record_at)
            record = f.read(_ZIP64_END.size)
            if len(record) == _ZIP64_END.size and record[:4] == b"PK\x06\x06":
                size_cd, offset_cd = _ZIP64_END.unpack(record)[8:10]
                concat = location - size_cd - offset_cd - _ZIP64_END.size - _ZIP64_LOCATOR.size
    if offset_cd + concat < 0:
        return None
    f.seek(offset_cd + concat)
    data = f.read(size_cd)
    unpack, fixed, new = _CENTRAL_RECORD.unpack_from, _CENTRAL_RECORD.size, zipfile.ZipInfo.__new__
    infos = []
    pos = 0
    while pos < size_cd:
        if pos + fixed > len(data):
            return None
        (
            magic,
            create_version,
            create_system,
            extract_version,
            reserved,
            flags,
            compress,
            t,
            d,
            crc,
            compress_size,
            file_size,
            name_len,
            extra_len,
            comment_len,
            volume,
            internal_attr,
            external_attr,
            offset,
        ) = unpack(data, pos)
        name_at = pos + fixed
        pos = name_at + name_len + comment_len
        if magic != b"PK\x01\x02" or extra_len or pos > len(data) or extract_version > zipfile.MAX_EXTRACT_VERSION:
            return None
        try:
            name = data[name_at : name_at + name_len].decode("utf-8" if flags & 0x800 else "cp437")
        except UnicodeDecodeError:
            return None
        if "\0" in name:
            return None
        x = new(zipfile.ZipInfo)
        x.orig_filename = x.filename = name
        x.date_time = ((d >> 9) + 1980, (d >> 5) & 0xF, d & 0x1F, t >> 11, (t >> 5) & 0x3F, (t & 0x1F) * 2)
        x._compresslevel = None  # type: ignore[attr-defined]  # private fields zipfile sets too
        x.comment = data[name_at + name_len : pos]
        x.extra = b""
        x.create_version, x.create_system, x.extract_version, x.reserved = (
            create_version,
            create_system,
            extract_version,
            reserved,
        )
        x.flag_bits, x.compress_type, x.CRC = flags, compress, crc
        x.compress_size, x.file_size = compress_size, file_size
        x.volume, x.internal_attr, x.external_attr = volume, internal_attr, external_attr
        x.header_offset = offset + concat
        x._raw_time = t  # type: ignore[attr-defined]
        infos.append(x)
    return infos


def _zip_ambiguity(f: IO[bytes], size: int, infos: list[zipfile.ZipInfo]) -> list[str]:
    """Ways the archive reads differently in different zip readers (Python's zipfile, torch's miniz)."""
    out = []
    names = [i.filename for i in infos] if len(infos) < 5000 else []
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        out.append(
            f"the zip names {dupes[0]!r} twice: zip readers disagree on which copy is loaded, a way to show "
            "scanners one pickle and torch.load another"
        )
    tail_start = max(0, size - (1 << 16) - 22)
    f.seek(tail_start)
    tail = f.read()
    ends: list[int] = []
    i = tail.find(_EOCD)
    while i >= 0 and len(ends) < 8:
        if i + 22 <= len(tail):
            cd_size, cd_offset = struct.unpack("<II", tail[i + 12 : i + 20])
            f.seek(cd_offset)
            if cd_offset + cd_size <= size and f.read(4) == b"PK\x01\x02":
                ends.append(tail_start + i)
        i = tail.find(_EOCD, i + 1)
    if len(ends) > 1:
        out.append(
            f"the zip has {len(ends)} end-of-central-directory records pointing at central directories: "
            "zip readers pick different ones, so one file can hold two different checkpoints"
        )
    return out


def _read_other_zip(path: str, f: IO[bytes], size: int, infos: list[zipfile.ZipInfo], limits: Limits) -> Archive:
    """A zip without data.pkl: numpy's .npz, a torch.export archive (.pt2) or an archive of pickles; every
    pickle in it, and every torch.save archive stored in it, is scanned."""
    npz = any(i.filename.endswith(".npy") for i in infos)
    pt2 = any(i.filename.endswith("/archive_format") or i.filename == "archive_format" for i in infos)
    archive = Archive(path, "pt2" if pt2 else "numpy" if npz else "zip-of-pickles", size)
    archive.details["records"] = len(infos)
    if pt2:
        archive.root = _pt2_payloads(archive, f, infos, limits)
    for info in infos[: _MAX_EXTRA_PICKLES * 4]:
        try:
            head = _member_stream(f, info).read(16)
        except CheckpointError as exc:
            archive.problems.append(str(exc))
            continue
        if head[:4] == b"PK\x03\x04":  # torch.save output stored as a record (.pt2 weights, constants, inputs)
            _scan_zip_member(archive, f, info, limits)
            continue
        if head[:6] == b"\x93NUMPY":
            scan = _scan_npy(_member_stream(f, info), info.file_size, limits)
            if scan is None:
                archive.problems.append(f"{info.filename}: corrupt .npy header")
            elif scan.error:
                archive.problems.append(f"{info.filename}: {scan.error}")
        elif head[:1] == b"\x80" or info.filename.endswith((".pkl", ".pickle")):
            scan = _scan_member(f, info, None, limits, archive)  # records its own problem
        else:
            continue
        if scan is not None:
            archive.pickles.append((info.filename, scan))
    if not archive.pickles and not npz and not pt2:
        raise CheckpointError(f"{path}: a zip archive without a data.pkl record or pickles, not a checkpoint")
    return archive


def _scan_zip_member(archive: Archive, f: IO[bytes], info: zipfile.ZipInfo, limits: Limits) -> None:
    """A torch.save archive stored as a record of another zip: its pickles join the outer archive's."""
    where = f"{archive.path} > {info.filename}"
    try:
        if info.compress_type == zipfile.ZIP_STORED:
            inner: IO[bytes] = window(f, _local_data_offset(f, info), info.file_size)
        elif info.file_size <= limits.max_total_inline:
            inner = io.BytesIO(_member_stream(f, info).read(info.file_size))
        else:
            archive.problems.append(f"{info.filename}: a compressed torch.save record too large to scan")
            return
        part = _read_zip(where, inner, info.file_size, limits)
    except (CheckpointError, zipfile.BadZipFile, OSError, ValueError, struct.error) as exc:
        archive.problems.append(f"{info.filename}: {exc}"[:300])
        return
    archive.pickles += [(f"{info.filename} > {name}", scan) for name, scan in part.pickles]
    archive.events += part.events
    archive.problems += [f"{info.filename}: {p}" for p in part.problems]


# torch.export's ScalarType numbers (torch/_export/serde/schema.py)
_PT2_DTYPES = {
    1: "uint8",
    2: "int8",
    3: "int16",
    4: "int32",
    5: "int64",
    6: "float16",
    7: "float32",
    8: "float64",
    9: "complex32",
    10: "complex64",
    11: "complex128",
    12: "bool",
    13: "bfloat16",
    28: "uint16",
    29: "float8_e4m3fn",
    30: "float8_e5m2",
    31: "float8_e4m3fnuz",
    32: "float8_e5m2fnuz",
    33: "float8_e8m0fnu",
    34: "uint32",
    35: "uint64",
}


def _pt2_payloads(archive: Archive, f: IO[bytes], infos: list[zipfile.ZipInfo], limits: Limits) -> dict[str, Any]:
    """The raw weights and constants a .pt2 archive's JSON configs describe, as tensors located in the file."""
    import json

    by_name = {i.filename: i for i in infos}
    root: dict[str, Any] = {}
    for info in infos:
        name = info.filename
        if not name.endswith(("_weights_config.json", "_constants_config.json")) or info.file_size > (64 << 20):
            continue
        folder = name.rsplit("/", 1)[0]
        try:
            config = json.loads(_member_stream(f, info).read(info.file_size)).get("config", {})
        except (ValueError, AttributeError, CheckpointError) as exc:
            archive.problems.append(f"{name}: unreadable ({exc})"[:300])
            continue
        group: dict[str, Any] = {}
        for fqn, payload in config.items() if isinstance(config, dict) else []:
            meta = payload.get("tensor_meta") if isinstance(payload, dict) else None
            record = by_name.get(f"{folder}/{payload.get('path_name')}") if isinstance(payload, dict) else None
            if not isinstance(meta, dict) or record is None or payload.get("use_pickle"):
                continue  # pickled payloads are scanned as the torch.save archives they are
            try:
                dtype = _PT2_DTYPES.get(int(meta["dtype"]), "uint8")
                shape = tuple(int(d["as_int"]) for d in meta["sizes"])
                stride = tuple(int(d["as_int"]) for d in meta["strides"])
            except (KeyError, TypeError, ValueError):
                continue  # symbolic sizes
            key = f"pt2:{record.filename}"
            size = itemsize(dtype)
            storage = StorageRef(key, dtype, size, "cpu", record.file_size // size, record.filename)
            archive.storages[key] = storage
            archive.zip_records[key] = record
            group[str(fqn)] = TensorMeta(dtype, shape, stride, storage)
        if group:
            root["weights" if "weights" in name else "constants"] = group
    return root


_CODE_RISKS = (  # compiled (and cached by `re`) when a TorchScript archive is read, not at every start-up
    (r"\btorch\.load\(", "loads another file with torch.load"),
    (r"\btorch\.save\(", "writes files with torch.save"),
    (r"\btorch\.from_file\(", "maps an arbitrary file with torch.from_file"),
    (r"\bload_library\(", "loads a native library (torch.ops.load_library)"),
    (r"(?<![\w.])open\(", "opens a file"),
    (r"\b__import__\b", "imports a module"),
    (r"\bos\.(system|popen|exec\w*|spawn\w*)\(", "runs a command"),
    (r"\bsubprocess\.", "runs a process"),
)


def _inspect_torchscript_code(archive: Archive, f: IO[bytes], infos: list[zipfile.ZipInfo], limits: Limits) -> None:
    """TorchScript code that touches files or loads code on load (the CVE-2025-32434 class of bypasses)."""
    for info in infos[:500]:
        try:
            text = _read_member(f, info, limits).decode("utf-8", "replace")
        except CheckpointError as exc:
            archive.problems.append(str(exc))
            continue
        for risk, what in _CODE_RISKS:
            pattern = re.compile(risk)
            if pattern.search(text):
                line = next(ln.strip() for ln in text.splitlines() if pattern.search(ln))
                archive.events.append(
                    (
                        info.filename.split("/", 1)[-1],
                        Event(
                            f"TorchScript code {what}: `{line[:120]}` "
                            "(torch.jit.load runs it, even under weights_only)",
                            0,
                        ),
                    )
                )


def _read_npy(path: str, f: IO[bytes], size: int, limits: Limits) -> Archive:
    """numpy's .npy: an object array is a pickle (run by np.load(allow_pickle=True)); other arrays are bytes."""
    f.seek(0)
    archive = Archive(path, "numpy", size)
    scan = _scan_npy(f, size, limits)
    if scan is None:
        raise CheckpointError(f"{path}: corrupt .npy header")
    if scan.opcodes or scan.error:
        archive.pickles.append(("npy object array", scan))
        if scan.error:
            archive.problems.append(f"npy object array: {scan.error}")
    return archive


def _scan_npy(stream: Any, size: int, limits: Limits) -> Optional[PickleScan]:
    head = stream.read(10)
    if len(head) < 10 or head[:6] != b"\x93NUMPY":
        return None
    if head[6] == 1:
        n, used = struct.unpack("<H", head[8:10])[0], 10
    else:
        n, used = struct.unpack("<I", head[8:10] + stream.read(2))[0], 12
    if n > 1 << 20:
        return None
    header = stream.read(n).decode("latin-1", "replace")
    if "'O'" not in header and '"O"' not in header and "|O" not in header:
        return PickleScan()
    return scan_pickle(Source(stream, max(0, size - used - n), size), None, limits)


def _local_data_offset(f: IO[bytes], info: zipfile.ZipInfo) -> int:
    if info.header_offset < 0:
        raise CheckpointError(f"corrupt zip: negative offset for {info.filename}")
    f.seek(info.header_offset)
    header = f.read(30)
    if len(header) < 30 or header[:4] != b"PK\x03\x04":
        raise CheckpointError(f"corrupt zip: bad local header for {info.filename}")
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len


def _locator(f: IO[bytes], info: zipfile.ZipInfo) -> Locator:
    return Locator(_local_data_offset(f, info), info.file_size, info.compress_size, info.compress_type)


def _member_stream(f: IO[bytes], info: zipfile.ZipInfo) -> io.RawIOBase:
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise CheckpointError(f"zip record {info.filename} uses unsupported compression {info.compress_type}")
    return open_located(f, _locator(f, info))


def _read_member(f: IO[bytes], info: zipfile.ZipInfo, limits: Limits) -> bytes:
    return _member_stream(f, info).read(min(info.file_size, limits.max_inline_bytes))


def _scan_member(
    f: IO[bytes], info: zipfile.ZipInfo, persistent_load: Any, limits: Limits, archive: Archive
) -> PickleScan:
    try:
        stream = _member_stream(f, info)
    except CheckpointError as exc:
        archive.problems.append(str(exc))
        return PickleScan(error=str(exc))
    scan = scan_pickle(Source(stream, info.file_size, info.compress_size), persistent_load, limits)
    if scan.error:
        archive.problems.append(f"{info.filename}: {scan.error}")
    return scan


class _ZipStorages:
    """persistent_load for torch zip pickles: ('storage', StorageType, key, location, numel)."""

    def __init__(self, archive: Archive, by_name: dict[str, zipfile.ZipInfo], prefix: str) -> None:
        self.archive, self.by_name, self.prefix = archive, by_name, prefix

    def load_for(self, folder: str) -> Any:
        """The `persistent_load` for a pickle whose storages are records under `<prefix>/<folder>/`
        (`data` for data.pkl, `constants` for a TorchScript archive's constants.pkl).
        """
        return functools.partial(self.storage, folder=folder)

    def storage(self, pid: Any, folder: str) -> Any:
        """Turn a storage persistent id into one shared `StorageRef` per record, never reading its bytes.

        Notes the record for `Archive.locator`; a missing record or one shorter than the declared
        size goes to `problems`; an id that is not a storage tuple becomes an `Opaque`.
        """
        ref = _storage_from_pid(pid, 5)
        if ref is None:
            return Opaque(f"persistent id {short(pid)}")
        cache_key = f"{folder}/{ref.key}"
        archive = self.archive
        known = archive.storages.get(cache_key)
        if known is not None:
            return known
        ref.record = record = f"{self.prefix}/{cache_key}"
        archive.storages[cache_key] = ref
        info = self.by_name.get(record)
        if info is None:
            archive.problems.append(f"storage record {record} is missing (tensor data lost)")
        else:
            archive.zip_records[cache_key] = info
            if info.file_size < ref.numel * ref.itemsize:
                archive.problems.append(
                    f"storage record {record} holds {info.file_size:,} bytes but {ref.nbytes:,} are declared "
                    "(truncated file or forged size)"
                )
        ref.key = cache_key
        return ref


_STORAGE_TYPES = {name: (dtype, itemsize(dtype)) for name, dtype in STORAGE_DTYPES.items()}
_BYTES = ("uint8", 1)  # an unknown storage class counts bytes


def _storage_from_pid(pid: Any, width: int) -> Optional[StorageRef]:
    """The storage a persistent id `('storage', StorageType, key, location, numel[, view])` names, or None."""
    if not isinstance(pid, tuple) or len(pid) < width or pid[0] != "storage":
        return None
    stype, key, location, numel = pid[1], pid[2], pid[3], pid[4]
    if not isinstance(stype, GlobalRef) or not isinstance(location, str) or type(numel) is not int or numel < 0:
        return None
    if not isinstance(key, (str, int)):
        return None
    dtype, size = _STORAGE_TYPES.get(stype.name, _BYTES)
    return StorageRef(str(key), dtype, size, location, numel)


# -- stacked pickles: legacy format and plain pickle files ------------------------------------------
def _read_stacked(path: str, f: IO[bytes], size: int, limits: Limits, *, strict: bool = False) -> Archive:
    """Pickles one after another: the legacy format when the first is torch's magic number, else plain pickle."""
    f.seek(0)
    src = Source(f, size, size)
    archive = Archive(path, "pickle", size)
    first = scan_pickle(src, None, limits)
    if first.error and strict and not first.globals and not first.events:
        raise CheckpointError(f"{path}: not a PyTorch checkpoint (neither a zip archive nor a pickle)")
    if first.error and not first.globals and not first.events:
        raise CheckpointError(f"{path}: not a readable checkpoint: corrupt pickle ({first.error})")
    archive.pickles.append(("pickle 1", first))
    if first.error:
        archive.problems.append(f"pickle 1: {first.error}")
        return archive
    archive.format = "legacy" if type(first.value) is int and first.value == LEGACY_MAGIC else "pickle"
    if archive.format == "legacy":
        _read_legacy_rest(archive, src, limits)
    else:
        archive.root = first.value
        archive.details["protocol"] = first.protocol
        _scan_trailing_pickles(archive, src, limits, 2)
    return archive


def _scan_trailing_pickles(archive: Archive, src: Source, limits: Limits, number: int) -> None:
    """Scan pickles stacked after the first one: `torch.load` reads (and would execute) several."""
    while number <= _MAX_EXTRA_PICKLES and not src.at_eof():
        head = src.peek(2)
        proto0 = len(head) == 2 and head[0] in _PROTO0_STARTS
        if len(head) < 2 or not ((head[0] == 0x80 and head[1] <= 5) or proto0):
            archive.details["trailing_bytes"] = True
            return
        scan = scan_pickle(src, None, limits)
        if scan.error and proto0 and not scan.globals and not scan.events:
            archive.details["trailing_bytes"] = True  # text that only looks like a protocol-0 pickle
            return
        archive.pickles.append((f"pickle {number}", scan))
        if scan.error:
            archive.problems.append(f"pickle {number}: {scan.error}")
            return
        number += 1


def _read_legacy_rest(archive: Archive, src: Source, limits: Limits) -> None:
    names = ("protocol version", "sys_info")
    for name in names:
        scan = scan_pickle(src, None, limits)
        archive.pickles.append((name, scan))
        if scan.error:
            archive.problems.append(f"{name}: {scan.error}")
            return
        if name == "sys_info" and isinstance(scan.value, dict):
            little = scan.value.get("little_endian")
            archive.details["byteorder"] = "little" if little is not False else "big"
            archive.details["legacy_protocol"] = archive.pickles[1][1].value
    modules: list[str] = []

    def persistent_load(pid: Any) -> Any:
        if isinstance(pid, tuple) and pid and pid[0] == "module":
            if len(pid) > 2 and isinstance(pid[2], str):
                modules.append(pid[2])
            return Opaque("module source")
        ref = _storage_from_pid(pid, 6)
        if ref is None:
            return Opaque(f"persistent id {short(pid)}")
        return archive.storages.setdefault(ref.key, ref)

    main = scan_pickle(src, persistent_load, limits)
    archive.pickles.append(("object", main))
    archive.root = main.value
    archive.details["protocol"] = main.protocol
    if modules:
        archive.details["embedded_module_sources"] = sorted(set(modules))[:20]
    if main.error:
        archive.problems.append(f"object pickle: {main.error}")
        return
    keys_scan = scan_pickle(src, None, limits)
    archive.pickles.append(("storage keys", keys_scan))
    keys = keys_scan.value
    if keys_scan.error or not isinstance(keys, list):
        archive.problems.append(f"storage key list unreadable: {keys_scan.error or 'not a list'}")
        return
    for key in keys:
        ref = archive.storages.get(str(key))
        head = src.peek(8)
        src.skip(len(head))
        if ref is None or len(head) < 8:
            archive.problems.append(f"storage {key!r}: data missing or not declared (truncated file?)")
            return
        numel = struct.unpack("<q", head)[0]
        nbytes = numel * ref.itemsize
        offset = src.tell()
        if numel < 0 or offset + nbytes > archive.file_size:
            archive.problems.append(f"storage {key!r}: declares {nbytes:,} bytes but the file ends first (truncated)")
            return
        archive.locators[ref.key] = Locator(offset, nbytes)
        src.skip(nbytes)


# -- tar (torch <= 0.1.x) -----------------------------------------------------------------------------
def _is_tar(head: bytes) -> bool:
    """A tar header: the ustar magic, or (old v7 tars) a header block whose checksum is right."""
    if len(head) < 512:
        return False
    if head[257:262] == b"ustar":
        return True
    import tarfile

    try:
        tarfile.TarInfo.frombuf(head[:512], "utf-8", "surrogateescape")
    except (tarfile.HeaderError, ValueError):
        return False
    return True


def _read_tar(path: str, f: IO[bytes], size: int, limits: Limits) -> Archive:
    import tarfile

    f.seek(0)
    archive = Archive(path, "legacy-tar", size)
    try:
        with tarfile.open(fileobj=f, mode="r:") as tar:
            members = {}
            for member in tar:
                if member.isfile() and member.name in ("sys_info", "pickle", "tensors", "storages"):
                    members[member.name] = member
                if len(members) == 4:
                    break
            archive.details["records"] = sorted(members)
            for name, member in sorted(members.items()):
                stream = tar.extractfile(member)
                if stream is None:
                    continue
                # the first pickle of each record; `tensors`/`storages` continue with raw data
                scan = scan_pickle(Source(stream, member.size, member.size), None, limits)
                archive.pickles.append((name, scan))
                if scan.error and name in ("sys_info", "pickle"):
                    archive.problems.append(f"tar record {name}: {scan.error}")
                if name == "pickle":
                    archive.root = scan.value
    except tarfile.TarError as exc:
        raise CheckpointError(f"{path}: corrupt tar archive ({exc})") from None
    if not archive.pickles:
        raise CheckpointError(f"{path}: a tar archive without torch records, not a checkpoint")
    return archive


# -- safetensors ------------------------------------------------------------------------------------
def _looks_like_safetensors(head: bytes, size: int) -> bool:
    if len(head) < 10:
        return False
    n = struct.unpack("<Q", head[:8])[0]
    return 2 <= n <= min(size - 8, _MAX_SAFETENSORS_HEADER) and head[8:9] == b"{"


def _read_safetensors(path: str, f: IO[bytes], size: int, head: bytes, limits: Limits) -> Archive:
    import json

    pickled = _polyglot_pickle(path, f, size, head, limits)
    f.seek(0)
    n = struct.unpack("<Q", f.read(8))[0]
    try:
        header = json.loads(f.read(n).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        if pickled is not None:
            return pickled
        raise CheckpointError(f"{path}: corrupt safetensors header ({exc})") from None
    if pickled is not None:  # torch.load never reads safetensors: it unpickles this file
        pickled.events.append(
            (
                "file",
                Event("the file sniffs as safetensors but is also a pickle that torch.load/pickle.load would run", 0),
            )
        )
        return pickled
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (not a JSON object)")
    archive = Archive(path, "safetensors", size)
    meta = header.pop("__metadata__", None)
    if isinstance(meta, dict):
        archive.details["metadata"] = {str(k): str(v)[:200] for k, v in list(meta.items())[:50]}
    archive.root = _safetensors_root(archive, header, 8 + n)
    return archive


def _polyglot_pickle(path: str, f: IO[bytes], size: int, head: bytes, limits: Limits) -> Optional[Archive]:
    """The file read as torch.load would (a pickle), when that works and names anything."""
    try:
        archive = _read_stacked(path, f, size, limits, strict=True)
    except (CheckpointError, PickleParseError):
        return None
    if archive.problems or not any(scan.globals or scan.events for _, scan in archive.pickles):
        return None
    return archive


def _scan_nested(archive: Archive, limits: Limits) -> None:
    """Pickles and torch zips stored as bytes values inside the checkpoint (a loader may unpickle them)."""
    queue = [(name, scan, 0) for name, scan in archive.pickles]
    while queue:
        name, scan, depth = queue.pop()
        for pos, data in scan.nested[:8]:
            where = f"{name} > bytes at byte {pos}"
            found: list[tuple[str, PickleScan]] = []
            if data[:4] == b"PK\x03\x04":
                try:
                    inner = _read_zip(where, io.BytesIO(data), len(data), limits)
                except (CheckpointError, zipfile.BadZipFile, OSError, ValueError, struct.error):
                    continue
                found = [(f"{where} > {n}", sc) for n, sc in inner.pickles]
                archive.events += inner.events
            else:
                inner_scan = scan_pickle(Source(io.BytesIO(data), len(data), len(data)), None, limits)
                if inner_scan.globals or inner_scan.events:
                    found = [(where, inner_scan)]
            archive.pickles += found
            if depth < 2:
                queue += [(n, sc, depth + 1) for n, sc in found]


def _safetensors_root(archive: Archive, header: dict[str, Any], base: int) -> Mapping[str, TensorMeta]:
    """The header's tensors, kept as columns (headers of 10^5 entries exist); any entry that is not plainly
    well-formed sends the whole header through the entry-by-entry reader, which names the bad ones."""
    specs = list(header.values())
    try:
        dtypes = [SAFETENSORS_DTYPES[s["dtype"]] for s in specs]
        shapes = [s["shape"] for s in specs]
        spans = [s["data_offsets"] for s in specs]
        begins, ends = [b for b, _ in spans], [e for _, e in spans]  # exactly two values each, else ValueError
        well_formed = (
            set(map(type, shapes)) == {list}
            and set(map(type, chain(begins, ends, *shapes))) <= {int}
            and min(begins) >= 0
            and all(map(le, begins, ends))
            and base + max(ends) <= archive.file_size
        )
    except (KeyError, TypeError, ValueError):
        well_formed = False
    if well_formed:
        return HeaderTensors(list(header), dtypes, shapes, begins, ends, base)
    tensors = {name: _safetensors_tensor(archive, name, spec, base) for name, spec in header.items()}
    return {name: t for name, t in tensors.items() if t is not None}


def _safetensors_tensor(archive: Archive, name: str, spec: Any, base: int) -> Optional[TensorMeta]:
    """One header entry, or None after recording why it is unusable."""
    try:
        dtype = SAFETENSORS_DTYPES[spec["dtype"]]
        shape = tuple(map(int, spec["shape"]))
        begin, end = map(int, spec["data_offsets"])
    except (KeyError, TypeError, ValueError):
        archive.problems.append(f"safetensors entry {name!r} is malformed")
        return None
    size = itemsize(dtype)
    if begin < 0 or end < begin or base + end > archive.file_size:
        archive.problems.append(f"safetensors entry {name!r} points past the end of the file (truncated)")
        return None
    storage = StorageRef(name, dtype, size, "cpu", (end - begin) // size)
    archive.locators[name] = Locator(base + begin, end - begin)
    return TensorMeta(dtype, shape, contiguous_strides(shape), storage)


def _inline_storage(blob: bytes) -> Optional[StorageRef]:
    """The storage in the bytes a plain pickle carries for it (`torch.storage._load_from_bytes`): a legacy
    torch.save of the storage, read like a legacy file; None when it is not one."""
    try:
        root = _read_stacked("<storage bytes>", io.BytesIO(blob), len(blob), Limits()).root
    except (CheckpointError, PickleParseError, ValueError, EOFError, struct.error):
        return None
    return root if isinstance(root, StorageRef) else None


read_inline_storages_with(_inline_storage)
