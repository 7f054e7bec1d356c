"""Real checkpoints for the checkpoint tests, built once per session with torch in a temp dir."""

from __future__ import annotations

import copy
import zipfile

import ckpt_builders as b
import pytest
import torch
from torch import nn


@pytest.fixture(scope="session")
def files(tmp_path_factory):
    """name -> path of every benign checkpoint the tests use."""
    d = tmp_path_factory.mktemp("ckpts")
    model = b.net()
    sd = model.state_dict()
    out = {
        "plain": b.save(sd, d / "plain.pt"),
        # .cpu(): on a machine with a GPU, DataParallel moves the module to cuda:0
        "dataparallel": b.save(nn.DataParallel(b.net()).cpu().state_dict(), d / "dp.pt"),
        "lightning": b.save(b.lightning_style(b.net()), d / "lightning.ckpt"),
        "training": b.save(b.training_dict(b.net()), d / "training.pt"),
        "training-plain": b.save(b.training_dict(b.net(), with_numpy=False), d / "training_plain.pt"),
        "whole-module": b.save(b.net(), d / "whole.pt"),
        "legacy": b.save(sd, d / "legacy.pt", _use_new_zipfile_serialization=False),
        "protocol4": b.save(sd, d / "p4.pt", pickle_protocol=4),
        "legacy-protocol4": b.save(sd, d / "legacy_p4.pt", pickle_protocol=4, _use_new_zipfile_serialization=False),
        "list": b.save([sd, {"ema": copy.deepcopy(sd)}], d / "list.pt"),
    }
    big = torch.arange(1_000_000, dtype=torch.float32)
    out["view"] = b.save({"small": big[:10], "w": torch.ones(3)}, d / "view.pt")
    out["tied"] = b.save({"a": big[:500_000], "b": big[500_000:]}, d / "tied.pt")
    bad = b.net().state_dict()
    bad["fc.weight"][0, 0] = float("nan")
    bad["conv.bias"][1] = float("inf")
    out["nan"] = b.save(bad, d / "nan.pt")
    out["bf16-inf"] = b.save(
        {
            "w": torch.tensor([1.0, float("inf"), 2.0], dtype=torch.bfloat16),
            "h": torch.tensor([float("nan"), 1.0], dtype=torch.float16),
            "t": torch.full((3, 4), float("nan"))[:, 1:3].t(),
            "ok": torch.ones(4, dtype=torch.float64),
        },
        d / "bf16.pt",
    )
    out["deflated-nan"] = b.replace_data_pkl(out["nan"], str(d / "deflated.pt"), compression=zipfile.ZIP_DEFLATED)
    out["legacy-nan"] = b.save(bad, d / "legacy_nan.pt", _use_new_zipfile_serialization=False)
    out["torchscript"] = str(d / "script.pt")
    torch.jit.save(torch.jit.trace(b.WithConstant(), torch.zeros(1, 2)), out["torchscript"])
    floats = {k: v for k, v in sd.items() if v.dtype == torch.float32}
    out["safetensors"] = b.write_safetensors(d / "model.safetensors", floats, {"format": "pt"})
    out["safetensors-nan"] = b.write_safetensors(d / "nan.safetensors", {"w": torch.tensor([1.0, float("nan")])})
    out["plain-pickle"] = str(d / "plain.pkl")
    with open(out["plain-pickle"], "wb") as f:
        f.write(b.dumps({"lr": 0.1, "names": ["a", "b"]}, protocol=4))
    return out


@pytest.fixture(scope="session")
def cuda_file(tmp_path_factory):
    """A checkpoint whose storages carry cuda:0 and cuda:1 location tags (as torch.save writes them on GPUs)."""
    import torch.serialization as ser

    path = tmp_path_factory.mktemp("cuda") / "cuda.pt"
    real = ser.location_tag
    tags = iter(["cuda:0", "cuda:1"] * 100)
    ser.location_tag = lambda storage: next(tags)
    try:
        torch.save({"a": torch.ones(2), "b": torch.zeros(3)}, path)
    finally:
        ser.location_tag = real
    return str(path)


@pytest.fixture()
def canary(tmp_path):
    """A file path that any executed payload would create; tests assert it never appears."""
    path = tmp_path / "canary"
    yield str(path)
    assert not path.exists(), "a payload was executed"
