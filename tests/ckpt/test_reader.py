"""The safe reader on real checkpoints: formats, tensor metadata, nesting, without executing anything."""

from __future__ import annotations

import io
import tarfile

import ckpt_builders as b
import pytest
import torch

from torchdoctor.ckpt import CheckpointError, read_checkpoint
from torchdoctor.ckpt.policy import Verdict


def by_path(info):
    return {"/".join(e.path): e.tensor for e in info.tensors}


def test_plain_state_dict_metadata_matches_torch(files):
    info = read_checkpoint(files["plain"])
    assert info.format == "zip" and info.kind == "state_dict"
    real = torch.load(files["plain"], weights_only=True)
    tensors = by_path(info)
    assert set(tensors) == set(real)
    for key, t in real.items():
        meta = tensors[key]
        assert meta.shape == tuple(t.shape) and meta.stride == t.stride()
        assert meta.dtype == str(t.dtype).replace("torch.", "")
        assert meta.device == "cpu" and meta.nbytes == t.numel() * t.element_size()
    assert info.archive.details["byteorder"] == "little"
    assert all(g.verdict is Verdict.ALLOWED for g in info.globals)


@pytest.mark.parametrize("name", ["legacy", "legacy-protocol4", "protocol4"])
def test_legacy_and_protocol4_files_read_like_the_zip(files, name):
    info = read_checkpoint(files[name])
    assert info.format == ("zip" if name == "protocol4" else "legacy")
    ref = by_path(read_checkpoint(files["plain"]))
    got = by_path(info)
    assert {k: (t.shape, t.dtype) for k, t in got.items()} == {k: (t.shape, t.dtype) for k, t in ref.items()}
    if name != "protocol4":
        assert set(info.archive.locators) == {t.storage.key for t in got.values()}


def test_nested_state_dicts_are_found_everywhere(files):
    lightning = read_checkpoint(files["lightning"])
    assert [sd.path for sd in lightning.state_dicts] == [("state_dict",)]
    assert any(e.in_optimizer for e in lightning.tensors)
    top = {t["key"]: t for t in lightning.facts()["top_level"]}
    assert top["epoch"]["value"] == 3 and top["global_step"]["value"] == 120

    in_list = read_checkpoint(files["list"])
    assert sorted(sd.path for sd in in_list.state_dicts) == [("0",), ("1", "ema")]

    training = read_checkpoint(files["training"])
    assert [sd.path for sd in training.state_dicts] == [("model",)]
    assert training.kind == "training checkpoint"
    assert any(e.path[:2] == ("optimizer", "state") and e.in_optimizer for e in training.tensors)


def test_whole_pickled_module_is_seen_with_its_state_dict_keys(files):
    info = read_checkpoint(files["whole-module"])
    assert info.kind == "pickled module"
    assert [(o.qualname, o.kind) for o in info.objects] == [("ckpt_builders.Net", "module")]
    (sd,) = info.state_dicts
    assert set(sd.tensors) == set(b.net().state_dict())
    verdicts = {g.qualname: g.verdict for g in info.globals}
    assert verdicts["ckpt_builders.Net"] is Verdict.UNKNOWN
    assert verdicts["torch.nn.modules.linear.Linear"] is Verdict.UNKNOWN  # instantiated by NEWOBJ: needs code


def test_torchscript_archive_lists_its_tensors(files):
    info = read_checkpoint(files["torchscript"])
    assert info.format == "torchscript" and info.kind == "torchscript module"
    assert sorted(by_path(info)) == ["constants/0", "fc/bias", "fc/weight"]
    assert info.problems == []
    assert not [g for g in info.globals if g.verdict is Verdict.DANGEROUS]


def test_safetensors_header_only(files):
    info = read_checkpoint(files["safetensors"])
    assert info.format == "safetensors" and info.kind == "state_dict"
    assert by_path(info)["fc.weight"].shape == (3, 8)
    assert info.archive.details["metadata"] == {"format": "pt"}
    assert info.globals == []


def test_plain_pickle_and_tar(files, tmp_path):
    info = read_checkpoint(files["plain-pickle"])
    assert info.format == "pickle" and info.archive.root == {"lr": 0.1, "names": ["a", "b"]}
    tar_path = tmp_path / "old.tar"
    with tarfile.open(tar_path, "w") as tar:
        for name, obj in (("sys_info", {"little_endian": True}), ("pickle", {"w": 1})):
            data = b.dumps(obj)
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
    old = read_checkpoint(str(tar_path))
    assert old.format == "legacy-tar" and old.archive.root == {"w": 1}


def test_views_and_shared_storages(files):
    info = read_checkpoint(files["view"])
    small = by_path(info)["small"]
    assert small.shape == (10,) and small.storage.numel == 1_000_000 and small.byte_span() == (0, 40)
    tied = by_path(read_checkpoint(files["tied"]))
    assert tied["a"].storage is tied["b"].storage and tied["b"].storage_offset == 500_000


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no such file"),
        (b"", "empty file"),
        (b"just some text\n", "not a PyTorch checkpoint"),
        (b"\x93NUMPY\x01\x00", "corrupt .npy header"),
        (b"PK\x03\x04garbage", "truncated or corrupt zip"),
        (b"\x80\x02\x95garbage", "corrupt pickle"),
    ],
)
def test_unreadable_files_raise_the_readers_error(tmp_path, content, message):
    path = tmp_path / "f.pt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(CheckpointError, match=message):
        read_checkpoint(str(path))
    with pytest.raises(CheckpointError, match="directory"):
        read_checkpoint(str(tmp_path))


def test_truncated_storage_is_a_problem_not_a_crash(files, tmp_path):
    data = open(files["legacy"], "rb").read()
    cut = tmp_path / "cut.pt"
    cut.write_bytes(data[:-10])
    info = read_checkpoint(str(cut))
    assert any("truncated" in p for p in info.problems)
