"""Inert placeholders the safe unpickler builds instead of the objects a pickle names.

Nothing here imports or calls what a checkpoint refers to: a global is just its dotted name, a call
is the callable's placeholder plus its (inert) arguments, and a tensor is metadata about where its
bytes would be. Placeholders hash by identity so hostile nesting can never trigger deep hashing.
"""

from __future__ import annotations

from typing import Any, Optional

from torchdoctor.ckpt.dtypes import itemsize


class Inert:
    """Base of all placeholders: identity hash and equality, shallow repr."""

    __slots__ = ()

    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other


class GlobalRef(Inert):
    """A module-level name the pickle asks the loader to import (`GLOBAL`, `STACK_GLOBAL`, `INST`)."""

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name
        self.qualname = f"{module}.{name}"

    def __repr__(self) -> str:
        return f"<global {self.qualname}>"


class Instance(Inert):
    """An object the loader would create and fill: `NEWOBJ`/`OBJ`/`INST` (cls), or `REDUCE` (func(*args)).

    `state` is what `BUILD` would pass to `__setstate__`; `items`/`setitems` are what `APPEND(S)`/
    `SETITEM(S)` would add to it.
    """

    def __init__(self, callable_: Any, args: Any, how: str) -> None:
        self.callable = callable_
        self.args = args
        self.how = how
        self.state: Any = None
        self.items: list[Any] = []
        self.setitems: list[tuple[Any, Any]] = []

    @property
    def qualname(self) -> str:
        """The dotted name of the global called or instantiated; "<dynamic>" when the pickle computed
        the callable instead of naming it.
        """
        return self.callable.qualname if isinstance(self.callable, GlobalRef) else "<dynamic>"

    def state_dict_attr(self) -> dict:
        """The instance's `__dict__` as BUILD would set it (a `(dict, slots)` pair is merged)."""
        state = self.state
        if isinstance(state, tuple) and len(state) == 2:
            merged: dict = {}
            for part in state:
                if isinstance(part, dict):
                    merged.update(part)
            return merged
        return state if isinstance(state, dict) else {}

    def __repr__(self) -> str:
        return f"<{self.how} {self.qualname}>"


class PickledDict(dict):
    """A dict subclass instance rebuilt by `REDUCE` (OrderedDict, defaultdict, …); keeps the class name."""

    __hash__ = object.__hash__  # type: ignore[assignment]

    def __init__(self, qualname: str) -> None:
        super().__init__()
        self.qualname = qualname
        self.state: Any = None

    def __eq__(self, other: object) -> bool:
        return self is other


class Key(Inert):
    """A dict key or set member that is itself a container; kept by identity."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"<key {type(self.value).__name__}>"


class Blob(Inert):
    """A string or bytes value too large to keep in memory; only its size is recorded."""

    def __init__(self, kind: str, size: int) -> None:
        self.kind = kind
        self.size = size

    def __repr__(self) -> str:
        return f"<{self.kind} of {self.size} bytes>"


class Opaque(Inert):
    """Something the reader cannot know without running code (an extension code, an out-of-band buffer)."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return f"<{self.what}>"


IN_PICKLE = "<inside the pickle>"  # the `record` of a storage whose bytes a plain pickle carries inline


class StorageRef(Inert):
    """A tensor storage named by a persistent id: where its bytes are and how many there are.

    A plain `__slots__` class: files with 10^5 tensors create as many of these.
    """

    __slots__ = ("key", "dtype", "itemsize", "location", "numel", "record")

    def __init__(
        self, key: str, dtype: str, itemsize: int, location: str, numel: int, record: Optional[str] = None
    ) -> None:
        self.key = key
        self.dtype = dtype
        self.itemsize = itemsize
        self.location = location
        self.numel = numel  # in elements of `itemsize` bytes
        self.record = record  # zip member name, when the storage lives in a zip record

    @property
    def nbytes(self) -> int:
        """Bytes the storage declares (`numel` x `itemsize`), whether or not the file holds them."""
        return self.numel * self.itemsize

    def __repr__(self) -> str:
        return f"<storage {self.key!r} {self.dtype} x{self.numel} on {self.location}>"


