"""The unpickler's inline opcodes behave exactly like its opcode methods.

A stream that yields one byte per read keeps the buffer too short for any inline opcode, so every opcode goes
through its method; the same pickle read in one buffer takes the inline paths. Both scans must agree on
everything but which weights_only opcodes were recorded: value, globals, uses, calls, events, error.
"""

from __future__ import annotations

import io
import zipfile

import ckpt_builders as b
import hostile_corpus
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz import mutate, mutation

from torchdoctor.ckpt.objects import Blob, GlobalRef, Instance, Key, Opaque, StorageRef, TensorMeta
from torchdoctor.ckpt.reader import _storage_from_pid
from torchdoctor.ckpt.unpickler import WEIGHTS_ONLY_OPCODES, Limits, PickleScan, Source, scan_pickle

TIGHT = Limits(max_opcodes=400, opcodes_per_byte=0, max_memo=40, max_marks=6, max_inline_bytes=12, max_total_inline=300)


class OneByte(io.RawIOBase):
    """A stream that returns at most one byte per read."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        chunk = self.data[self.pos : self.pos + 1]
        self.pos += len(chunk)
        return chunk


def _load(pid):
    return _storage_from_pid(pid, 5) or Opaque("pid")


def canonical(scan: PickleScan) -> dict:
    """Everything a scan says, as plain data (shared and cyclic values by reference, big graphs cut)."""
    seen: dict[int, int] = {}
    budget = [20_000]

    def c(v, depth=0):
        budget[0] -= 1
        if budget[0] < 0 or depth > 50:
            return "<cut>"
        if isinstance(v, (str, bytes, bytearray, int, float)) or v is None:
            return (type(v).__name__, repr(v))
        if id(v) in seen:
            return ("ref", seen[id(v)])
        seen[id(v)] = len(seen)
        if isinstance(v, TensorMeta):
            return (
                "T",
                v.dtype,
                v.shape,
                v.stride,
                c(v.storage, depth + 1),
                v.storage_offset,
                v.requires_grad,
                v.is_parameter,
                v.kind,
            )
        if isinstance(v, StorageRef):
            return ("S", v.key, v.dtype, v.itemsize, v.location, v.numel)
        if isinstance(v, GlobalRef):
            return ("G", v.module, v.name)
        if isinstance(v, Instance):
            return (
                "I",
                v.how,
                c(v.callable, depth + 1),
                c(v.args, depth + 1),
                c(v.state, depth + 1),
                [c(x, depth + 1) for x in v.items],
                [(c(k, depth + 1), c(x, depth + 1)) for k, x in v.setitems],
            )
        if isinstance(v, dict):
            return (
                type(v).__name__,
                getattr(v, "qualname", None),
                c(getattr(v, "state", None), depth + 1),
                [(c(k, depth + 1), c(x, depth + 1)) for k, x in v.items()],
            )
        if isinstance(v, (list, tuple)):
            return (type(v).__name__, [c(x, depth + 1) for x in v])
        if isinstance(v, (set, frozenset)):
            return (type(v).__name__, sorted(repr(c(x, depth + 1)) for x in v))
        if isinstance(v, Key):
            return ("K", c(v.value, depth + 1))
        if isinstance(v, (Blob, Opaque)):
            return (type(v).__name__, repr(v))
        return ("?", type(v).__name__)

    return {
        "value": c(scan.value),
        "error": scan.error,
        "protocol": scan.protocol,
        "globals": scan.globals,
        "uses": scan.uses,
        "calls": {k: [(how, repr(c(a))) for how, a in v] for k, v in scan.calls.items()},
        "events": [(e.what, e.pos) for e in scan.events],
        "nested": scan.nested,
        "opcodes": scan.opcodes - WEIGHTS_ONLY_OPCODES,
    }


def assert_same_as_methods(data: bytes, limits: Limits = Limits()) -> PickleScan:
    """Compare the two ways, also with bytes after the pickle (an opcode runs inline only when 5 bytes follow)."""
    for padded in (data, data + bytes(8)):
        inline = scan_pickle(Source(io.BytesIO(padded), len(padded), len(padded)), _load, limits)
        methods = scan_pickle(Source(OneByte(padded), len(padded), len(padded)), _load, limits)
        assert canonical(inline) == canonical(methods)
    return inline


def _data_pkl(obj, **kwargs) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, **kwargs)
    with zipfile.ZipFile(buf) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))


@pytest.fixture(scope="module")
def pickles(files):
    """Real torch pickles (more than 256 memo entries among them), odd opcodes, hostile and bomb pickles."""
    out = [
        _data_pkl({f"layers.{i}.weight": torch.zeros(2, 3)[:, : i % 3] for i in range(200)}),
        _data_pkl(
            {
                "w": torch.ones(2, 2, 2).requires_grad_(),
                "p": torch.nn.Parameter(torch.ones(3)),
                "big": list(range(70_000, 70_300)),
                "neg": -5,
                "i2": 40_000,
                "none": None,
                "t": True,
            }
        ),
    ]
    for name in ("plain", "training", "whole-module", "lightning", "list", "protocol4"):
        with zipfile.ZipFile(files[name]) as z:
            out.append(z.read(next(n for n in z.namelist() if n.endswith("/data.pkl"))))
    out += [b.dumps({"a": [1, 2.5, "x", (None, True), "é" * 20], "b": b"bytes", (1, 2): {3}}, p) for p in range(6)]
    out += list(b.opcode_payloads("/nonexistent/canary").values()) + list(b.structural_payloads().values())
    for family in (hostile_corpus.pickles, hostile_corpus.containers):
        out += [data for data, _ in family("/nonexistent/canary").values() if data[:2] != b"PK"]
    out += [b.billion_laughs(6, 3), b.deep_nesting(40)]
    return out


def test_inline_opcodes_match_the_opcode_methods_on_real_and_hostile_pickles(pickles):
    for data in pickles:
        assert_same_as_methods(data)
        assert_same_as_methods(data, TIGHT)  # limits hit inside inline opcodes: the methods report them
    scan = assert_same_as_methods(pickles[0])
    assert len(scan.value) == 200 and isinstance(scan.value["layers.199.weight"], TensorMeta)
    # both paths share REDUCE's bookkeeping: the first three calls are kept, later ones are not recorded again
    calls = scan.calls[("torch._utils", "_rebuild_tensor_v2")]
    assert [(how, args[0].key) for how, args in calls] == [("REDUCE", "0"), ("REDUCE", "1"), ("REDUCE", "2")]
    assert str(scan.uses[("collections", "OrderedDict")]) == "called"


def test_shared_objects_and_limits_inside_inline_opcodes():
    # LONG_BINGET of an unwritten entry, a memo put over the limit, SETITEMS on a list, a huge BINUNICODE length
    cases = [
        b"\x80\x02]r\x05\x00\x00\x00j\x05\x00\x00\x00j\x06\x00\x00\x00.",
        b"\x80\x02" + b"".join(b"N" + b"r" + i.to_bytes(4, "little") for i in range(60)) + b"N.",
        b"\x80\x02](K\x01K\x02u.",
        b"\x80\x02X\xff\xff\xff\x7fabc.",
        b"\x80\x02(((((((N.",
        b"\x80\x02}(X\x01\x00\x00\x00aK\x01X\x01\x00\x00\x00bu.",
        b"\x80\x02N\x85\x86\x87.",
        b"\x80\x02(" + (b"X\x0b\x00\x00\x00" + b"a" * 11 + b"\x8c\x0b" + b"b" * 11) * 14 + b"l.",
    ]
    for data in cases:
        assert_same_as_methods(data)
        assert_same_as_methods(data, TIGHT)
    assert "memo entry 6" in assert_same_as_methods(cases[0]).error
    assert "memo entries" in assert_same_as_methods(cases[1], TIGHT).error
    assert "more than 6 nested MARKs" in assert_same_as_methods(cases[4], TIGHT).error
    assert "more than 300 bytes of strings" in assert_same_as_methods(cases[-1], TIGHT).error


def test_the_opcode_budget_holds_exactly_whether_or_not_opcodes_are_counted():
    # PROTO, N0 * k, N, STOP: 2k + 3 opcodes in 2k + 4 bytes; TIGHT allows 400 opcodes
    for k, error in ((198, None), (199, "more than 400 pickle opcodes")):
        data = b"\x80\x02" + b"N0" * k + b"N."
        for stream in (io.BytesIO(data), OneByte(data)):
            assert scan_pickle(Source(stream, len(data), len(data)), _load, TIGHT).error == error
        assert assert_same_as_methods(data, TIGHT).error == error


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 200), steps=st.lists(mutation, min_size=1, max_size=4), tight=st.booleans())
def test_mutated_pickles_read_the_same_inline_and_through_the_methods(pickles, which, steps, tight):
    assert_same_as_methods(mutate(pickles[which % len(pickles)], steps), TIGHT if tight else Limits())
