"""--scan-values: NaN/Inf found in every floating dtype and layout, streamed in chunks."""

from __future__ import annotations

import ckpt_builders as b
import torch

from torchdoctor.ckpt import read_checkpoint, values
from torchdoctor.ckpt.values import scan_values


def counts(path):
    result = scan_values(read_checkpoint(path))
    return {"/".join(n.path): (n.nan, n.inf) for n in result.nonfinite}, result


def test_bf16_fp16_and_a_transposed_view(files):
    found, result = counts(files["bf16-inf"])
    # "t" is a (2, 3) transposed slice of a NaN-filled (3, 4) tensor: 6 NaNs, not the storage's 12
    assert found == {"w": (0, 1), "h": (1, 0), "t": (6, 0)}
    assert result.tensors == 4 and not result.skipped


def test_legacy_safetensors_and_compressed_zip(files):
    assert counts(files["legacy-nan"])[0] == {"fc.weight": (1, 0), "conv.bias": (0, 1)}
    assert counts(files["deflated-nan"])[0] == {"fc.weight": (1, 0), "conv.bias": (0, 1)}
    assert read_checkpoint(files["deflated-nan"]).archive.details["compressed_records"] > 0
    assert counts(files["safetensors-nan"])[0] == {"w": (1, 0)}
    assert counts(files["legacy"])[0] == {}


def test_chunk_boundaries_do_not_lose_values(tmp_path, monkeypatch):
    monkeypatch.setattr(values, "CHUNK", 64)
    t = torch.zeros(1000)
    t[15], t[16], t[999] = float("nan"), float("inf"), float("-inf")
    path = b.save({"t": t, "i": torch.arange(10)}, tmp_path / "c.pt")
    found, result = counts(path)
    assert found == {"t": (1, 2)} and result.bytes == 4000


def test_only_the_viewed_part_of_a_storage_is_scanned(tmp_path):
    big = torch.full((100,), float("nan"))
    big[10:20] = 1.0
    path = b.save({"part": big[10:20]}, tmp_path / "v.pt")
    assert counts(path)[0] == {}
