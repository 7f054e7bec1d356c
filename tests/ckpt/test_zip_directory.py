"""The reader's own central-directory parser lists exactly what zipfile lists, or leaves the archive to zipfile."""

from __future__ import annotations

import io
import zipfile

import hostile_corpus
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz import mutate, mutation

from torchdoctor.ckpt.reader import _plain_central_directory, _zip_infos

pytestmark = pytest.mark.skipif(
    zipfile.ZipInfo.__slots__
    != (
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
    ),
    reason="this Python's zipfile is used as it is",
)


def _fields(infos):
    return [{name: getattr(x, name) for name in zipfile.ZipInfo.__slots__} for x in infos]


def assert_same_as_zipfile(data: bytes) -> bool:
    """True when the fast parser read the directory itself (then its records equal zipfile's)."""
    ours = _plain_central_directory(io.BytesIO(data), len(data))
    try:
        theirs = zipfile.ZipFile(io.BytesIO(data)).infolist()
    except Exception as exc:  # noqa: BLE001 - whatever zipfile raises, the fast parser must have declined
        assert ours is None, exc
        with pytest.raises(type(exc)):
            _zip_infos(io.BytesIO(data), len(data))
        return False
    assert _fields(_zip_infos(io.BytesIO(data), len(data))) == _fields(theirs)
    return ours is not None


@pytest.fixture(scope="module")
def zips(files):
    out = [
        open(files[name], "rb").read()
        for name in ("plain", "training", "whole-module", "deflated-nan", "torchscript", "lightning")
    ]
    out += [data for data, _ in hostile_corpus.containers("/nonexistent/canary").values() if data[:2] == b"PK"]
    out.append(b"prepended" + out[0])  # offsets shift by the bytes before the archive
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:  # an archive comment, a member comment, an extra field, a cp437 name
        z.comment = b"hello"
        info = zipfile.ZipInfo("a/b\x84.txt")
        info.comment = b"member"
        z.writestr(info, b"x")
        info = zipfile.ZipInfo("c")
        info.extra = b"\xfe\xca\x00\x00"
        z.writestr(info, b"y")
    out.append(buf.getvalue())
    for comment in (b"PK\x05\x06" + bytes(16) + b"\x01\x00", b""):  # a comment ending like an end record
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            z.comment = comment
            z.writestr("aXb", b"z")
        out.append(buf.getvalue().replace(b"aXb", b"a\0b"))  # and a NUL in a name (zipfile cuts it there)
    return out


def test_torch_archives_are_parsed_directly_and_identically(zips):
    fast = [assert_same_as_zipfile(data) for data in zips]
    assert all(fast[:6]) and fast[-4], "torch.save/jit.save archives take the fast path"
    assert not any(fast[-3:]), "a comment, an extra field or a NUL in a name leaves the archive to zipfile"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 100), steps=st.lists(mutation, min_size=1, max_size=3), tail=st.booleans())
def test_mutated_archives_list_the_same_or_fail_the_same(zips, which, steps, tail):
    data = zips[which % len(zips)]
    if tail:  # aim the mutations at the central directory and the end records
        head, rest = data[:-300], data[-300:]
        data = head + mutate(rest, steps)
    else:
        data = mutate(data, steps)
    assert_same_as_zipfile(data)
