"""The column summaries (`TensorTable`, the safetensors `HeaderTable`) give exactly what the plain per-tensor
definitions give: each is checked against a straightforward reference written here, on real files."""

from __future__ import annotations

import gc
import heapq
import json
import random
import struct
from collections import Counter

import ckpt_builders as b
import pytest
import torch

from torchdoctor import registry
from torchdoctor.ckpt import read_checkpoint
from torchdoctor.ckpt.api import diagnose_checkpoints
from torchdoctor.ckpt.info import _group_of, _largest, show_path
from torchdoctor.ckpt.keys import LOOSE_PREFIXES, MOST, STRICT_PREFIXES, share, wrapper_prefix
from torchdoctor.ckpt.tables import HeaderTable, HeaderTensors


def reference_facts(info) -> dict:
    """The tensor summary computed tensor by tensor, the obvious way."""
    entries = info.tensors
    unique = list({id(e.tensor): e for e in reversed(entries)}.values())[::-1]
    by_dtype: Counter[str] = Counter()
    by_device: Counter[str] = Counter()
    counted: set[str] = set()
    for e in unique:
        s = e.tensor.storage
        if s is not None and s.key not in counted:
            counted.add(s.key)
            by_dtype[e.tensor.dtype] += s.nbytes
            by_device[s.location] += s.nbytes
    anchors = {sd.path for sd in info.state_dicts if sd.source == "dict"} | set(info.optimizer_states)
    groups: dict = {}
    for e in entries:
        inside = [a for a in anchors if e.path[: len(a)] == a]
        group = max(inside, key=len) if inside else _group_of(e.path)
        row = groups.setdefault(group, [0, 0, 0])
        row[0] += 1
        row[1] += e.tensor.numel
        row[2] += e.tensor.nbytes
    largest = heapq.nlargest(10, unique, key=lambda e: e.tensor.nbytes)
    return {
        "count": len(entries),
        "unique": len(unique),
        "parameters": sum(e.tensor.numel for e in unique if not e.in_optimizer),
        "optimizer_state_elements": sum(e.tensor.numel for e in unique if e.in_optimizer),
        "bytes_by_dtype": dict(by_dtype.most_common()),
        "bytes_by_device": dict(by_device.most_common()),
        "groups": [
            {"path": show_path(p), "tensors": c, "elements": n, "bytes": s}
            for p, (c, n, s) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:30]
        ],
        "largest": [show_path(e.path) for e in largest],
    }


def shared_and_nested(path) -> str:
    shared, big = torch.randn(3, 3), torch.randn(64, 64)
    model = b.net()
    return b.save(
        {
            "a": shared,
            "b": shared,
            "nested": {"c": shared, "d": [shared, torch.zeros(2)]},
            "model": model.state_dict(),
            "module": model,
            "views": [big[:2], big[1:3], big.t()],
            "half": torch.ones(4, dtype=torch.float16),
            "meta": torch.empty(2, 3, device="meta"),
        },
        path,
    )


@pytest.mark.parametrize(
    "name",
    [
        "plain",
        "training",
        "lightning",
        "whole-module",
        "list",
        "tied",
        "view",
        "legacy",
        "torchscript",
        "safetensors",
        "shared",
    ],
)
def test_column_summary_matches_the_per_tensor_definition(files, tmp_path, name):
    path = shared_and_nested(tmp_path / "shared.pt") if name == "shared" else files[name]
    info = read_checkpoint(path)
    facts = info.facts()["tensors"]
    assert {**facts, "largest": [t["key"] for t in facts["largest"]]} == {
        "stored_bytes": sum(facts["bytes_by_dtype"].values()),
        **reference_facts(info),
    }


def write_header(path, header: dict, data: int) -> str:
    blob = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob + bytes(data))
    return str(path)