class TensorMeta(Inert):
    """A tensor as metadata only: shape, dtype, strides and which part of which storage it views.

    `kind` is tensor, quantized, meta or subclass:<name>.
    A plain `__slots__` class: files with 10^5 tensors create as many of these.
    """

    __slots__ = ("dtype", "shape", "stride", "storage", "storage_offset", "requires_grad", "is_parameter", "kind")

    def __init__(
        self,
        dtype: str,
        shape: tuple[int, ...],
        stride: tuple[int, ...],
        storage: Optional[StorageRef],
        storage_offset: int = 0,
        requires_grad: bool = False,
        is_parameter: bool = False,
        kind: str = "tensor",
    ) -> None:
        self.dtype = dtype
        self.shape = shape
        self.stride = stride
        self.storage = storage
        self.storage_offset = storage_offset  # in elements of dtype
        self.requires_grad = requires_grad
        self.is_parameter = is_parameter
        self.kind = kind

    def __repr__(self) -> str:
        return f"<tensor {self.dtype}{list(self.shape)}>"

    @property
    def numel(self) -> int:
        """Elements in the tensor: the product of its shape (1 for a 0-d tensor)."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def itemsize(self) -> int:
        """Bytes per element of `dtype` (1 for a dtype name we do not know)."""
        return itemsize(self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's own elements (not of the storage it views, which may be larger)."""
        return self.numel * self.itemsize

    @property
    def device(self) -> str:
        """Where the tensor was saved: its storage's location; "meta" for meta tensors and "unknown"
        for other tensors without a storage.
        """
        if self.storage is None:
            return "meta" if self.kind == "meta" else "unknown"
        return self.storage.location

    def byte_span(self) -> tuple[int, int]:
        """[start, end) byte range of the storage this tensor can touch (empty tensors touch nothing)."""
        size = self.itemsize
        start = self.storage_offset * size
        if self.numel == 0:
            return start, start
        last = self.storage_offset + sum((d - 1) * s for d, s in zip(self.shape, self.stride) if s > 0)
        return start, (last + 1) * size

    def is_dense(self) -> bool:
        """True when the tensor covers exactly `numel` consecutive elements (contiguous or permuted)."""
        dims = sorted((s, d) for d, s in zip(self.shape, self.stride) if d != 1)
        expected = 1
        for s, d in dims:
            if s != expected:
                return False
            expected *= d
        return True


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a contiguous (row-major) tensor of `shape`, in elements."""
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def show_args(args: Any, budget: int = 160) -> str:
    """A short, inert rendering of call arguments (strings and numbers verbatim, the rest by type)."""

    def one(v: Any, depth: int = 0) -> str:
        if isinstance(v, (bytes, bytearray)) and len(v) > 32:  # a payload's raw bytes say nothing to a reader
            kind = " (a torch.save zip)" if v[:4] == b"PK\x03\x04" else " (a pickle)" if v[:1] == b"\x80" else ""
            return f"<{len(v):,} bytes{kind}>"
        if isinstance(v, (str, bytes)):
            return repr(v[:budget])
        if isinstance(v, (int, float, bool)) or v is None:
            return repr(v)
        if isinstance(v, GlobalRef):
            return v.qualname
        if isinstance(v, Instance):
            return f"{v.qualname}(...)"
        if isinstance(v, TensorMeta):
            return "<tensor>"
        if isinstance(v, (tuple, list)) and depth < 3:
            inner = ", ".join(one(x, depth + 1) for x in v[:6]) + (", ..." if len(v) > 6 else "")
            return f"({inner})" if isinstance(v, tuple) else f"[{inner}]"
        return f"<{type(v).__name__}>"

    text = ", ".join(one(a) for a in args[:6]) if isinstance(args, tuple) else one(args)
    return text if len(text) <= budget else text[: budget - 3] + "..."
