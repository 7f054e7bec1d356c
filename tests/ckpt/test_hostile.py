"""Hostile checkpoints: code-execution payloads are reported and never run; bombs end in bounded time."""

from __future__ import annotations

import time

import ckpt_builders as b
import pytest
import torch

from torchdoctor.ckpt import CheckpointError, read_checkpoint
from torchdoctor.ckpt.api import check_checkpoint

PAYLOAD_NAMES = ["os.system", "builtins.exec", "builtins.eval", "subprocess.call", "collect_env.run"]


def unsafe(path):
    report = check_checkpoint(path)
    return [f for f in report.findings if f.name == "unsafe-pickle"], report


def test_payloads_are_real(canary):
    """The payloads do run under pickle.load (in a throwaway process), so the tests below can fail."""
    assert b.canary_runs(b.dumps(b.reduce_payloads(canary)["os.system"]), canary)
    assert b.canary_runs(b.opcode_payloads(canary)["getattr-chain"], canary)
    assert b.canary_runs(b.opcode_payloads(canary)["stack-global-memo"], canary)


@pytest.mark.parametrize("name", PAYLOAD_NAMES)
@pytest.mark.parametrize("protocol", [2, 4])
def test_reduce_payload_in_a_raw_pickle(tmp_path, canary, name, protocol):
    path = tmp_path / "evil.pkl"
    path.write_bytes(b.dumps(b.reduce_payloads(canary)[name], protocol))
    found, _ = unsafe(str(path))
    assert found and "calls" in found[0].message and canary in found[0].fix.title


@pytest.mark.parametrize("name", PAYLOAD_NAMES[:3])
def test_reduce_payload_inside_a_torch_zip_and_legacy_file(tmp_path, canary, name):
    obj = {"weight": torch.ones(2), "extra": b.reduce_payloads(canary)[name]}
    for legacy in (False, True):
        path = b.save(obj, tmp_path / f"evil_{legacy}.pt", _use_new_zipfile_serialization=not legacy)
        found, report = unsafe(path)
        assert found, path
        assert report.infos[0].format == ("legacy" if legacy else "zip")
        assert report.structure["tensors"]["count"] == 1


@pytest.mark.parametrize("name", list(b.opcode_payloads("x")))
def test_hand_written_opcode_payloads(tmp_path, canary, name):
    payload = b.opcode_payloads(canary)[name]
    raw = tmp_path / "evil.bin"
    raw.write_bytes(payload)
    assert unsafe(str(raw))[0]
    clean = b.save({"w": torch.ones(2)}, tmp_path / "clean.pt")
    injected = b.replace_data_pkl(clean, str(tmp_path / "injected.pt"), payload)
    assert unsafe(injected)[0]


@pytest.mark.parametrize("name", list(b.structural_payloads()))
def test_opcode_tricks_on_harmless_names(tmp_path, name):
    path = tmp_path / "trick.pkl"
    path.write_bytes(b.structural_payloads()[name])
    found, _ = unsafe(str(path))
    assert found and "byte" in found[0].message


def test_payload_stacked_after_the_legacy_magic_or_before_it(tmp_path, canary, files):
    legacy = open(files["legacy"], "rb").read()
    evil = b.dumps(b.reduce_payloads(canary)["os.system"])
    before = tmp_path / "magic_bypass.pt"
    before.write_bytes(evil + legacy)
    assert unsafe(str(before))[0]
    after = tmp_path / "trailing.pkl"
    after.write_bytes(b.dumps({"ok": 1}) + evil)
    assert unsafe(str(after))[0]


def test_extra_pickle_record_in_a_zip_is_scanned(tmp_path, canary):
    import zipfile

    path = b.save({"w": torch.ones(2)}, tmp_path / "extra.pt")
    with zipfile.ZipFile(path, "a") as z:
        z.writestr("extra/evil.pkl", b.dumps(b.reduce_payloads(canary)["os.system"]))
    found, _ = unsafe(path)
    assert found and "evil.pkl" in found[0].message


