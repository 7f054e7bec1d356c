"""Mutated real checkpoints and pickles: the reader returns a result or raises its own error, nothing else."""

from __future__ import annotations

import ckpt_builders as b
import hostile_corpus
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchdoctor import registry
from torchdoctor.ckpt import CheckpointError, read_checkpoint
from torchdoctor.ckpt.values import scan_values

SEEDS = [
    "plain",
    "legacy",
    "protocol4",
    "torchscript",
    "safetensors",
    "whole-module",
    "plain-pickle",
    "deflated-nan",
    "legacy-nan",
]


class Corpus(list):
    """The seed files (short repr, so hypothesis reports stay readable)."""

    def __repr__(self) -> str:
        return f"<{len(self)} seed files>"


@pytest.fixture(scope="module")
def seeds(files):
    corpus = Corpus(open(files[name], "rb").read() for name in SEEDS)
    corpus += [b.dumps({"a": [1, 2.5, "x", (None, True)], "b": b"bytes"}, p) for p in (0, 1, 2, 4, 5)]
    corpus += list(b.opcode_payloads("/nonexistent/canary").values())
    for family in (hostile_corpus.pickles, hostile_corpus.containers):
        corpus += [data for data, _ in family("/nonexistent/canary").values()]
    return corpus


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 20), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0, 1 << 20), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 20), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 20), st.integers(1, 16)),
)


def mutate(data: bytes, steps) -> bytes:
    buf = bytearray(data)
    for kind, where, arg in steps:
        if not buf:
            break
        i = where % len(buf)
        if kind == "flip":
            buf[i] ^= arg
        elif kind == "cut":
            del buf[i:]
        elif kind == "insert":
            buf[i:i] = arg
        else:
            del buf[i : i + arg]
    return bytes(buf)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 100), steps=st.lists(mutation, min_size=1, max_size=4))
def test_mutated_files_never_raise_anything_but_the_readers_error(seeds, tmp_path, which, steps):
    path = tmp_path / "fuzz.bin"
    path.write_bytes(mutate(seeds[which % len(seeds)], steps))
    try:
        info = read_checkpoint(str(path))
    except CheckpointError:
        return
    info.facts()
    scan_values(info)
    checks = registry.all_checks(registry.Scope.CHECKPOINT)
    for finding in registry.run_fact_checks(checks, registry.Scope.CHECKPOINT, info):
        assert "failed internally" not in finding.message, finding.message


def _deflated_zip(member: bytes) -> bytes:
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", member)
    return buf.getvalue()


@pytest.mark.parametrize(
    "name, data",
    [
        ("zip-bomb-of-opcodes", lambda: _deflated_zip(b"\x80\x02" + b"N0" * (3 << 20) + b"N.")),
        ("zip-bomb-of-zeros", lambda: _deflated_zip(b"\x00" * (64 << 20))),
        ("huge-declared-binbytes", b"\x80\x04\x8e" + (1 << 62).to_bytes(8, "little") + b"."),
        ("huge-frame", b"\x80\x04\x95" + (1 << 62).to_bytes(8, "little") + b"N."),
        ("deep-lists", b"\x80\x02" + b"]" * 200_000 + b"a" * 199_999 + b"."),
        ("deep-protocol0-text", b"(" * 90_000 + b"l" * 90_000 + b"."),
        ("npy-huge-header", b"\x93NUMPY\x02\x00" + (1 << 31).to_bytes(4, "little") + b"{"),
        ("stacked-truncated-second", b"\x80\x02K\x01.\x80\x02cposix\nsys"),
    ],
    ids=lambda v: v if isinstance(v, str) else "data",
)
def test_bombs_and_huge_lengths_end_fast_with_a_finding_or_the_readers_error(tmp_path, name, data):
    import time

    path = tmp_path / "bomb.bin"
    path.write_bytes(data() if callable(data) else data)
    start = time.process_time()  # CPU time: a loaded machine (a busy CI runner) must not fail it
    try:
        info = read_checkpoint(str(path))
    except CheckpointError as exc:
        assert "\n" not in str(exc)
    else:
        info.facts()
        checks = registry.all_checks(registry.Scope.CHECKPOINT)
        names = {f.name for f in registry.run_fact_checks(checks, registry.Scope.CHECKPOINT, info)}
        assert names & {"checkpoint-unreadable", "unsafe-pickle"} or not info.problems, names
    assert time.process_time() - start < 10
