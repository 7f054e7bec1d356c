"""A state dict written with plain `pickle.dump` carries each storage as the bytes of a nested torch.save:
its tensors are counted and described like any other (read from those bytes, never loaded)."""

import pickle

import ckpt_builders as b

from torchdoctor.ckpt import read_checkpoint


def test_tensors_of_a_plain_pickled_state_dict_are_counted(tmp_path):
    sd = b.net().state_dict()
    path = tmp_path / "weights.pkl"
    path.write_bytes(pickle.dumps(sd))
    info = read_checkpoint(str(path))
    facts = info.facts()
    assert facts["tensors"]["count"] == len(sd) == 9 and facts["kind"] == "state_dict"
    assert facts["tensors"]["parameters"] == sum(t.numel() for t in sd.values())
    assert [sd_.path for sd_ in info.state_dicts] == [()] and sorted(info.state_dicts[0].tensors) == sorted(sd)
    assert facts["tensors"]["bytes_by_dtype"] == {"float32": 220, "int64": 8}
    from torchdoctor.ckpt.values import scan_values

    skipped = scan_values(info).skipped  # not scanned, and said why: the bytes are in the pickle, not missing
    assert len(skipped) == 8 and all("inside the pickle" in s for s in skipped)


def test_an_optimizer_state_dict_on_its_own_says_so(tmp_path, files):
    import torch

    path = tmp_path / "optimizer.bin"  # as accelerate's save_state writes it
    torch.save(b.optimizer_state(b.net()), path)
    assert read_checkpoint(str(path)).kind == "optimizer state"
    assert read_checkpoint(files["training"]).kind == "training checkpoint"
