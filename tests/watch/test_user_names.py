"""Runtime fixes written in the user's own names and lines (checks/_user_names.py): the DataLoader line a
loader fix rewrites, read from the user's file, or rebuilt from the loader's settings when the file shows none."""

from __future__ import annotations

import sys

import torch
from conftest import mlp, names, session
from torch.utils.data import DataLoader, TensorDataset
from torchdoctor.checks._user_names import LoaderCall


def pairs(batch):
    return batch


def test_the_line_that_builds_the_loader_is_rewritten_keeping_its_arguments():
    train_set = TensorDataset(torch.zeros(8, 2))
    train_loader = DataLoader(train_set, batch_size=4, collate_fn=pairs)  # the line the fix rewrites
    call = LoaderCall(train_loader, sys._getframe())
    assert call.code({"num_workers": "2"}) == (
        "train_loader = DataLoader(train_set, batch_size=4, collate_fn=pairs, num_workers=2)"
    )
    assert f"test_user_names.py:{sys._getframe().f_lineno - 5}" in call.title("More workers")
    assert call.code({"batch_size": "4"}) == ""  # no change: nothing to paste


def test_without_the_source_the_call_is_rebuilt_from_the_settings_in_the_users_names():
    namespace = {"DataLoader": DataLoader, "TensorDataset": TensorDataset, "torch": torch, "pairs": pairs}
    code = (
        "rows = TensorDataset(torch.zeros(8, 2))\n"
        "batches = DataLoader(rows, batch_size=2, shuffle=True, collate_fn=pairs, drop_last=True)\n"
    )
    exec(compile(code, "<not a file>", "exec"), namespace)
    namespace_frame = eval(compile("__import__('sys')._getframe()", "<not a file>", "eval"), namespace)
    call = LoaderCall(namespace["batches"], namespace_frame)
    fixed = call.code({"num_workers": "2"})
    assert fixed == (
        "batches = DataLoader(rows, batch_size=2, shuffle=True, drop_last=True, collate_fn=pairs, num_workers=2)"
    )
    exec(fixed, namespace)  # and it runs
    assert namespace["batches"].num_workers == 2 and len(namespace["batches"]) == 4


def test_unseeded_workers_are_mended_on_the_users_own_loader_line():
    seeds = DataLoader(TensorDataset(torch.zeros(4, 1)), num_workers=2)
    with session(mlp(), loader=seeds, deterministic=True) as s:
        pass
    assert "nondeterministic-settings" in names(s)
    [fix] = [f.fix for f in s.findings if "without generator=" in f.message]
    assert fix.code == (
        "seeds = DataLoader(TensorDataset(torch.zeros(4, 1)), num_workers=2, "
        "generator=torch.Generator().manual_seed(0))"
    )
    namespace = {"DataLoader": DataLoader, "TensorDataset": TensorDataset, "torch": torch}
    exec(fix.code, namespace)
    with session(mlp(), loader=namespace["seeds"], deterministic=True) as s:
        pass
    assert not any("without generator=" in f.message for f in s.findings)


def test_a_file_with_an_invalid_escape_still_gives_its_line_and_no_warning(tmp_path):
    """The user's `"\\d"`: parsing their file again must not repeat Python 3.12's SyntaxWarning in the training
    log (a DeprecationWarning before), nor, under `-W error`, lose their line."""
    import warnings

    path = tmp_path / "train.py"
    path.write_text(
        'import re\nDIGITS = re.compile("\\d+")\nrows = TensorDataset(torch.zeros(8, 2))\n'
        "loader = DataLoader(rows, batch_size=2 * 1)\n"
        "frame = __import__('sys')._getframe()\n"
    )
    namespace = {"DataLoader": DataLoader, "TensorDataset": TensorDataset, "torch": torch}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Python's own warning as it compiles the file: not ours
        exec(compile(path.read_text(), str(path), "exec"), namespace)
    for action in ("always", "error"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter(action)
            call = LoaderCall(namespace["loader"], namespace["frame"])
        assert [str(w.message) for w in caught] == []
        assert call.code({"num_workers": "2"}) == "loader = DataLoader(rows, batch_size=2 * 1, num_workers=2)"
        assert f"{path}:4" in call.title("More workers")
