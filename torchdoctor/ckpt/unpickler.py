"""An opcode-by-opcode pickle interpreter that builds inert placeholders and never imports or calls anything.

`pickle.Unpickler` would import every global and call every `REDUCE`; this machine only records them.
Every global becomes a `GlobalRef`, every call an `Instance`, every persistent id goes to the caller's
`persistent_load` (which turns torch storage ids into `StorageRef`s), and the known tensor rebuild
functions become `TensorMeta`. Operations that would run code on an imported object (BUILD, APPEND or
SETITEM on a global, calling something that is not a plain global, computed STACK_GLOBAL names,
extension codes) are recorded as `events`. Work is bounded by `Limits`; exceeding one stops the
parse with an error message instead of hanging or exhausting memory.
"""

from __future__ import annotations

import _compat_pickle
import codecs
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, NoReturn, Optional, Protocol

from torchdoctor.ckpt.objects import Blob, GlobalRef, Inert, Instance, Key, Opaque, PickledDict
from torchdoctor.ckpt.policy import Pair, Use
from torchdoctor.ckpt.rebuild import Rebuilder, rebuilder

# The opcodes torch's weights_only unpickler accepts (torch/_weights_only_unpickler.py, 2.13).
WEIGHTS_ONLY_OPCODES = frozenset(
    "APPEND APPENDS BINFLOAT BINGET BININT BININT1 BININT2 BINPERSID BINPUT BINUNICODE BUILD EMPTY_DICT "
    "EMPTY_LIST EMPTY_SET EMPTY_TUPLE GLOBAL LONG1 LONG_BINGET LONG_BINPUT MARK NEWFALSE NEWOBJ NEWTRUE NONE "
    "PROTO REDUCE SETITEM SETITEMS SHORT_BINSTRING STOP TUPLE TUPLE1 TUPLE2 TUPLE3".split()
)

_OPNAMES = {
    b"(": "MARK",
    b".": "STOP",
    b"0": "POP",
    b"1": "POP_MARK",
    b"2": "DUP",
    b"F": "FLOAT",
    b"I": "INT",
    b"J": "BININT",
    b"K": "BININT1",
    b"L": "LONG",
    b"M": "BININT2",
    b"N": "NONE",
    b"P": "PERSID",
    b"Q": "BINPERSID",
    b"R": "REDUCE",
    b"S": "STRING",
    b"T": "BINSTRING",
    b"U": "SHORT_BINSTRING",
    b"V": "UNICODE",
    b"X": "BINUNICODE",
    b"a": "APPEND",
    b"b": "BUILD",
    b"c": "GLOBAL",
    b"d": "DICT",
    b"}": "EMPTY_DICT",
    b"e": "APPENDS",
    b"g": "GET",
    b"h": "BINGET",
    b"i": "INST",
    b"j": "LONG_BINGET",
    b"l": "LIST",
    b"]": "EMPTY_LIST",
    b"o": "OBJ",
    b"p": "PUT",
    b"q": "BINPUT",
    b"r": "LONG_BINPUT",
    b"s": "SETITEM",
    b"t": "TUPLE",
    b")": "EMPTY_TUPLE",
    b"u": "SETITEMS",
    b"G": "BINFLOAT",
    b"\x80": "PROTO",
    b"\x81": "NEWOBJ",
    b"\x82": "EXT1",
    b"\x83": "EXT2",
    b"\x84": "EXT4",
    b"\x85": "TUPLE1",
    b"\x86": "TUPLE2",
    b"\x87": "TUPLE3",
    b"\x88": "NEWTRUE",
    b"\x89": "NEWFALSE",
    b"\x8a": "LONG1",
    b"\x8b": "LONG4",
    b"B": "BINBYTES",
    b"C": "SHORT_BINBYTES",
    b"\x8c": "SHORT_BINUNICODE",
    b"\x8d": "BINUNICODE8",
    b"\x8e": "BINBYTES8",
    b"\x8f": "EMPTY_SET",
    b"\x90": "ADDITEMS",
    b"\x91": "FROZENSET",
    b"\x92": "NEWOBJ_EX",
    b"\x93": "STACK_GLOBAL",
    b"\x94": "MEMOIZE",
    b"\x95": "FRAME",
    b"\x96": "BYTEARRAY8",
    b"\x97": "NEXT_BUFFER",
    b"\x98": "READONLY_BUFFER",
}
_OPCODES = {k[0]: v for k, v in _OPNAMES.items()}
_SCALARS = (str, int, float, bool, bytes, type(None))
_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
_MISSING = object()
_DICT_TYPES = frozenset({"collections.OrderedDict", "collections.defaultdict", "builtins.dict"})
# allowlisted functions that call or instantiate globals passed to them as arguments (see `smuggled`)
_SMUGGLERS = frozenset(
    {
        "torch._tensor._rebuild_from_type_v2",
        "copyreg._reconstructor",
        "copyreg.__newobj__",
        "copyreg.__newobj_ex__",
        "torch._utils._rebuild_wrapper_subclass",
    }
)


# The special names Python itself looks up (a library's private `__cache__`-style attribute is plain data).
_PYTHON_DUNDERS = frozenset(
    {
        n
        for obj in (
            object,
            type,
            lambda: 0,
            (lambda: 0).__code__,
            list,
            dict,
            int,
            float,
            str,
            bytes,
            set,
            property,
            staticmethod,
            classmethod,
            codecs,
            Exception,
        )
        for n in dir(obj)
        if n.startswith("__") and n.endswith("__")
    }
    | set(
        "__setstate__ __getstate__ __reduce_ex__ __getattr__ __call__ __enter__ __exit__ __get__ __set__ __delete__ "
        "__set_name__ __missing__ __fspath__ __index__ __await__ __aiter__ __anext__ __copy__ __deepcopy__ "
        "__class_getitem__ __builtins__ __import__ __loader__ __spec__ __path__ __file__ __wrapped__ __func__ "
        "__self__ __globals__ __code__ __closure__ __defaults__ __kwdefaults__ __annotations__ __init_subclass__ "
        "__subclasshook__ __instancecheck__ __subclasscheck__ __post_init__ __iter__ __next__ __getitem__ "
        "__setitem__ __len__ __contains__ __bool__ __del__ __dict__ __slots__ __weakref__ __mro_entries__ "
        "__prepare__ __signature__ __text_signature__ __objclass__ __cached__ __package__ __all__".split()
    )
)


@dataclass(frozen=True)
class Limits:
    """Bounds on the work one pickle may cause; generous for real checkpoints, small for bombs."""

    max_opcodes: int = 2_000_000  # at least (also bounds the stack, the memo and container sizes)
    opcodes_per_byte: int = 8  # ... or this many per byte the pickle occupies on disk (zip bombs stay bounded)
    max_memo: int = 1_000_000
    max_marks: int = 100_000
    max_inline_bytes: int = 1 << 20  # longer str/bytes values become `Blob`s
    max_total_inline: int = 256 << 20  # str/bytes kept in memory, all values together
    max_long_bytes: int = 4096
    max_line: int = 1 << 16


class PickleParseError(Exception):
    """Internal: the pickle is malformed or exceeded a limit (the caller decides how to report it)."""