def test_safetensors_header_is_read_as_columns_and_looked_up_lazily(tmp_path):
    header = {
        f"model.layers.{i}.weight": {
            "dtype": "F16" if i % 3 else "F32",
            "shape": [2, 3] if i % 2 else [5],
            "data_offsets": [32 * i, 32 * i + (12 if i % 3 else 24)],
        }
        for i in range(1000)
    }
    header["model.big"] = {"dtype": "U8", "shape": [1 << 20], "data_offsets": [32_000, 32_000 + (3 << 20)]}
    info = read_checkpoint(write_header(tmp_path / "m.safetensors", header, 32_000 + (3 << 20)))
    assert isinstance(info.archive.root, HeaderTensors) and isinstance(info.table, HeaderTable)
    assert info.kind == "state_dict" and [sd.path for sd in info.state_dicts] == [()]
    t = info.archive.root["model.layers.3.weight"]
    assert (t.dtype, t.shape, t.stride, t.storage.nbytes) == ("float32", (2, 3), (3, 1), 24)
    assert info.archive.locator("model.layers.3.weight").offset == info.archive.root.base + 96
    facts = info.facts()["tensors"]
    assert {**facts, "largest": [t["key"] for t in facts["largest"]]} == {
        "stored_bytes": sum(facts["bytes_by_dtype"].values()),
        **reference_facts(info),
    }
    findings = diagnose_checkpoints([info.path], registry.all_checks("checkpoint")).findings
    bloat = [f for f in findings if f.code == "TD207"]  # a 1 MiB tensor in a 3 MiB span
    assert len(bloat) == 1 and "model.big" in bloat[0].message


def test_malformed_safetensors_entries_are_named_and_the_rest_still_listed(tmp_path):
    header = {
        "ok": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "text-shape": {"dtype": "F32", "shape": ["2"], "data_offsets": [8, 16]},
        "bad-dtype": {"dtype": "XX", "shape": [1], "data_offsets": [0, 4]},
        "past-end": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4000]},
    }
    info = read_checkpoint(write_header(tmp_path / "bad.safetensors", header, 16))
    assert not isinstance(info.archive.root, HeaderTensors)
    assert sorted(info.archive.root) == ["ok", "text-shape"]
    assert any("'bad-dtype' is malformed" in p for p in info.problems)
    assert any("'past-end' points past the end" in p for p in info.problems)


def test_largest_breaks_ties_as_nlargest_does():
    rng = random.Random(0)
    for n in (0, 3, 10, 11, 200):
        for spread in (1, 3, 1000):
            values = [rng.randrange(spread) for _ in range(n)]
            assert _largest(values, 10) == heapq.nlargest(10, range(n), key=values.__getitem__)


def reference_prefix(keys: list[str]) -> str:
    found = ""
    while keys:
        for p in STRICT_PREFIXES + LOOSE_PREFIXES:
            n = sum(k.startswith(p) for k in keys)
            if n == len(keys) or (p in STRICT_PREFIXES and n >= MOST * len(keys)):
                found += p
                keys = [k[len(p) :] if k.startswith(p) else k for k in keys]
                break
        else:
            break
    return found


def test_wrapper_prefix_matches_the_strip_and_recount_definition():
    rng = random.Random(1)
    parts = ["module.", "_orig_mod.", "model.", "net.", "layer."]
    for _ in range(300):
        stack = "".join(rng.choice(parts) for _ in range(rng.randrange(4)))
        keys = [
            (stack if rng.random() < rng.choice((1.0, 0.95, 0.85)) else rng.choice(parts))
            + f"w{i}"
            + ("\nmodule.x" if rng.random() < 0.02 else "")
            for i in range(rng.randrange(1, 40))
        ]
        assert wrapper_prefix(keys) == reference_prefix(list(keys)), keys


def test_share_counts_keys_not_substrings():
    assert share(["a\nmodule.x", "module.y", "xmodule.z"], "module.") == 1
    assert share(["module.a", "module.b", "model.c"], "module.") == 2


def test_reading_leaves_the_collector_on_and_its_youngest_generation_empty(files):
    assert gc.isenabled()
    diagnose_checkpoints([files["training"]], registry.all_checks("checkpoint"))
    assert gc.isenabled() and gc.get_count()[0] < 1000
