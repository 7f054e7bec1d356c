"""`--scan-values`: stream tensor bytes from the file and count NaN/Inf, in fixed-size chunks (bounded memory)."""

from __future__ import annotations

from typing import IO, Any, Callable, Iterator, Optional

from torchdoctor.ckpt.errors import CheckpointError
from torchdoctor.ckpt.info import CheckpointInfo, NonFinite, ValueScan, show_path
from torchdoctor.ckpt.objects import IN_PICKLE, TensorMeta
from torchdoctor.ckpt.reader import Locator, _Inflate, _Range

CHUNK = 4 << 20  # bytes per read; a multiple of every item size
MAX_STRIDED_SPAN = 64 << 20  # non-dense views are read whole up to this span


def _counter(np: Any, dtype: str, big_endian: bool) -> Optional[Callable[[bytes], tuple[int, int]]]:
    """A function bytes -> (nan, inf) for `dtype`, or None when the dtype cannot hold NaN/Inf."""
    order = ">" if big_endian else "<"
    floats = {
        "float16": "f2",
        "float32": "f4",
        "float64": "f8",
        "complex64": "f4",
        "complex128": "f8",
        "complex32": "f2",
    }
    if dtype in floats:
        npdtype = np.dtype(order + floats[dtype])

        def count(buf: bytes) -> tuple[int, int]:
            a = np.frombuffer(buf, dtype=npdtype)
            return int(np.count_nonzero(np.isnan(a))), int(np.count_nonzero(np.isinf(a)))

        return count
    if dtype == "bfloat16":
        u16 = np.dtype(order + "u2")

        def count_bf16(buf: bytes) -> tuple[int, int]:
            a = np.frombuffer(buf, dtype=u16)
            special = (a & 0x7F80) == 0x7F80
            mantissa = (a & 0x007F) != 0
            return int(np.count_nonzero(special & mantissa)), int(np.count_nonzero(special & ~mantissa))

        return count_bf16
    if dtype == "float8_e5m2":

        def count_e5m2(buf: bytes) -> tuple[int, int]:
            a = np.frombuffer(buf, dtype=np.uint8)
            special = (a & 0x7C) == 0x7C
            mantissa = (a & 0x03) != 0
            return int(np.count_nonzero(special & mantissa)), int(np.count_nonzero(special & ~mantissa))

        return count_e5m2
    if dtype == "float8_e4m3fn":
        return lambda buf: (int(np.count_nonzero((np.frombuffer(buf, dtype=np.uint8) & 0x7F) == 0x7F)), 0)
    if dtype in ("float8_e4m3fnuz", "float8_e5m2fnuz"):
        return lambda buf: (int(np.count_nonzero(np.frombuffer(buf, dtype=np.uint8) == 0x80)), 0)
    return None


def _chunks(f: IO[bytes], loc: Locator, start: int, length: int) -> Iterator[bytes]:
    if loc.method == 8:
        stream: Any = _Inflate(f, loc.offset, loc.compressed_size)
        skip = start
        while skip > 0:
            got = stream.read(min(skip, CHUNK))
            if not got:
                raise CheckpointError("compressed storage ended early")
            skip -= len(got)
    else:
        stream = _Range(f, loc.offset + start, length)
    while length > 0:
        want = min(CHUNK, length)
        parts, got = [], 0
        while got < want:  # streams may return short reads; chunks must hold whole elements
            part = stream.read(want - got)
            if not part:
                raise CheckpointError("storage bytes ended early")
            parts.append(part)
            got += len(part)
        length -= want
        yield b"".join(parts)


def scan_values(info: CheckpointInfo) -> ValueScan:
    """Count NaN/Inf in every floating tensor whose bytes the file holds; `info.values` is set and returned."""
    try:
        import numpy as np
    except ImportError:
        raise CheckpointError("--scan-values needs numpy (pip install numpy)") from None
    result = ValueScan()
    big = str(info.archive.details.get("byteorder", "little")).startswith("big")
    done: set[tuple] = set()
    with open(info.path, "rb") as f:
        for entry in info.unique_tensors():
            t = entry.tensor
            ident = (t.storage.key if t.storage else None, t.storage_offset, t.shape, t.stride, t.dtype)
            if t.storage is None or ident in done or t.numel == 0:
                continue
            done.add(ident)
            count = _counter(np, t.dtype, big)
            if count is None:
                continue
            try:
                loc = info.archive.locator(t.storage.key)
                if loc is None:
                    inline = t.storage.record == IN_PICKLE
                    result.skipped.append(
                        f"{show_path(entry.path)}: "
                        + (
                            "its bytes are inside the pickle (a plain pickle.dump of tensors), not read"
                            if inline
                            else "storage bytes not in the file"
                        )
                    )
                    continue
                found = _scan_tensor(np, f, loc, t, count, result, entry.path)
            except CheckpointError as exc:
                result.skipped.append(f"{show_path(entry.path)}: {exc} (truncated file?)")
                continue
            if found is not None:
                result.nonfinite.append(found)
    info.values = result
    return result


def _scan_tensor(
    np: Any,
    f: IO[bytes],
    loc: Locator,
    t: TensorMeta,
    count: Callable[[bytes], tuple[int, int]],
    result: ValueScan,
    path: tuple,
) -> Optional[NonFinite]:
    start, end = t.byte_span()
    if end > loc.size:
        result.skipped.append(f"{show_path(path)}: extends past its storage record (truncated)")
        return None
    nan = inf = 0
    if t.is_dense():
        for buf in _chunks(f, loc, start, end - start):
            a, b = count(buf)
            nan, inf = nan + a, inf + b
            result.bytes += len(buf)
    elif end - start <= MAX_STRIDED_SPAN:
        span = b"".join(_chunks(f, loc, start, end - start))
        result.bytes += len(span)
        flat = np.frombuffer(span, dtype=np.uint8)
        size = t.itemsize
        elems = np.lib.stride_tricks.as_strided(
            flat, shape=t.shape + (size,), strides=tuple(s * size for s in t.stride) + (1,), writeable=False
        )
        nan, inf = count(np.ascontiguousarray(elems).tobytes())
    else:
        result.skipped.append(f"{show_path(path)}: a strided view spanning {end - start:,} bytes")
        return None
    result.tensors += 1
    return NonFinite(path, nan, inf, t.numel) if nan or inf else None