@dataclass
class Event:
    """An opcode that would run code on something the file controls (unsafe even if its names look benign)."""

    what: str
    pos: int


@dataclass
class PickleScan:
    """What one pickle contains, as far as it could be parsed."""

    value: Any = None
    protocol: int = 0
    globals: dict[Pair, int] = field(default_factory=dict)  # (module, name) -> how often the pickle names it
    uses: dict[Pair, Use] = field(default_factory=dict)  # the strongest use of each global (called > new > named)
    calls: dict[Pair, list[tuple[str, Any]]] = field(default_factory=dict)  # first (how, args) of each call
    events: list[Event] = field(default_factory=list)
    opcodes: set[str] = field(default_factory=set)
    error: Optional[str] = None  # why parsing stopped early (value is then None)
    nested: list[tuple[int, bytes]] = field(default_factory=list)  # bytes values that are pickles or zips


class ByteStream(Protocol):
    """What `Source` reads from: an open binary file, or a stream over one zip or tar member."""

    def read(self, size: int = -1, /) -> bytes:
        """Up to `size` bytes (all that remain when -1); b"" once the stream is exhausted."""


class Source:
    """Buffered reading from a binary stream with cheap skipping of large payloads."""

    CHUNK = 1 << 16

    def __init__(self, stream: ByteStream, limit: Optional[int] = None, on_disk: int = 0) -> None:
        self.stream = stream
        self.on_disk = on_disk  # bytes the stream occupies in the file (compressed size for deflated members)
        self.buf = b""
        self.pos = 0
        self.consumed = 0  # bytes before buf[0]
        self.remaining = limit  # bytes still allowed from the stream (None: until EOF)

    def _fill(self, need: int) -> None:
        parts = [self.buf[self.pos :]]
        have = len(parts[0])
        self.consumed += self.pos
        while have < need:
            want = max(self.CHUNK, need - have)
            if self.remaining is not None:
                want = min(want, self.remaining)
            chunk = self.stream.read(want) if want > 0 else b""
            if not chunk:
                break
            if self.remaining is not None:
                self.remaining -= len(chunk)
            parts.append(chunk)
            have += len(chunk)
        self.buf = b"".join(parts)
        self.pos = 0

    def read(self, n: int) -> bytes:
        """Exactly `n` bytes, refilling the buffer from the stream; a short stream is a truncated pickle (error)."""
        if self.pos + n > len(self.buf):
            self._fill(n)
            if n > len(self.buf):
                raise PickleParseError("pickle data was truncated")
        data = self.buf[self.pos : self.pos + n]
        self.pos += n
        return data

    def byte(self) -> int:
        """The next byte as an int; running out here means the pickle ended without a STOP opcode (error)."""
        if self.pos >= len(self.buf):
            self._fill(1)
            if not self.buf:
                raise PickleParseError("pickle data was truncated (no STOP opcode)")
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def skip(self, n: int) -> None:
        """Pass over `n` bytes without keeping them (a payload too big to hold), reading at most 1 MiB at a time.

        Fails when the stream ends first, so a forged length is reported as truncation, not silently accepted.
        """
        avail = len(self.buf) - self.pos
        if n <= avail:
            self.pos += n
            return
        n -= avail
        self.consumed += len(self.buf)
        self.buf, self.pos = b"", 0
        while n > 0:
            want = min(n, 1 << 20)
            if self.remaining is not None:
                want = min(want, self.remaining)
            chunk = self.stream.read(want) if want > 0 else b""
            if not chunk:
                raise PickleParseError("pickle data was truncated")
            if self.remaining is not None:
                self.remaining -= len(chunk)
            self.consumed += len(chunk)
            n -= len(chunk)

    def readline(self, max_line: int) -> bytes:
        """The bytes up to the next newline (newline consumed, not returned), for protocol 0's text opcodes.

        Fails on a line longer than `max_line` or a stream that ends inside it, so a missing newline cannot buffer a
        whole file.
        """
        while True:
            nl = self.buf.find(b"\n", self.pos)
            if nl >= 0:
                line = self.buf[self.pos : nl]
                self.pos = nl + 1
                return line
            if len(self.buf) - self.pos > max_line:
                raise PickleParseError("a text opcode's line is implausibly long")
            before = len(self.buf) - self.pos
            self._fill(before + 1)
            if len(self.buf) - self.pos == before:
                raise PickleParseError("pickle data was truncated inside a text opcode")

    def peek(self, n: int) -> bytes:
        """Up to `n` upcoming bytes without consuming them (fewer at the end of the stream)."""
        if self.pos + n > len(self.buf):
            self._fill(n)
        return self.buf[self.pos : self.pos + n]

    def tell(self) -> int:
        """Bytes consumed since this `Source` began reading: the position events and error messages report."""
        return self.consumed + self.pos

    def at_eof(self) -> bool:
        """True when no byte is left to read (buffer and stream, or its allowed length, used up): no pickle follows."""
        if self.pos < len(self.buf):
            return False
        self._fill(1)
        return not self.buf


def short(value: Any) -> str:
    """A bounded description of a value from the file (never a full, possibly huge or deep, repr)."""
    if isinstance(value, (str, bytes)):
        return repr(value[:60])
    if isinstance(value, (int, float, bool)) or value is None or isinstance(value, Inert):
        return repr(value)[:60]
    return f"<{type(value).__name__}>"


