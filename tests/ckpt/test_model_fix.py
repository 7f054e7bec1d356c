"""--model comparisons and --fix copies, checked by loading the results with real torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import ckpt_builders as b
import pytest
import torch
from torch import nn

from torchdoctor.ckpt.api import check_checkpoint
from torchdoctor.cli import main

MODEL_FILE = textwrap.dedent("""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self, classes=3, extra=False):
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 3)
            self.bn = nn.BatchNorm2d(2)
            self.fc = nn.Linear(8, classes)
            if extra:
                self.head = nn.Linear(3, 1)

    def other_head():
        return Net(classes=5)

    def with_extra():
        return Net(extra=True)

    def half():
        return Net().half()

    def not_a_model():
        return 42
""")


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "mymodels.py"
    path.write_text(MODEL_FILE)
    return lambda factory: f"{path}:{factory}"


def names(path, **kwargs):
    return {f.name: f for f in check_checkpoint(path, **kwargs).findings}


def test_matching_model_is_quiet(files, spec):
    assert names(files["plain"], model=spec("Net")) == {}
    assert names(files["plain"], model=b.net()) == {}


def test_prefix_is_reported_once_by_wrapper_prefix(files, spec):
    found = names(files["dataparallel"], model=spec("Net"))
    assert set(found) == {"wrapper-prefix"}
    lightning = names(files["lightning"], model=spec("Net"))
    assert "wrapper-prefix" in lightning and "state-dict-mismatch" not in lightning


def test_shape_mismatch_missing_and_unexpected(files, spec):
    shape = names(files["dataparallel"], model=spec("other_head"))["state-dict-mismatch"]
    assert "fc.weight: file [3, 8] vs model [5, 8]" in shape.message and "sd.pop(k)" in shape.fix.code
    assert "strip 'module.'" in shape.message
    missing = names(files["plain"], model=spec("with_extra"))["state-dict-mismatch"]
    assert "head.weight" in missing.message and "initial values" in missing.message
    unexpected = names(files["plain"], model=torch.nn.Sequential())
    assert "state-dict-mismatch" in unexpected and "ignored" in unexpected["state-dict-mismatch"].message


def test_dtype_difference_is_info(files, spec):
    found = check_checkpoint(files["plain"], model=spec("half")).findings
    (f,) = [f for f in found if f.name == "state-dict-mismatch"]
    assert str(f.severity) == "info" and "float32 vs model float16" in f.message


@pytest.mark.parametrize(
    "factory, message", [("missing", "has no attribute"), ("not_a_model", "not a torch.nn.Module")]
)
def test_bad_model_specs(capsys, files, spec, factory, message):
    with pytest.raises(SystemExit) as exc:
        main(["check-ckpt", "--model", spec(factory), files["plain"]])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and err.count("\n") == 1


def fixed(path, out, model=None):
    report = check_checkpoint(path, model=model, fix=out)
    return report, torch.load(out, weights_only=True)


@pytest.mark.parametrize(
    "name, source",
    [
        ("dataparallel", None),
        ("lightning", "state_dict"),
        ("training", "model"),
        ("whole-module", None),
        ("legacy", None),
    ],
)
def test_fix_writes_a_weights_only_strict_loading_state_dict(files, tmp_path, name, source):
    out = str(tmp_path / "fixed.pt")
    report, sd = fixed(files[name], out, model=b.net())
    if name == "training":  # a training checkpoint keeps its other entries (test below)
        sd = sd["model"]
    model = b.net(seed=1)
    model.load_state_dict(sd, strict=True)
    original = torch.load(files[name], weights_only=False)
    if name == "whole-module":
        original = original.state_dict()
    elif source:
        original = original[source]
    expected = {k.split(".", 1)[1] if name in ("dataparallel", "lightning") else k: v for k, v in original.items()}
    for k, v in model.state_dict().items():
        assert torch.equal(v, expected[k]), k
    assert report.structure["fix"][-1] == f"wrote {out}"


def test_fix_of_a_training_checkpoint_keeps_everything_but_the_prefix(files, tmp_path):
    """The copy `--fix` writes for {epoch, model with module. keys, optimizer, ...} is that checkpoint with
    the prefix removed, not its model tensors alone; what weights_only=True refuses is left out, and said."""
    model = nn.DataParallel(b.net()).cpu()
    saved = b.training_dict(model)  # also argparse.Namespace args and a numpy best_acc
    path = b.save(saved, tmp_path / "train.pt")
    out = str(tmp_path / "fixed.pt")
    report, copy = fixed(path, out)
    assert list(copy) == ["model", "optimizer", "epoch", "loss"]
    assert copy["epoch"] == 7 and copy["loss"] == 0.25
    assert list(copy["model"]) == [k.removeprefix("module.") for k in saved["model"]]
    assert all(torch.equal(copy["model"][k.removeprefix("module.")], v) for k, v in saved["model"].items())
    assert copy["model"]._metadata[""] == saved["model"]._metadata["module"]
    assert copy["optimizer"]["param_groups"] == saved["optimizer"]["param_groups"]
    for n, state in saved["optimizer"]["state"].items():
        assert all(torch.equal(copy["optimizer"]["state"][n][k], v) for k, v in state.items())
    b.net().load_state_dict(copy["model"])
    said = "\n".join(report.structure["fix"])
    assert "kept the training checkpoint" in said and "'module.conv.weight' -> 'conv.weight'" in said
    assert "left out 2 objects" in said and "args (argparse.Namespace)" in said and "best_acc" in said


def test_fix_moves_to_cpu_and_compacts_views(cuda_file, files, tmp_path):
    out = str(tmp_path / "cpu.pt")
    report, sd = fixed(cuda_file, out)
    assert set(sd) == {"a", "b"} and all(t.device.type == "cpu" for t in sd.values())
    assert any("accelerators to the CPU" in line for line in report.structure["fix"])
    small = str(tmp_path / "small.pt")
    _, sd = fixed(files["view"], small)
    assert torch.equal(sd["small"], torch.arange(10, dtype=torch.float32))
    assert os.path.getsize(small) < os.path.getsize(files["view"]) / 100


def test_fix_refuses_unsafe_files(capsys, tmp_path, canary):
    evil = b.save({"w": torch.ones(2), "x": b.reduce_payloads(canary)["os.system"]}, tmp_path / "evil.pt")
    out = tmp_path / "out.pt"
    with pytest.raises(SystemExit) as exc:
        main(["check-ckpt", "--fix", str(out), evil])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "unsafe-pickle" in err and "posix.system" in err
    assert not out.exists()


def test_fix_through_the_cli(capsys, files, tmp_path, spec):
    out = tmp_path / "cli.pt"
    with pytest.raises(SystemExit) as exc:
        main(["check-ckpt", "--model", spec("Net"), "--fix", str(out), files["dataparallel"]])
    text = capsys.readouterr().out
    assert exc.value.code == 0 and "renamed 9 keys" in text and "strict=True" in text
    assert set(torch.load(out, weights_only=True)) == set(b.net().state_dict())


def test_module_spec_and_the_public_api(files):
    import torchdoctor

    report = torchdoctor.check_checkpoint(files["dataparallel"], model="ckpt_builders:net")
    assert [f.name for f in report.findings] == ["wrapper-prefix"]
    assert report.structure["kind"] == "state_dict" and report.structure["model"]["keys"] == 9
    assert report.to_dict()["facts"]["checkpoints"][0]["path"] == files["dataparallel"]


def test_module_spec_imports_from_the_working_directory_and_pythonpath(files, tmp_path):
    """`--model mymodels:build_model` from the project folder, as `python -c "import mymodels"` would find it
    (the command line's protection against shadowing modules there stays: a `typing.py` that raises is not
    imported by torchdoctor itself)."""
    project, lib = tmp_path / "project", tmp_path / "lib"
    project.mkdir()
    lib.mkdir()
    (project / "mymodels.py").write_text("from helpers import build\n\ndef build_model():\n    return build()\n")
    (project / "typing.py").write_text("raise ImportError('the user\\'s typing.py was imported')\n")
    (lib / "helpers.py").write_text(MODEL_FILE + "\ndef build():\n    return Net()\n")
    env = {**os.environ, "PYTHONPATH": str(lib), "NO_COLOR": "1"}
    script = os.path.join(os.path.dirname(sys.executable), "torchdoctor")
    proc = subprocess.run(
        [script, "check-ckpt", "--format", "json", "--model", "mymodels:build_model", files["dataparallel"]],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["facts"]["checkpoints"][0]["model"] == {"spec": "mymodels:build_model", "keys": 9}
    assert [f["name"] for f in doc["findings"]] == ["wrapper-prefix"]


def test_file_spec_imports_its_own_modules_from_pythonpath(tmp_path, monkeypatch):
    """`--model path/to/models.py:build` finds what that file imports on PYTHONPATH, as `python` would."""
    from torchdoctor.ckpt.model import load_model

    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "td_helpers_for_spec.py").write_text(MODEL_FILE + "\ndef build():\n    return Net()\n")
    (tmp_path / "models.py").write_text("from td_helpers_for_spec import build\n")
    monkeypatch.setenv("PYTHONPATH", str(lib))
    model = load_model(f"{tmp_path / 'models.py'}:build")
    assert type(model).__name__ == "Net" and str(lib) not in sys.path
    sys.modules.pop("td_helpers_for_spec", None)


def test_fix_into_a_missing_folder_is_one_line(capsys, files, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["check-ckpt", "--fix", str(tmp_path / "nope" / "fixed.pt"), files["dataparallel"]])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("torchdoctor: error: cannot write") and err.count("\n") == 1
    assert "internal error" not in err
