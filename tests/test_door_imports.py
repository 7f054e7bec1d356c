"""Each front door imports only what it uses: the engines of the other doors stay unloaded, and so does torch.

Each case runs the door in a fresh interpreter (tests/door_imports.py), since an import is only seen the
first time a process makes it.
"""

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "door_imports.py"


def run_door(args: list[str], cwd: Path) -> dict:
    """What `torchdoctor ARGS` imported beyond the command line's own ("imported": torchdoctor's modules,
    "others": the rest); torch must stay out."""
    out = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert result["exit_code"] in (0, 1), result["output"]
    assert not result["torch"], f"torchdoctor {' '.join(args)} imported torch"
    return result


def imported(args: list[str], cwd: Path) -> list[str]:
    """The torchdoctor modules `torchdoctor ARGS` imports beyond the command line's own."""
    return run_door(args, cwd)["imported"]


# what `torchdoctor.sdk.runtime` loads: a check with a runtime detector besides its own door imports it, and it
# stays torch-free (never the session, its hooks or its torch-backed services)
WATCH_CONTRACT = {
    "torchdoctor.watch",
    "torchdoctor.watch.contract",
    "torchdoctor.watch.handles",
    "torchdoctor.watch.patches",
    "torchdoctor.watch.userframe",
}


def under(modules: list[str], *packages: str) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)]


def test_env_select_one_check_imports_only_that_check(tmp_path):
    modules = imported(["env", "--select", "module-shadowing"], tmp_path)
    assert under(modules, "torchdoctor.ckpt", "torchdoctor.lint", "torchdoctor.watch") == []
    checks = [m for m in modules if m.startswith("torchdoctor.checks.") and not m.rpartition(".")[2].startswith("_")]
    assert checks == ["torchdoctor.checks.module_shadowing"]


def test_check_ckpt_loads_no_lint_watch_or_env_engine(tmp_path):
    (tmp_path / "state.pkl").write_bytes(pickle.dumps({"step": 1}))
    modules = imported(["check-ckpt", "state.pkl"], tmp_path)
    assert under(modules, "torchdoctor.lint", "torchdoctor.env") == []
    assert set(under(modules, "torchdoctor.watch")) <= WATCH_CONTRACT


def test_check_ckpt_of_a_state_dict_imports_only_what_reading_it_needs(tmp_path):
    """A state dict names only allowlisted globals: no source is read (no reachability analysis); the runtime
    detector of a checkpoint pitfall needs only the contract's base class (not the handlers' helpers); without a
    declared plug-in no distribution metadata is read; JSON output needs no rich."""
    (tmp_path / "state.pkl").write_bytes(pickle.dumps({"step": 1, "lr": [0.1, 0.01]}))
    result = run_door(["check-ckpt", "--format", "json", "state.pkl"], tmp_path)
    assert under(result["imported"], "torchdoctor.watch") == ["torchdoctor.watch", "torchdoctor.watch.contract"]
    assert under(result["imported"], "torchdoctor.ckpt.reach", "torchdoctor.ckpt.view") == []
    assert under(result["others"], "importlib.metadata", "rich", "sysconfig", "email") == []


@pytest.mark.parametrize("select", [[], ["--select", "missing-zero-grad"]])
def test_lint_loads_no_checkpoint_reader_nor_watch_engine(tmp_path, select):
    (tmp_path / "train.py").write_text("x = 1\n")
    modules = imported(["lint", *select, "train.py"], tmp_path)
    assert under(modules, "torchdoctor.ckpt") == []
    assert set(under(modules, "torchdoctor.watch")) <= WATCH_CONTRACT
