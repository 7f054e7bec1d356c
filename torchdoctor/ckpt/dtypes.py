"""Dtype names and item sizes, from storage classes, torch dtype globals and safetensors codes."""

from __future__ import annotations

from itertools import repeat
from typing import Iterable

_SIZES = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "complex128": 16,
    "complex64": 8,
    "complex32": 4,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "bool": 1,
    "qint8": 1,
    "quint8": 1,
    "qint32": 4,
    "quint4x2": 1,
    "quint2x4": 1,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1,
    "bits8": 1,
    "bits16": 2,
    "bits1x8": 1,
    "bits2x4": 1,
    "bits4x2": 1,
    **{f"int{i}": 1 for i in range(1, 8)},
    **{f"uint{i}": 1 for i in range(1, 8)},
}

# torch.<X>Storage -> dtype; `UntypedStorage` counts bytes.
STORAGE_DTYPES = {
    "DoubleStorage": "float64",
    "FloatStorage": "float32",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
    "ComplexDoubleStorage": "complex128",
    "ComplexFloatStorage": "complex64",
    "QUInt8Storage": "quint8",
    "QInt8Storage": "qint8",
    "QInt32Storage": "qint32",
    "QUInt4x2Storage": "quint4x2",
    "QUInt2x4Storage": "quint2x4",
    "UntypedStorage": "uint8",
    "TypedStorage": "uint8",
}

SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "U16": "uint16",
    "U32": "uint32",
    "U64": "uint64",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "C64": "complex64",
    "F8_E8M0": "float8_e8m0fnu",
    "F4": "float4_e2m1fn_x2",
}


def itemsize(dtype: str) -> int:
    """Bytes per element of `dtype` (1 for names we do not know, so sizes stay conservative)."""
    return _SIZES.get(dtype, 1)


def itemsizes(dtypes: Iterable[str]) -> list[int]:
    """`itemsize` of each dtype, mapped in C (state dicts reach 10^5 tensors)."""
    return list(map(_SIZES.get, dtypes, repeat(1)))


def is_dtype_name(name: str) -> bool:
    """True for a dtype name we know the item size of (torch spelling, e.g. `float32`; `rebuild` uses it
    to tell a `torch.<dtype>` global from other torch names).
    """
    return name in _SIZES
