"""Turn calls to torch's tensor rebuild functions into `TensorMeta`, reading only their (inert) arguments."""

from __future__ import annotations

from typing import Any, Callable, Optional

from torchdoctor.ckpt.dtypes import is_dtype_name
from torchdoctor.ckpt.objects import IN_PICKLE, GlobalRef, Instance, StorageRef, TensorMeta

Rebuilder = Callable[[tuple], Optional[TensorMeta]]


def _ints(value: Any) -> Optional[tuple[int, ...]]:
    """A size or stride as a tuple of ints (from a tuple, list or `torch.Size` of ints), else None."""
    if type(value) is tuple:  # the usual case, without building another tuple
        for v in value:
            if type(v) is not int:
                return None
        return value
    if isinstance(value, (tuple, list)) and all(type(v) is int for v in value):
        return tuple(value)
    if hasattr(value, "args") and hasattr(value, "qualname") and value.qualname == "torch.Size":
        return _ints(value.args[0] if isinstance(value.args, tuple) and value.args else None)
    return None


def _dtype(value: Any) -> Optional[str]:
    if isinstance(value, GlobalRef) and value.module == "torch" and is_dtype_name(value.name):
        return value.name
    return None


_BYTES_STORAGE = "torch.storage._load_from_bytes"
_MAX_STORAGE_BLOB = 64 << 20  # a storage pickled by plain `pickle` carries its bytes in the pickle itself
InlineReader = Callable[[bytes], Optional[StorageRef]]
_inline_reader: list[InlineReader] = []


def read_inline_storages_with(reader: InlineReader) -> None:
    """How the bytes of an inline storage (a legacy torch.save of it) become its `StorageRef`: given by the
    reader, which this module cannot import (the reader drives the unpickler that calls the rebuilders)."""
    _inline_reader[:] = [reader]


def _storage_from_bytes(storage: Any) -> Any:
    """The storage a plain `pickle.dump(tensor)` writes, `_load_from_bytes(b"<a legacy torch.save of it>")`,
    read from those bytes without running them (its data is in the pickle, so it has no place in the file)."""
    if not (
        isinstance(storage, Instance)
        and storage.qualname == _BYTES_STORAGE
        and isinstance(storage.args, tuple)
        and storage.args
        and isinstance(storage.args[0], (bytes, bytearray))
        and len(storage.args[0]) <= _MAX_STORAGE_BLOB
        and _inline_reader
    ):
        return storage
    cached = getattr(storage, "_read_storage", None)
    if cached is not None:  # tensors sharing the storage share the placeholder (the pickle's memo)
        return cached
    found = _inline_reader[0](bytes(storage.args[0])) or storage
    if isinstance(found, StorageRef):
        found.record = IN_PICKLE
    storage._read_storage = found  # type: ignore[attr-defined]
    return found


def _strided(
    storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any = False, dtype: Optional[str] = None
) -> Optional[TensorMeta]:
    storage = _storage_from_bytes(storage)
    shape, strides = _ints(size), _ints(stride)
    if not isinstance(storage, StorageRef) or type(offset) is not int or shape is None or strides is None:
        return None
    if len(shape) != len(strides) or offset < 0 or (shape and (min(shape) < 0 or min(strides) < 0)):
        return None
    return TensorMeta(dtype or storage.dtype, shape, strides, storage, offset, requires_grad is True)


def _v2(args: tuple) -> Optional[TensorMeta]:
    # _rebuild_tensor(storage, offset, size, stride), _v2 adds (requires_grad, backward_hooks[, metadata])
    return _strided(*args[:5]) if len(args) >= 4 else None


def _v3(args: tuple) -> Optional[TensorMeta]:
    if len(args) < 7:
        return None
    return _strided(args[0], args[1], args[2], args[3], args[4], dtype=_dtype(args[6]))


def _parameter(args: tuple) -> Optional[TensorMeta]:
    if not args or not isinstance(args[0], TensorMeta):
        return None
    t = args[0]
    t.is_parameter = True
    t.requires_grad = bool(args[1]) if len(args) > 1 and isinstance(args[1], bool) else True
    return t


def _from_type(args: tuple) -> Optional[TensorMeta]:
    # _rebuild_from_type_v2(func, new_type, args, state): func(*args) then cast to new_type
    if len(args) < 3 or not isinstance(args[0], GlobalRef) or not isinstance(args[2], tuple):
        return None
    inner = rebuild(args[0].qualname, args[2])
    if inner is not None and isinstance(args[1], GlobalRef) and args[1].qualname != "torch.Tensor":
        if args[1].qualname == "torch.nn.parameter.Parameter":
            inner.is_parameter = True
        else:
            inner.kind = f"subclass:{args[1].qualname}"
    return inner


def _qtensor(args: tuple) -> Optional[TensorMeta]:
    t = _strided(args[0], args[1], args[2], args[3], args[5] if len(args) > 5 else False) if len(args) >= 4 else None
    if t is not None:
        t.kind = "quantized"
    return t


def _meta(args: tuple) -> Optional[TensorMeta]:
    # _rebuild_meta_tensor_no_storage(dtype, size, stride, requires_grad)
    if len(args) < 3:
        return None
    dtype, shape, strides = _dtype(args[0]), _ints(args[1]), _ints(args[2])
    if dtype is None or shape is None or strides is None:
        return None
    return TensorMeta(dtype=dtype, shape=shape, stride=strides, storage=None, kind="meta")


_REBUILDERS = {
    "torch._utils._rebuild_tensor": _v2,
    "torch._utils._rebuild_tensor_v2": _v2,
    "torch._utils._rebuild_tensor_v3": _v3,
    "torch._utils._rebuild_parameter": _parameter,
    "torch._utils._rebuild_parameter_with_state": _parameter,
    "torch._tensor._rebuild_from_type_v2": _from_type,
    "torch._utils._rebuild_qtensor": _qtensor,
    "torch._utils._rebuild_meta_tensor_no_storage": _meta,
}


def rebuilder(qualname: str) -> Optional[Rebuilder]:
    """The function turning a call of `qualname` into a `TensorMeta` (it takes the argument tuple), or None."""
    return _REBUILDERS.get(qualname)


def rebuild(qualname: str, args: Any) -> Optional[TensorMeta]:
    """The tensor a known rebuild call would produce, or None (then the call stays an inert `Instance`)."""
    fn = _REBUILDERS.get(qualname)
    if fn is None or not isinstance(args, tuple):
        return None
    return fn(args)
