"""Each checkpoint check fires on the real file it is about and stays quiet on clean ones."""

from __future__ import annotations

import pytest

from torchdoctor.ckpt.api import check_checkpoint

ALL_CLEAN = ["plain", "training-plain"]


def codes(path, **kwargs):
    return {f.name: f for f in check_checkpoint(path, **kwargs).findings}


@pytest.mark.parametrize("name", ALL_CLEAN)
def test_clean_zip_state_dicts_have_no_findings(files, name):
    assert codes(files[name], scan_values=True) == {}


def test_needs_code_to_load_lists_numpy_and_argparse(files):
    found = codes(files["training"])
    f = found["needs-code-to-load"]
    assert "argparse.Namespace" in f.message and "numpy" in f.message
    assert "add_safe_globals([" in f.fix.code
    assert "unsafe-pickle" not in found and "pickled-module" not in found


def test_needs_code_to_load_on_protocol4_names_the_opcodes(files):
    f = codes(files["protocol4"])["needs-code-to-load"]
    assert "FRAME" in f.message and "protocol 4" in f.message


def test_pickled_module(files):
    found = codes(files["whole-module"])
    assert "ckpt_builders.Net" in found["pickled-module"].message
    assert "ckpt_builders.Net" in found["needs-code-to-load"].message
    assert "pickled-module" not in codes(files["training"])


def test_wrapper_prefix_dataparallel_and_lightning(files):
    f = codes(files["dataparallel"])["wrapper-prefix"]
    assert "'module.'" in f.message and "DataParallel" in f.message
    assert "consume_prefix_in_state_dict_if_present(sd, 'module.')" in f.fix.code
    lightning = codes(files["lightning"])["wrapper-prefix"]
    assert "'model.'" in lightning.message and "['state_dict']" in lightning.fix.code
    for name in ("plain", "training", "list"):
        assert "wrapper-prefix" not in codes(files[name]), name


def test_wrapper_prefix_torch_compile(tmp_path):
    import ckpt_builders as b
    import torch

    compiled = torch.compile(b.net())  # building the wrapper does not compile anything yet
    path = b.save(compiled.state_dict(), tmp_path / "compiled.pt")
    f = codes(path)["wrapper-prefix"]
    assert "'_orig_mod.'" in f.message and "torch.compile" in f.message


def test_model_prefix_alone_is_not_flagged_without_evidence(tmp_path):
    import ckpt_builders as b
    import torch

    path = b.save({"model.weight": torch.ones(2), "model.bias": torch.ones(2)}, tmp_path / "m.pt")
    assert "wrapper-prefix" not in codes(path)


def test_cuda_tensors(cuda_file, files):
    f = codes(cuda_file)["cuda-tensors"]
    assert "cuda:0" in f.message and "cuda:1" in f.message and "map_location" in f.fix.code
    assert str(f.severity) == "warning" and "'cuda:1': 'cuda:0'" in f.fix.code
    assert "cuda-tensors" not in codes(files["plain"])


def test_storage_bloat(files):
    f = codes(files["view"])["storage-bloat"]
    assert "small" in f.message and ".clone()" in f.fix.code
    assert "storage-bloat" not in codes(files["tied"])  # two halves of one storage use all of it


def test_nonfinite_weights_need_scan_values(files):
    assert "nonfinite-weights" not in codes(files["nan"])
    found = [f for f in check_checkpoint(files["nan"], scan_values=True).findings if f.name == "nonfinite-weights"]
    assert sorted(f.location.key for f in found) == ["conv.bias", "fc.weight"]
    assert "1 NaN" in next(f for f in found if f.location.key == "fc.weight").message


def test_serialization_format(files):
    for name, words in (
        ("legacy", "legacy"),
        ("torchscript", "TorchScript"),
        ("safetensors", "safetensors"),
        ("plain-pickle", "Plain pickle"),
    ):
        assert words in codes(files[name])["serialization-format"].message, name
    assert "serialization-format" not in codes(files["plain"])


def test_checkpoint_unreadable_on_a_truncated_record(files, tmp_path):
    data = open(files["legacy"], "rb").read()
    cut = tmp_path / "cut.pt"
    cut.write_bytes(data[: len(data) - 20])
    f = codes(str(cut))["checkpoint-unreadable"]
    assert "truncated" in f.message
    assert "checkpoint-unreadable" not in codes(files["legacy"])


@pytest.mark.gpu
def test_cuda_tensors_on_a_real_gpu(tmp_path):
    import ckpt_builders as b
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    path = b.save(b.net().cuda().state_dict(), tmp_path / "gpu.pt")
    f = codes(path)["cuda-tensors"]
    assert "9 on cuda:0" in f.message and str(f.severity) == "info"
    out = str(tmp_path / "cpu.pt")
    check_checkpoint(path, fix=out)
    assert all(t.device.type == "cpu" for t in torch.load(out, weights_only=True).values())