def test_a_dangerous_global_after_many_benign_ones_is_not_missed(tmp_path):
    benign = b"ccollections\nOrderedDict\n0" * 120_000
    path = tmp_path / "crowded.pkl"
    path.write_bytes(b"\x80\x02" + benign + b"cposix\nsystem\n0N.")
    found, report = unsafe(str(path))
    assert found and "posix.system" in found[0].message
    assert {g["name"]: g["count"] for g in report.structure["globals"]}["collections.OrderedDict"] == 120_000


def test_clean_files_have_no_unsafe_findings(files):
    for name in ("plain", "training", "whole-module", "legacy", "torchscript", "lightning", "protocol4"):
        assert unsafe(files[name])[0] == [], name


@pytest.mark.parametrize(
    "payload, expect",
    [
        (b.billion_laughs(), None),
        (b.deep_nesting(20_000), "nested more than"),
        (b"\x80\x02" + b"(" * 150_000 + b".", "nested MARKs"),
        (b"\x80\x02\x8d" + (1 << 60).to_bytes(8, "little") + b".", "truncated"),
        (b"\x80\x02\x8b" + (1 << 30).to_bytes(4, "little") + b".", "implausible"),
        (b"\x80\x02]r\xff\xff\xff\xff" + b"j\x00\x00\x00\x00.", "read before it is written"),
        (b"\x80\x02" + b"N" * 10 + b"\xff.", "invalid pickle opcode"),
    ],
    ids=["billion-laughs", "deep-nesting", "marks", "huge-length", "huge-long", "memo-miss", "bad-opcode"],
)
def test_bombs_and_garbage_end_quickly_with_the_readers_error_or_a_problem(tmp_path, payload, expect):
    path = tmp_path / "bomb.pkl"
    path.write_bytes(payload)
    start = time.perf_counter()
    try:
        info = read_checkpoint(str(path))
        message = " ".join(info.problems)
        info.facts()
    except CheckpointError as exc:
        message = str(exc)
    assert time.perf_counter() - start < 20
    if expect:
        assert expect in message


def test_too_many_opcodes_is_bounded(tmp_path):
    from torchdoctor.ckpt.unpickler import Limits

    path = tmp_path / "long.pkl"
    path.write_bytes(b"\x80\x02]" + b"Na" * 50_000 + b".")
    with pytest.raises(CheckpointError, match="opcodes"):
        read_checkpoint(str(path), Limits(max_opcodes=10_000, opcodes_per_byte=0))
    assert len(read_checkpoint(str(path)).archive.root) == 50_000
    memo = tmp_path / "memo.pkl"
    memo.write_bytes(b"\x80\x02N" + b"".join(b"r" + i.to_bytes(4, "little") for i in range(2000)) + b".")
    with pytest.raises(CheckpointError, match="memo entries"):
        read_checkpoint(str(memo), Limits(max_memo=1000))


def test_a_zip_naming_data_pkl_twice_is_ambiguous_and_unsafe(tmp_path):
    """Zip readers disagree on which duplicate they load: the ambiguity itself is unsafe, whatever each holds."""
    import hostile_corpus

    data = hostile_corpus._torch_zip(b.dumps({"w": 2}), duplicate_first=b.dumps({"w": 1}))
    path = tmp_path / "twice.pt"
    path.write_bytes(data)
    found, _ = unsafe(str(path))
    assert found and "twice" in found[0].message


def test_numpy_files_object_arrays_are_scanned_and_plain_arrays_are_clean(tmp_path, canary):
    import io
    import zipfile

    import numpy as np

    plain = tmp_path / "ints.npz"
    np.savez(plain, a=np.arange(3), b=np.ones(2))
    assert unsafe(str(plain))[0] == []
    objects = tmp_path / "objects.npz"
    np.savez(objects, a=np.array([{"k": 1}], dtype=object))
    assert unsafe(str(objects))[0] == []
    evil = io.BytesIO()
    np.save(evil, np.array([b.reduce_payloads(canary)["os.system"]], dtype=object), allow_pickle=True)
    path = tmp_path / "evil.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.npy", evil.getvalue())
    assert unsafe(str(path))[0]