def _py2_str(value: Any) -> Any:
    """Python 2 `str` values load as text (torch passes encoding='utf-8'); undecodable ones stay bytes."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    return value


def _key(value: Any) -> Any:
    """A dict key / set member that never hashes a container (hostile nesting stays cheap)."""
    return value if isinstance(value, _SCALARS) or isinstance(value, Inert) else Key(value)


class _Machine:
    """The unpickler's state (stack, marks, memo, frame) and one `op_<OPCODE>` handler per opcode.

    Each handler does to the stack and memo what CPython's `pickle._Unpickler.load_*` does, except that imports,
    calls and mutations of imported objects only leave placeholders, records in `scan` and events (`run` inlines
    the commonest opcodes).
    """

    def __init__(self, src: Source, persistent_load: Callable[[Any], Any], limits: Limits) -> None:
        self.src = src
        self.persistent_load = persistent_load
        self.limits = limits
        self.stack: list[Any] = []
        self.marks: list[list[Any]] = []
        self.memo: dict[int, Any] = {}
        self.inline = 0
        self.nested: list[tuple[int, bytes]] = []  # (byte, value) of bytes values that are pickles or zips
        self.proto = 0  # the current PROTO: pickle applies Python 2 name mapping while it is below 3
        self.scan = PickleScan()
        # per global REDUCE calls: (pair, smuggles, dict type, rebuild function); pairs whose use is fully recorded
        self.plans: dict[GlobalRef, tuple[Pair, bool, bool, Optional[Rebuilder]]] = {}
        self.recorded: set[Pair] = set()
        self.frame_end: Optional[int] = None  # where the current FRAME ends (stream position), while inside one

    # -- helpers -------------------------------------------------------------------------------
    def fail(self, message: str) -> NoReturn:
        """Stop interpreting with `message` (raised as `PickleParseError`; `scan_pickle` stores it in `error`)."""
        raise PickleParseError(message)

    def pop(self) -> Any:
        """Pop the top of the stack; an empty stack means a malformed pickle (error, not IndexError)."""
        if not self.stack:
            self.fail("stack underflow (malformed pickle)")
        return self.stack.pop()

    def top(self) -> Any:
        """The top of the stack, left in place (what PUT, APPEND, SETITEM and BUILD act on); error when empty."""
        if not self.stack:
            self.fail("stack underflow (malformed pickle)")
        return self.stack[-1]

    def pop_mark(self) -> list[Any]:
        """The items pushed since the last MARK, restoring the stack below it (pickle's own `pop_mark`)."""
        if not self.marks:
            self.fail("mark stack underflow (malformed pickle)")
        items = self.stack
        self.stack = self.marks.pop()
        return items

    def push(self, value: Any) -> None:
        """Push `value` on the stack."""
        self.stack.append(value)

    def event(self, what: str, pos: int) -> None:
        """Record an `Event` at `pos`: code the loader would run, or a trick making loaders disagree (1000 kept)."""
        if len(self.scan.events) < 1000:
            self.scan.events.append(Event(what, pos))

    def memo_put(self, index: int, value: Any) -> None:
        """Store `value` at memo `index`; a new index beyond `Limits.max_memo` entries stops the parse."""
        if index not in self.memo and len(self.memo) >= self.limits.max_memo:
            self.fail(f"more than {self.limits.max_memo:,} memo entries (a pickle bomb?)")
        self.memo[index] = value

    def memo_get(self, index: int) -> Any:
        """The memo entry at `index`; reading one that was never stored is a malformed pickle (error)."""
        try:
            return self.memo[index]
        except KeyError:
            self.fail(f"memo entry {index} is read before it is written (malformed pickle)")

    def text(self, size: int, kind: str) -> Any:
        """Read a `size`-byte str/bytes/bytearray argument (`kind`), bounded by the limits.

        Values over `max_inline_bytes` are skipped and become a `Blob`; the total kept is capped at
        `max_total_inline`. bytes values that look like a zip or a whole pickle are kept in `nested` (up to 16) so
        the reader can scan what they would load too.
        """
        if size < 0:
            self.fail("negative length")
        if size > self.limits.max_inline_bytes:
            self.src.skip(size)
            return Blob(kind, size)
        self.inline += size
        if self.inline > self.limits.max_total_inline:
            self.fail(f"more than {self.limits.max_total_inline:,} bytes of strings (a pickle bomb?)")
        data = self.src.read(size)
        if (
            kind != "str"
            and len(self.nested) < 16
            and (
                data[:4] == b"PK\x03\x04" or (len(data) > 2 and data[0] == 0x80 and data[1] <= 5 and data[-1:] == b".")
            )
        ):
            self.nested.append((self.src.tell() - size, data))
        if kind == "str":
            return data.decode("utf-8", "surrogatepass")
        return data if kind == "bytes" else bytearray(data)

    def global_ref(self, module: Any, name: Any, opcode: str, pos: int) -> Any:
        """The `GlobalRef` for `module.name`, counted in `scan.globals` and recorded as at least named.

        Below protocol 3 the Python 2 names are mapped as pickle does (`_compat_pickle`); a module or name that is
        not a str (computed by STACK_GLOBAL) cannot be known without running the pickle: an event and an `Opaque`.
        """
        if not isinstance(module, str) or not isinstance(name, str):
            self.event(
                f"{opcode} with a computed module or name ({short(module)}, {short(name)}) that cannot "
                "be resolved without running the pickle",
                pos,
            )
            return Opaque("computed global")
        if self.proto < 3:  # pickle maps Python 2 names (commands.call -> subprocess.call) per current PROTO
            if (module, name) in _compat_pickle.NAME_MAPPING:
                module, name = _compat_pickle.NAME_MAPPING[(module, name)]
            elif module in _compat_pickle.IMPORT_MAPPING:
                module = _compat_pickle.IMPORT_MAPPING[module]
        ref = GlobalRef(module, name)
        pair = (module, name)
        self.scan.globals[pair] = self.scan.globals.get(pair, 0) + 1
        self.scan.uses.setdefault(pair, Use.NAMED)
        return ref

    def use(self, func: Any, use: Use, how: str, args: Any, pos: int) -> None:
        """Record that `func` is instantiated or called (`how` says by which opcode or rebuild function)."""
        if not isinstance(func, GlobalRef):
            verb = "calls" if use is Use.CALLED else "instantiates"
            self.event(f"{how} {verb} {short(func)}, a value computed by the pickle rather than a named global", pos)
            return
        pair = (func.module, func.name)
        if use is Use.CALLED or self.scan.uses.get(pair) is not Use.CALLED:
            self.scan.uses[pair] = use
        calls = self.scan.calls.setdefault(pair, [])
        if len(calls) < 3:
            calls.append((how, args))

    def smuggled(self, func: GlobalRef, args: Any, pos: int) -> None:
        """Globals an allowlisted function calls or instantiates with arguments the pickle chose."""
        if not isinstance(args, tuple) or func.qualname not in _SMUGGLERS:
            return
        via = f"via {func.qualname}"
        if func.qualname == "torch._tensor._rebuild_from_type_v2" and len(args) >= 3:
            self.use(args[0], Use.CALLED, via, args[2], pos)  # func(*args), then as_subclass(new_type)
            self.use(args[1], Use.NEW, via, (), pos)
        elif func.qualname == "copyreg._reconstructor" and len(args) >= 2:
            self.use(args[0], Use.NEW, via, (), pos)
            base = args[1]
            if not (isinstance(base, GlobalRef) and base.qualname == "builtins.object"):
                self.use(base, Use.CALLED, via, args[2:3], pos)  # base.__new__(cls, state); base.__init__(obj, state)
        elif (
            func.qualname in ("copyreg.__newobj__", "copyreg.__newobj_ex__", "torch._utils._rebuild_wrapper_subclass")
            and args
        ):
            self.use(args[0], Use.NEW, via, args[1:], pos)

    def call(self, func: Any, args: Any, how: str, pos: int) -> Any:
        """The placeholder for calling (or instantiating) `func`, with the use recorded."""
        if how == "REDUCE":
            return self.reduce(func, args, pos)
        self.use(func, Use.NEW if how in ("NEWOBJ", "NEWOBJ_EX") else Use.CALLED, how, args, pos)
        return Instance(func, args, how)

    def reduce(self, func: Any, args: Any, pos: int) -> Any:
        """REDUCE `func(*args)`: a `TensorMeta` for a tensor rebuild, a `PickledDict`, or an `Instance`.

        Every tensor makes two such calls, so what a global needs is looked up once per `GlobalRef`, and its
        use is not re-recorded once nothing more can be recorded for it (called, first three calls kept).
        """
        if not isinstance(func, GlobalRef):
            self.use(func, Use.CALLED, "REDUCE", args, pos)
            return Instance(func, args, "REDUCE")
        plan = self.plans.get(func)
        if plan is None:
            qualname = func.qualname
            plan = self.plans[func] = (
                (func.module, func.name),
                qualname in _SMUGGLERS,
                qualname in _DICT_TYPES,
                rebuilder(qualname),
            )
        pair, smuggles, dict_type, rebuild_fn = plan
        if pair not in self.recorded:
            self.use(func, Use.CALLED, "REDUCE", args, pos)
            if len(self.scan.calls[pair]) >= 3:
                self.recorded.add(pair)
        if smuggles:
            self.smuggled(func, args, pos)
        if dict_type:
            return PickledDict(func.qualname)
        if rebuild_fn is not None and isinstance(args, tuple):
            built = rebuild_fn(args)
            if built is not None:
                return built
        return Instance(func, args, "REDUCE")

    def decode_line(self, line: bytes) -> str:
        """A text opcode's line as UTF-8 (undecodable bytes replaced, a trailing carriage return dropped)."""
        return line.decode("utf-8", "replace").rstrip("\r")

    # -- main loop -----------------------------------------------------------------------------
    def run(self) -> Any:
        """Interpret opcodes up to STOP and return the value it pops.

        The opcodes that make up nearly all of a state_dict's pickle run inline on locals (the buffer, the
        position in it, the stack) when their argument bytes are in the buffer and nothing can go wrong; any
        other case goes to the opcode's method, with `src.pos` and `self.stack` synced around the call, and
        the method reports the error. Inline opcodes are all ones the weights_only unpickler accepts and are
        not recorded in `scan.opcodes` (except SHORT_BINUNICODE, which is). Opcodes are counted against the
        budget only when the bytes the stream may still yield (each opcode takes at least one) could exceed it.
        """
        src, limits = self.src, self.limits
        max_opcodes = max(limits.max_opcodes, src.on_disk * limits.opcodes_per_byte)
        counting = src.remaining is None or len(src.buf) - src.pos + src.remaining > max_opcodes
        dispatch = {code: getattr(self, "op_" + name) for code, name in _OPCODES.items() if name != "STOP"}
        codes: set[int] = set()
        opcount = 0
        memo, marks, max_memo, max_marks = self.memo, self.marks, limits.max_memo, limits.max_marks
        max_inline, max_total = limits.max_inline_bytes, limits.max_total_inline
        memo_get, persistent_load, reduce, missing = memo.get, self.persistent_load, self.reduce, _MISSING
        stack = self.stack
        buf, i, consumed = src.buf, src.pos, src.consumed
        n = len(buf)
        end = n - 5  # below it, an opcode's next 5 bytes are buffered
        try:
            while True:
                if counting:
                    opcount += 1
                    if opcount > max_opcodes:
                        self.fail(f"more than {max_opcodes:,} pickle opcodes")
                if i < end:
                    code = buf[i]
                    if code < 0x60:  # two shorter chains, each in order of frequency in a state_dict
                        if code == 0x4B:  # BININT1
                            stack.append(buf[i + 1])
                            i += 2
                            continue
                        elif code == 0x28:  # MARK
                            if len(marks) < max_marks:
                                marks.append(stack)
                                stack = []
                                i += 1
                                continue
                        elif code == 0x58:  # BINUNICODE
                            size = _U32(buf, i + 1)[0]
                            stop = i + 5 + size
                            if stop <= n and size <= max_inline and self.inline + size <= max_total:
                                self.inline += size
                                stack.append(buf[i + 5 : stop].decode("utf-8", "surrogatepass"))
                                i = stop
                                continue
                        elif code == 0x52:  # REDUCE
                            if len(stack) > 1:
                                args = stack.pop()
                                stack[-1] = reduce(stack[-1], args, consumed + i)
                                i += 1
                                continue
                        elif code == 0x51:  # BINPERSID
                            if stack:
                                stack[-1] = persistent_load(stack[-1])
                                i += 1
                                continue
                        elif code == 0x29:  # EMPTY_TUPLE
                            stack.append(())
                            i += 1
                            continue
                        elif code == 0x4D:  # BININT2
                            stack.append(buf[i + 1] | buf[i + 2] << 8)
                            i += 3
                            continue
                        elif code == 0x4A:  # BININT
                            stack.append(_I32(buf, i + 1)[0])
                            i += 5
                            continue
                        elif code == 0x4E:  # NONE
                            stack.append(None)
                            i += 1
                            continue
                        elif code == 0x5D:  # EMPTY_LIST
                            stack.append([])
                            i += 1
                            continue
                    else:
                        if code == 0x72:  # LONG_BINPUT
                            index = _U32(buf, i + 1)[0]
                            if stack and (len(memo) < max_memo or index in memo):
                                memo[index] = stack[-1]
                                i += 5
                                continue
                        elif code == 0x68:  # BINGET
                            value = memo_get(buf[i + 1], missing)
                            if value is not missing:
                                stack.append(value)
                                i += 2
                                continue
                        elif code == 0x74:  # TUPLE
                            if marks:
                                items, stack = stack, marks.pop()
                                stack.append(tuple(items))
                                i += 1
                                continue
                        elif code == 0x85:  # TUPLE1
                            if stack:
                                stack[-1] = (stack[-1],)
                                i += 1
                                continue
                        elif code == 0x89:  # NEWFALSE
                            stack.append(False)
                            i += 1
                            continue
                        elif code == 0x71:  # BINPUT
                            index = buf[i + 1]
                            if stack and (len(memo) < max_memo or index in memo):
                                memo[index] = stack[-1]
                                i += 2
                                continue
                        elif code == 0x6A:  # LONG_BINGET
                            value = memo_get(_U32(buf, i + 1)[0], missing)
                            if value is not missing:
                                stack.append(value)
                                i += 5
                                continue
                        elif code == 0x86:  # TUPLE2
                            if len(stack) > 1:
                                value = stack.pop()
                                stack[-1] = (stack[-1], value)
                                i += 1
                                continue
                        elif code == 0x87:  # TUPLE3
                            if len(stack) > 2:
                                value = stack.pop()
                                first = stack.pop()
                                stack[-1] = (stack[-1], first, value)
                                i += 1
                                continue
                        elif code == 0x88:  # NEWTRUE
                            stack.append(True)
                            i += 1
                            continue
                        elif code == 0x7D:  # EMPTY_DICT
                            stack.append({})
                            i += 1
                            continue
                        elif code == 0x75:  # SETITEMS
                            if marks and marks[-1] and not len(stack) % 2:
                                items, stack = stack, marks.pop()
                                self.setitems(stack[-1], items, "SETITEMS", consumed + i)
                                i += 1
                                continue
                        elif code == 0x8C:  # SHORT_BINUNICODE (recorded: weights_only refuses it)
                            size = buf[i + 1]
                            stop = i + 2 + size
                            if stop <= n and size <= max_inline and self.inline + size <= max_total:
                                codes.add(code)
                                self.inline += size
                                stack.append(buf[i + 2 : stop].decode("utf-8", "surrogatepass"))
                                i = stop
                                continue
                    src.pos = i + 1
                    pos = consumed + i
                elif self.frame_end is not None and consumed + i >= self.frame_end:
                    self.frame_ends(consumed + i)
                    end = n - 5
                    continue
                elif i < n:
                    code = buf[i]
                    src.pos = i + 1
                    pos = consumed + i
                else:
                    src.pos = i
                    pos = src.tell()
                    code = src.byte()
                codes.add(code)
                self.stack = stack
                if code == 0x2E:  # STOP
                    return self.pop()
                handler = dispatch.get(code)
                if handler is None:
                    self.fail(f"invalid pickle opcode 0x{code:02x} at byte {pos}")
                handler(pos)
                stack, buf, i, consumed = self.stack, src.buf, src.pos, src.consumed
                n = len(buf)
                end = n - 5 if self.frame_end is None else min(n - 5, self.frame_end - consumed)
        finally:
            self.scan.opcodes.update(_OPCODES[c] for c in codes if c in _OPCODES)

    # -- opcodes -------------------------------------------------------------------------------
    def op_PROTO(self, pos: int) -> None:
        """PROTO: CPython's unpickler checks the protocol version the pickle declares, refusing one above 5.

        This reader checks it the same way, keeps it for the Python 2 name mapping of GLOBAL and records the
        highest seen.
        """
        proto = self.src.byte()
        if proto > 5:
            self.fail(f"unsupported pickle protocol {proto}")
        self.proto = proto
        self.scan.protocol = max(self.scan.protocol, proto)

    def op_FRAME(self, pos: int) -> None:
        """FRAME: CPython's unpickler loads the next frame (8-byte length) into memory and reads opcodes from it.

        This reader only notes where the frame ends; a FRAME inside the previous frame is an event (readers
        disagree).
        """
        length = struct.unpack("<Q", self.src.read(8))[0]
        if self.frame_end is not None and pos < self.frame_end:
            self.event(
                f"a FRAME starts at byte {pos}, inside the previous frame (which ends at byte "
                f"{self.frame_end}): unpicklers disagree on what follows",
                pos,
            )
        self.frame_end = self.src.tell() + length

    def frame_ends(self, at: int) -> None:
        """The stream reached the current frame's declared end: it must fall between two opcodes."""
        if at > self.frame_end:  # type: ignore[operator]
            self.event(
                f"a FRAME's declared end (byte {self.frame_end}) falls inside an opcode that runs to byte "
                f"{at}: Python's own unpicklers read that opcode differently (one refuses it), a way to show a "
                "scanner other opcodes than the loader runs",
                self.frame_end or 0,
            )
        self.frame_end = None

    def op_MARK(self, pos: int) -> None:
        """MARK: CPython's unpickler saves the stack on the mark stack and starts an empty one.

        This reader does the same, stopping the parse beyond `Limits.max_marks` nested marks.
        """
        self.marks.append(self.stack)
        self.stack = []
        if len(self.marks) > self.limits.max_marks:
            self.fail(f"more than {self.limits.max_marks:,} nested MARKs (a pickle bomb?)")

    def op_POP(self, pos: int) -> None:
        """POP: CPython's unpickler discards the top item (on an empty stack: everything back to the last MARK).

        This reader does the same.
        """
        if self.stack:
            self.stack.pop()
        else:
            self.pop_mark()

    def op_POP_MARK(self, pos: int) -> None:
        """POP_MARK: discards everything pushed since the last MARK, as CPython's unpickler does."""
        self.pop_mark()

    def op_DUP(self, pos: int) -> None:
        """DUP: pushes the top of the stack again, as CPython's unpickler does (the same object, not a copy)."""
        self.push(self.top())

    def op_FLOAT(self, pos: int) -> None:
        """FLOAT: pushes float(line) from a text line, as CPython's unpickler does; a bad literal is a parse error."""
        line = self.src.readline(self.limits.max_line)
        try:
            self.push(float(line))
        except ValueError:
            self.fail("bad FLOAT literal")

    def op_INT(self, pos: int) -> None:
        """INT: CPython's unpickler pushes int(line, 0) from a text line (00 and 01 are False and True).

        This reader parses it with `parse_int` (decimal or 0x hex), which bounds the literal's length.
        """
        line = self.src.readline(self.limits.max_line)
        if line == b"00":
            self.push(False)
        elif line == b"01":
            self.push(True)
        else:
            self.push(self.parse_int(line))

    def op_LONG(self, pos: int) -> None:
        """LONG: CPython's unpickler pushes a text-line integer with an optional trailing L (Python 2 long).

        This reader parses it with `parse_int` (decimal or 0x hex).
        """
        line = self.src.readline(self.limits.max_line)
        self.push(self.parse_int(line[:-1] if line.endswith(b"L") else line))

    def parse_int(self, line: bytes) -> int:
        """A protocol 0 integer literal (decimal, or hex with 0x) as INT, LONG, GET and PUT write it.

        Literals over 4000 characters are refused before `int()` sees them (its cost grows with the length).
        """
        if len(line) > 4000:
            self.fail("an integer literal is implausibly long")
        try:
            return int(line, 0) if line[:2] in (b"0x", b"0X") else int(line)
        except ValueError:
            self.fail("bad integer literal")
            raise  # unreachable

    def op_BININT(self, pos: int) -> None:
        """BININT: pushes a 4-byte signed little-endian int, as CPython's unpickler does."""
        self.push(struct.unpack("<i", self.src.read(4))[0])

    def op_BININT1(self, pos: int) -> None:
        """BININT1: pushes a 1-byte unsigned int, as CPython's unpickler does."""
        self.push(self.src.byte())

    def op_BININT2(self, pos: int) -> None:
        """BININT2: pushes a 2-byte unsigned little-endian int, as CPython's unpickler does."""
        self.push(struct.unpack("<H", self.src.read(2))[0])

    def op_LONG1(self, pos: int) -> None:
        """LONG1: pushes a little-endian two's-complement int (1-byte length), as CPython's unpickler does."""
        n = self.src.byte()
        self.push(int.from_bytes(self.src.read(n), "little", signed=True))

    def op_LONG4(self, pos: int) -> None:
        """LONG4: CPython's unpickler pushes a two's-complement little-endian int with a 4-byte length.

        This reader does the same, refusing lengths over `Limits.max_long_bytes` (a huge int is a cheap bomb).
        """
        n = struct.unpack("<i", self.src.read(4))[0]
        if n < 0 or n > self.limits.max_long_bytes:
            self.fail(f"LONG4 of {n} bytes is implausible")
        self.push(int.from_bytes(self.src.read(n), "little", signed=True))

    def op_NONE(self, pos: int) -> None:
        """NONE: pushes None, as CPython's unpickler does."""
        self.push(None)

    def op_NEWTRUE(self, pos: int) -> None:
        """NEWTRUE: pushes True, as CPython's unpickler does."""
        self.push(True)

    def op_NEWFALSE(self, pos: int) -> None:
        """NEWFALSE: pushes False, as CPython's unpickler does."""
        self.push(False)

    def op_BINFLOAT(self, pos: int) -> None:
        """BINFLOAT: pushes an 8-byte big-endian IEEE double, as CPython's unpickler does."""
        self.push(struct.unpack(">d", self.src.read(8))[0])

    def op_STRING(self, pos: int) -> None:
        """STRING: CPython's unpickler pushes a quoted, escaped Python 2 str from a text line, decoded with the
        loader's encoding.

        This reader unescapes it the same way (an unquoted line is accepted as is) and decodes UTF-8 as torch
        asks, keeping bytes that are not UTF-8.
        """
        line = self.src.readline(self.limits.max_line)
        if len(line) >= 2 and line[0] == line[-1] and line[:1] in (b"'", b'"'):
            line = line[1:-1]
        try:
            self.push(_py2_str(codecs.escape_decode(line)[0]))
        except ValueError:
            self.fail("bad STRING literal")

    def op_UNICODE(self, pos: int) -> None:
        """UNICODE: CPython's unpickler pushes a str from a raw-unicode-escape text line.

        This reader does the same, replacing undecodable escapes instead of failing.
        """
        line = self.src.readline(self.limits.max_line)
        self.push(line.decode("raw-unicode-escape", "replace"))

    def op_BINSTRING(self, pos: int) -> None:
        """BINSTRING: CPython's unpickler pushes a Python 2 str with a 4-byte signed length, decoded with the
        loader's encoding.

        This reader reads it through `text` (bounded, large ones become a `Blob`) and decodes UTF-8, else keeps
        bytes.
        """
        self.push(_py2_str(self.text(struct.unpack("<i", self.src.read(4))[0], "bytes")))

    def op_SHORT_BINSTRING(self, pos: int) -> None:
        """SHORT_BINSTRING: CPython's unpickler pushes a Python 2 str of up to 255 bytes, decoded with the loader's
        encoding.

        This reader reads it through `text` and decodes UTF-8, else keeps bytes.
        """
        self.push(_py2_str(self.text(self.src.byte(), "bytes")))

    def op_BINBYTES(self, pos: int) -> None:
        """BINBYTES: CPython's unpickler pushes bytes with a 4-byte length.

        This reader reads them through `text`: large values become a `Blob`, embedded pickles/zips are kept for a
        scan.
        """
        self.push(self.text(struct.unpack("<I", self.src.read(4))[0], "bytes"))

    def op_SHORT_BINBYTES(self, pos: int) -> None:
        """SHORT_BINBYTES: CPython's unpickler pushes bytes of up to 255 bytes.

        This reader reads them through `text`.
        """
        self.push(self.text(self.src.byte(), "bytes"))

    def op_BINBYTES8(self, pos: int) -> None:
        """BINBYTES8: CPython's unpickler pushes bytes with an 8-byte length.

        This reader reads them through `text`: a large value is skipped on the stream and becomes a `Blob`.
        """
        self.push(self.text(struct.unpack("<Q", self.src.read(8))[0], "bytes"))

    def op_BYTEARRAY8(self, pos: int) -> None:
        """BYTEARRAY8: CPython's unpickler pushes a bytearray with an 8-byte length.

        This reader reads it through `text` (a bytearray, or a `Blob` when large).
        """
        self.push(self.text(struct.unpack("<Q", self.src.read(8))[0], "bytearray"))

    def op_BINUNICODE(self, pos: int) -> None:
        """BINUNICODE: CPython's unpickler pushes a UTF-8 str with a 4-byte length.

        This reader reads it through `text` (surrogates pass, as pickle does; a large one becomes a `Blob`).
        """
        self.push(self.text(struct.unpack("<I", self.src.read(4))[0], "str"))

    def op_SHORT_BINUNICODE(self, pos: int) -> None:
        """SHORT_BINUNICODE: CPython's unpickler pushes a UTF-8 str of up to 255 bytes.

        This reader reads it through `text`.
        """
        self.push(self.text(self.src.byte(), "str"))

    def op_BINUNICODE8(self, pos: int) -> None:
        """BINUNICODE8: CPython's unpickler pushes a UTF-8 str with an 8-byte length.

        This reader reads it through `text` (large ones become a `Blob`).
        """
        self.push(self.text(struct.unpack("<Q", self.src.read(8))[0], "str"))

    def op_NEXT_BUFFER(self, pos: int) -> None:
        """NEXT_BUFFER: CPython's unpickler pushes the next out-of-band buffer passed to `pickle.loads(buffers=...)`.

        This reader pushes an `Opaque` placeholder: the buffer's bytes are not in the file.
        """
        self.push(Opaque("out-of-band buffer"))

    def op_READONLY_BUFFER(self, pos: int) -> None:
        """READONLY_BUFFER: CPython's unpickler makes the buffer on top of the stack a read-only memoryview.

        This reader leaves it as it is (read-only-ness changes nothing we report), only checking the stack.
        """
        self.top()

    def op_EMPTY_TUPLE(self, pos: int) -> None:
        """EMPTY_TUPLE: pushes (), as CPython's unpickler does."""
        self.push(())

    def op_TUPLE(self, pos: int) -> None:
        """TUPLE: replaces the items since the last MARK by a tuple of them, as CPython's unpickler does."""
        self.push(tuple(self.pop_mark()))

    def op_TUPLE1(self, pos: int) -> None:
        """TUPLE1: replaces the top item by a 1-tuple of it, as CPython's unpickler does."""
        self.push((self.pop(),))

    def op_TUPLE2(self, pos: int) -> None:
        """TUPLE2: replaces the top two items by a 2-tuple, as CPython's unpickler does."""
        b = self.pop()
        a = self.pop()
        self.push((a, b))

    def op_TUPLE3(self, pos: int) -> None:
        """TUPLE3: replaces the top three items by a 3-tuple, as CPython's unpickler does."""
        c = self.pop()
        b = self.pop()
        a = self.pop()
        self.push((a, b, c))

    def op_EMPTY_LIST(self, pos: int) -> None:
        """EMPTY_LIST: pushes [], as CPython's unpickler does."""
        self.push([])

    def op_LIST(self, pos: int) -> None:
        """LIST: replaces the items since the last MARK by a list of them, as CPython's unpickler does."""
        items = self.pop_mark()
        self.push(items)

    def op_EMPTY_DICT(self, pos: int) -> None:
        """EMPTY_DICT: pushes {}, as CPython's unpickler does."""
        self.push({})

    def op_DICT(self, pos: int) -> None:
        """DICT: CPython's unpickler builds a dict from the key/value items since the last MARK (hashing each key).

        This reader does the same with container keys wrapped by `_key`, so no hostile key is hashed; odd counts
        fail.
        """
        items = self.pop_mark()
        if len(items) % 2:
            self.fail("DICT with an odd number of items")
        self.push({_key(items[i]): items[i + 1] for i in range(0, len(items), 2)})

    def op_EMPTY_SET(self, pos: int) -> None:
        """EMPTY_SET: pushes set(), as CPython's unpickler does."""
        self.push(set())

    def op_FROZENSET(self, pos: int) -> None:
        """FROZENSET: CPython's unpickler replaces the items since the last MARK by a frozenset (hashing each).

        This reader does the same with container members wrapped by `_key`.
        """
        items = self.pop_mark()
        self.push(frozenset(_key(x) for x in items))

    def op_APPEND(self, pos: int) -> None:
        """APPEND: CPython's unpickler pops a value and calls `append` on the object below it.

        This reader extends only lists and `Instance` placeholders (see `extend`); anything else is an event.
        """
        value = self.pop()
        self.extend(self.top(), [value], "APPEND", pos)

    def op_APPENDS(self, pos: int) -> None:
        """APPENDS: CPython's unpickler passes the items since the last MARK to the `extend` (or `append`) of the
        object below.

        This reader hands them to `extend`: lists and placeholders take them, anything else is an event.
        """
        items = self.pop_mark()
        self.extend(self.top(), items, "APPENDS", pos)

    def extend(self, target: Any, items: list[Any], how: str, pos: int) -> None:
        """APPEND(S) onto `target` without calling anything: a list is extended, an `Instance` records the items.

        On an imported global or any other value the real loader would call its append/extend: an event instead.
        """
        if isinstance(target, list):
            target.extend(items)
        elif isinstance(target, Instance):
            target.items.extend(items)
        elif isinstance(target, GlobalRef):
            self.event(f"{how} calls append/extend on the imported object {target.qualname}", pos)
        else:
            self.event(f"{how} on a {type(target).__name__} calls its append/extend", pos)

    def op_SETITEM(self, pos: int) -> None:
        """SETITEM: CPython's unpickler pops a value and a key and calls `obj[key] = value` on the object below them.

        This reader hands them to `setitems`: dicts and placeholders take them, anything else is an event.
        """
        value = self.pop()
        key = self.pop()
        self.setitems(self.top(), [key, value], "SETITEM", pos)

    def op_SETITEMS(self, pos: int) -> None:
        """SETITEMS: CPython's unpickler calls `obj[key] = value` for each key/value pair since the last MARK.

        This reader hands them to `setitems`; an odd number of items fails.
        """
        items = self.pop_mark()
        if len(items) % 2:
            self.fail("SETITEMS with an odd number of items")
        self.setitems(self.top(), items, "SETITEMS", pos)

    def setitems(self, target: Any, items: list[Any], how: str, pos: int) -> None:
        """SETITEM(S) of key/value `items` onto `target` without calling anything.

        A dict gets them (non-str keys wrapped by `_key`, never hashed), an `Instance` records them; on an imported
        global or any other value the real loader would call `__setitem__`: an event instead.
        """
        if isinstance(target, dict):
            pairs = iter(items)
            for key, value in zip(pairs, pairs):
                target[key if type(key) is str else _key(key)] = value
        elif isinstance(target, Instance):
            target.setitems.extend((items[i], items[i + 1]) for i in range(0, len(items), 2))
        elif isinstance(target, GlobalRef):
            self.event(f"{how} calls __setitem__ on the imported object {target.qualname}", pos)
        else:
            self.event(f"{how} on a {type(target).__name__} calls its __setitem__", pos)

    def op_ADDITEMS(self, pos: int) -> None:
        """ADDITEMS: CPython's unpickler adds the items since the last MARK to the set below (calling `add` on a non-
        set).

        This reader updates sets (members wrapped by `_key`) and records them on placeholders; anything else is an
        event.
        """
        items = self.pop_mark()
        target = self.top()
        if isinstance(target, set):
            target.update(_key(x) for x in items)
        elif isinstance(target, Instance):
            target.items.extend(items)
        else:
            self.event(f"ADDITEMS on a {type(target).__name__} calls its add()", pos)

    def op_GET(self, pos: int) -> None:
        """GET: pushes the memo entry whose index is a decimal text line, as CPython's unpickler does (`memo_get`)."""
        self.push(self.memo_get(self.parse_int(self.src.readline(self.limits.max_line))))

    def op_BINGET(self, pos: int) -> None:
        """BINGET: pushes the memo entry at a 1-byte index, as CPython's unpickler does (`memo_get`)."""
        self.push(self.memo_get(self.src.byte()))

    def op_LONG_BINGET(self, pos: int) -> None:
        """LONG_BINGET: pushes the memo entry at a 4-byte index, as CPython's unpickler does (`memo_get`)."""
        self.push(self.memo_get(struct.unpack("<I", self.src.read(4))[0]))

    def op_PUT(self, pos: int) -> None:
        """PUT: CPython's unpickler stores the top of the stack in the memo at a decimal text-line index.

        This reader does the same (`memo_put`).
        """
        self.memo_put(self.parse_int(self.src.readline(self.limits.max_line)), self.top())

    def op_BINPUT(self, pos: int) -> None:
        """BINPUT: CPython's unpickler stores the top of the stack in the memo at a 1-byte index.

        This reader does the same (`memo_put`).
        """
        self.memo_put(self.src.byte(), self.top())

    def op_LONG_BINPUT(self, pos: int) -> None:
        """LONG_BINPUT: CPython's unpickler stores the top of the stack in the memo at a 4-byte index.

        This reader does the same (`memo_put`).
        """
        self.memo_put(struct.unpack("<I", self.src.read(4))[0], self.top())

    def op_MEMOIZE(self, pos: int) -> None:
        """MEMOIZE: CPython's unpickler stores the top of the stack at the next memo index (the memo's size).

        This reader does the same (`memo_put`).
        """
        self.memo_put(len(self.memo), self.top())

    def op_GLOBAL(self, pos: int) -> None:
        """GLOBAL: CPython's unpickler imports the module on one text line and pushes its attribute named on the
        next.

        This reader imports nothing: it pushes a `GlobalRef` recorded in `scan.globals` (see `global_ref`).
        """
        module = self.decode_line(self.src.readline(self.limits.max_line))
        name = self.decode_line(self.src.readline(self.limits.max_line))
        self.push(self.global_ref(module, name, "GLOBAL", pos))

    def op_STACK_GLOBAL(self, pos: int) -> None:
        """STACK_GLOBAL: CPython's unpickler pops a name and a module (both must be str) and imports them like
        GLOBAL.

        This reader pushes a `GlobalRef`, or an event and an `Opaque` when either was computed (see `global_ref`).
        """
        name = self.pop()
        module = self.pop()
        self.push(self.global_ref(module, name, "STACK_GLOBAL", pos))

    def op_EXT1(self, pos: int) -> None:
        """EXT1: CPython's unpickler imports the global the copyreg extension registry maps a 1-byte code to.

        This reader records an event (`ext`).
        """
        self.ext(self.src.byte(), pos)

    def op_EXT2(self, pos: int) -> None:
        """EXT2: CPython's unpickler imports the global the copyreg extension registry maps a 2-byte code to.

        This reader records an event (`ext`).
        """
        self.ext(struct.unpack("<H", self.src.read(2))[0], pos)

    def op_EXT4(self, pos: int) -> None:
        """EXT4: CPython's unpickler imports the global the copyreg extension registry maps a 4-byte code to.

        This reader records an event (`ext`).
        """
        self.ext(struct.unpack("<i", self.src.read(4))[0], pos)

    def ext(self, code: int, pos: int) -> None:
        """EXT1/2/4: the loader looks `code` up in its process's copyreg extension registry and imports that global.

        What it names depends on the loading process, not the file: an event and an `Opaque` placeholder.
        """
        self.event(
            f"extension code {code} names a global through the loader's copyreg registry, "
            "which cannot be known from the file",
            pos,
        )
        self.push(Opaque(f"extension {code}"))

    def op_REDUCE(self, pos: int) -> None:
        """REDUCE: CPython's unpickler pops args and calls the callable below them, `func(*args)`: the opcode that
        runs code.

        This reader calls nothing: `reduce` records the call and pushes a `TensorMeta`, `PickledDict` or
        `Instance`.
        """
        args = self.pop()
        func = self.pop()
        self.push(self.call(func, args, "REDUCE", pos))

    def op_NEWOBJ(self, pos: int) -> None:
        """NEWOBJ: CPython's unpickler pops args and a class and creates `cls.__new__(cls, *args)`.

        This reader records the class as instantiated and pushes an `Instance` placeholder (`call`).
        """
        args = self.pop()
        cls = self.pop()
        self.push(self.call(cls, args, "NEWOBJ", pos))

    def op_NEWOBJ_EX(self, pos: int) -> None:
        """NEWOBJ_EX: CPython's unpickler pops kwargs, args and a class and creates `cls.__new__(cls, *args,
        **kwargs)`.

        This reader records the class as instantiated and pushes an `Instance` whose args are (args, kwargs).
        """
        kwargs = self.pop()
        args = self.pop()
        cls = self.pop()
        self.push(self.call(cls, (args, kwargs), "NEWOBJ_EX", pos))

    def op_OBJ(self, pos: int) -> None:
        """OBJ: CPython's unpickler takes a class and its arguments from the items since the last MARK and calls
        `cls(*args)` (`cls.__new__(cls)` without args).

        This reader records the class as called and pushes an `Instance`; an OBJ without a class fails.
        """
        items = self.pop_mark()
        if not items:
            self.fail("OBJ without a class")
        self.push(self.call(items[0], tuple(items[1:]), "OBJ", pos))

    def op_INST(self, pos: int) -> None:
        """INST: CPython's unpickler imports a class named on two text lines and calls it with the items since the
        last MARK (as OBJ).

        This reader records the global (`global_ref`) and the call, and pushes an `Instance`.
        """
        module = self.decode_line(self.src.readline(self.limits.max_line))
        name = self.decode_line(self.src.readline(self.limits.max_line))
        items = self.pop_mark()
        cls = self.global_ref(module, name, "INST", pos)
        self.push(self.call(cls, tuple(items), "INST", pos))

    def op_BUILD(self, pos: int) -> None:
        """BUILD: CPython's unpickler pops a state and calls the object's `__setstate__(state)`, or sets its
        `__dict__`/slots from it.

        This reader stores the state on an `Instance`/`PickledDict`; events when the state sets a Python dunder or
        the object is an imported global; a joblib array header also passes over the array data written after it.
        """
        state = self.pop()
        target = self.top()
        parts = state if isinstance(state, tuple) and len(state) == 2 else (state,)
        dunders = [k for part in parts if isinstance(part, dict) for k in part if k in _PYTHON_DUNDERS]
        if dunders:
            self.event(
                f"BUILD sets {', '.join(sorted(dunders)[:4])} on {short(target)}: overriding a dunder makes "
                "Python run code the pickle chose",
                pos,
            )
        if isinstance(target, Instance) and target.qualname == "joblib.numpy_pickle.NumpyArrayWrapper":
            self.stack[-1] = self.joblib_array(state, pos)
        elif isinstance(target, (Instance, PickledDict)):
            target.state = state
        elif isinstance(target, GlobalRef):
            self.event(f"BUILD sets attributes on the imported object {target.qualname}", pos)
        # BUILD on a tensor sets its Python attributes (torch's own, checked above for dunders); on a plain
        # list/tuple/str it would make the real loader fail. Nothing runs either way.

    def joblib_array(self, state: Any, pos: int) -> Any:
        """joblib writes an array's bytes (or, for object arrays, a nested pickle) right after its BUILD."""
        if self.frame_end is not None and self.src.tell() >= self.frame_end:
            self.frame_ends(self.src.tell())  # joblib ends the frame at the BUILD; the bytes are outside frames
        if not isinstance(state, dict) or not isinstance(state.get("dtype"), Instance):
            self.fail("joblib array header without a dtype")
        spec = state["dtype"].args[0] if isinstance(state["dtype"].args, tuple) and state["dtype"].args else None
        shape = state.get("shape")
        if not isinstance(spec, str) or not isinstance(shape, tuple) or not all(type(d) is int for d in shape):
            self.fail("joblib array header with an unreadable dtype or shape")
        if spec.startswith("O"):
            inner = _Machine(self.src, self.persistent_load, self.limits)
            inner.proto = self.proto
            try:
                inner.run()
            finally:
                self.merge(inner.scan)
            return Opaque("numpy object array (nested pickle)")
        if "numpy_array_alignment_bytes" in state:
            self.src.skip(self.src.byte())
        count = 1
        for d in shape:
            count *= d
        digits = spec.lstrip("<>|=").lstrip("biufcmMSUV")
        size = int(digits) if digits.isdigit() else 1
        self.src.skip(count * size * (4 if "U" in spec else 1))
        return Opaque(f"numpy array {shape} {spec}")

    def merge(self, other: PickleScan) -> None:
        """Fold a nested pickle's globals, calls and events into this scan."""
        for pair, count in other.globals.items():
            self.scan.globals[pair] = self.scan.globals.get(pair, 0) + count
        for pair, use in other.uses.items():
            if use is Use.CALLED or pair not in self.scan.uses or self.scan.uses[pair] is Use.NAMED:
                self.scan.uses[pair] = use
        for pair, calls in other.calls.items():
            self.scan.calls.setdefault(pair, []).extend(calls[:3])
        self.scan.events.extend(other.events[:100])
        self.scan.opcodes |= other.opcodes

    def op_PERSID(self, pos: int) -> None:
        """PERSID: CPython's unpickler pushes `persistent_load(id)` for an id on a text line (torch's hook for
        storages).

        This reader passes the id to the `persistent_load` it was given, which returns a placeholder (a
        `StorageRef` for a storage).
        """
        self.push(self.persistent_load(self.decode_line(self.src.readline(self.limits.max_line))))

    def op_BINPERSID(self, pos: int) -> None:
        """BINPERSID: CPython's unpickler pops an id object and pushes `persistent_load(id)` (how torch.save names
        storages).

        This reader passes the id to the `persistent_load` it was given, which turns storage ids into
        `StorageRef`s.
        """
        self.push(self.persistent_load(self.pop()))


def scan_pickle(
    src: Source,
    persistent_load: Optional[Callable[[Any], Any]] = None,
    limits: Limits = Limits(),
) -> PickleScan:
    """Interpret one pickle from `src` into placeholders; a malformed or over-limit pickle sets `error`."""
    machine = _Machine(src, persistent_load or (lambda pid: Opaque(f"persistent id {short(pid)}")), limits)
    try:
        machine.scan.value = machine.run()
        machine.scan.nested = machine.nested
    except PickleParseError as exc:
        machine.scan.error = str(exc)
    except (RecursionError, MemoryError, OverflowError, ValueError, TypeError, struct.error) as exc:
        machine.scan.error = f"cannot interpret the pickle: {type(exc).__name__}: {exc}"[:300]
    return machine.scan
