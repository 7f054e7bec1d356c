"""Each front door imports only what it uses: the engines of the other doors stay unloaded, and so does torch.

Each case runs the door in a fresh interpreter (tests/door_imports.py), since an import is only seen the
first time a process makes it.
"""

import ast
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
    """No checkpoint, lint or watch module: neither their engines, nor their SDK doors, nor another check or a
    helper module only other checks use (the checks loaded are module-shadowing and what it imports)."""
    modules = imported(["env", "--select", "module-shadowing"], tmp_path)
    assert under(modules, "torchdoctor.ckpt", "torchdoctor.lint", "torchdoctor.watch") == []
    assert under(modules, "torchdoctor.sdk.checkpoint", "torchdoctor.sdk.source", "torchdoctor.sdk.runtime") == []
    checks = sorted(m for m in modules if m.startswith("torchdoctor.checks."))
    assert checks == sorted(f"torchdoctor.checks.{m}" for m in _check_and_helpers("module_shadowing") | {"_scopes"})


def _check_and_helpers(name: str) -> set[str]:
    """A check module and the private checks/ modules it imports, directly or through one another."""
    found, todo = set(), [name]
    while todo:
        module = todo.pop()
        if module not in found:
            found.add(module)
            tree = ast.parse((Path(__file__).resolve().parents[1] / "checks" / f"{module}.py").read_text("utf-8"))
            todo += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module]
    return found


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
