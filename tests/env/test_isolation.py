"""`torchdoctor env` never imports the user's shadowing files itself, and still diagnoses them.

Each shadowing module raises on import with its own name: if torchdoctor's own process imported any of
them, the run would end in an internal error naming it. The torch probe must import them (it runs with
the user's environment), so `import torch` fails and the report blames the shadowing file.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchdoctor import isolation

# Standard modules torchdoctor's own process (click, rich, dataclasses, ...) imports, and numpy.
SHADOWS = ("random", "copy", "typing", "json", "numpy", "inspect", "dis", "textwrap", "subprocess", "tempfile")
SCRIPT = Path(sys.executable).with_name("torchdoctor")


def shadow_dir(root: Path, names=SHADOWS) -> Path:
    folder = root / "project"
    folder.mkdir()
    for name in names:
        (folder / f"{name}.py").write_text(f"raise ImportError('the user\\'s {name}.py was imported')\n")
    return folder


def run(cmd, cwd, pythonpath=None):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"NO_COLOR": "1", "COLUMNS": "200"}, **({"PYTHONPATH": str(pythonpath)} if pythonpath else {}))
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    return result, json.loads(result.stdout)


def findings(report, name):
    return [f for f in report["findings"] if f["name"] == name]


@pytest.mark.parametrize(
    "form, place", [("-m", "cwd"), ("-m", "PYTHONPATH"), ("script", "script dir"), ("script", "PYTHONPATH")]
)
def test_shadowing_stdlib_names_in_both_launch_forms(tmp_path, form, place):
    project = shadow_dir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if form == "-m":
        cmd = [sys.executable, "-m", "torchdoctor"]
    elif place == "script dir":
        shutil.copy(SCRIPT, project / "torchdoctor")
        cmd = [sys.executable, str(project / "torchdoctor")]
    else:
        cmd = [str(SCRIPT)]
    cwd = project if place == "cwd" else elsewhere
    result, report = run(
        [*cmd, "env", "--format", "json"], cwd=cwd, pythonpath=project if place == "PYTHONPATH" else None
    )
    shadowed = {f["location"]["file"] for f in findings(report, "module-shadowing")}
    if place != "script dir":  # the probe imports from the working directory and PYTHONPATH, as `python -c` does
        assert result.returncode == 1
        (failure,) = findings(report, "torch-import-failure")
        # one cause, one finding: the file the failure names is not reported again by module-shadowing
        assert failure["location"]["file"] not in shadowed
        assert shadowed | {failure["location"]["file"]} == {str(project / f"{n}.py") for n in SHADOWS}
        assert "was imported" in failure["message"] and "shadows" in failure["message"]
        assert failure["fix"]["title"].startswith(f"Rename {project}") and "reinstall" not in json.dumps(failure)
        assert "<string>" not in failure["message"] and "ProbeFailed" not in failure["message"]
        via = "PYTHONPATH" if place == "PYTHONPATH" else "the working directory"
        assert all(via in f["message"] for f in findings(report, "module-shadowing"))
    else:
        assert report["facts"]["torch"]["ok"] is True and not shadowed and result.returncode == 0


@pytest.mark.parametrize("form, layout", [("-m", "torch.py"), ("script", "torch/")])
def test_shadowing_torch_itself(tmp_path, form, layout):
    project = tmp_path / "project"
    project.mkdir()
    if layout == "torch.py":
        (project / "torch.py").write_text("x = 1\n")  # imports fine, but is no torch
    else:
        (project / "torch").mkdir()
        (project / "torch" / "__init__.py").write_text("raise ImportError('the user\\'s torch/ was imported')\n")
    cmd = [sys.executable, "-m", "torchdoctor"] if form == "-m" else [str(SCRIPT)]
    result, report = run([*cmd, "env", "--format", "json"], cwd=project)
    (failure,) = findings(report, "torch-import-failure")
    found = project / ("torch.py" if layout == "torch.py" else "torch")
    assert f"Python found {found} first" in failure["message"]
    assert failure["fix"]["title"].startswith(f"Rename {found}") and "reinstall" not in json.dumps(failure)
    assert "<string>" not in failure["message"] and "line " not in failure["message"]
    assert findings(report, "module-shadowing") == []  # the import failure names it: one finding
    assert result.returncode == 1


def test_cli_launch_is_told_apart_from_an_import(tmp_path):
    assert isolation.is_cli_launch(["-m"], ["python", "-u", "-m", "torchdoctor", "env"], None)
    assert isolation.is_cli_launch(["-m"], ["python", "-mtorchdoctor", "env"], None)
    assert not isolation.is_cli_launch(["-m"], ["python", "-m", "pytest"], None)
    assert isolation.is_cli_launch(["/venv/bin/torchdoctor", "env"], None, "/venv/bin/torchdoctor")
    assert not isolation.is_cli_launch(["train.py"], None, "train.py")
    assert not isolation.is_cli_launch(["/x/torchdoctor.py"], None, "/x/torchdoctor.py")  # the user's own script
    assert not isolation.is_cli_launch(["-c"], None, None)


def test_only_folders_with_modules_need_the_re_exec(tmp_path):
    assert not isolation.holds_modules(str(tmp_path))
    (tmp_path / "data").mkdir()
    (tmp_path / "notes.txt").write_text("")
    assert not isolation.holds_modules(str(tmp_path))  # a folder without __init__.py shadows nothing
    (tmp_path / "data" / "__init__.py").write_text("")
    assert isolation.holds_modules(str(tmp_path))


def test_folders_leave_sys_path_in_process_unless_one_of_their_modules_is_loaded(tmp_path):
    project = shadow_dir(tmp_path, names=("helpers",))
    real = {os.path.realpath(project)}
    ours = str(project / "torchdoctor" / "cli.py")  # torchdoctor itself, run from a checkout
    assert isolation.loaded_from(real, {"torchdoctor.cli": ours, "os": os.__file__, "sys": None}) == []
    assert isolation.loaded_from(real, {"helpers": str(project / "helpers.py"), "torchdoctor.cli": ours}) == ["helpers"]
    package = {"pkg": str(project / "pkg" / "__init__.py"), "pkg.sub": str(project / "pkg" / "sub.py")}
    assert isolation.loaded_from(real, package) == ["pkg", "pkg.sub"]
    assert isolation.loaded_from(real, {"ext": str(project / "ext.cpython-311-x86_64-linux-gnu.so")}) == ["ext"]


def test_a_venv_inside_the_project_does_not_count_as_the_project(tmp_path):
    """A module found through the search-path entry of a `.venv` in the project folder (an editable install's
    finder, `_distutils_hack`) was not imported from the project folder: no re-execution for it."""
    project = shadow_dir(tmp_path, names=("helpers",))
    site = project / ".venv" / "lib" / "python3.11" / "site-packages"
    real = {os.path.realpath(project)}
    loaded = {"_distutils_hack": str(site / "_distutils_hack" / "__init__.py"), "finder": str(site / "finder.py")}
    assert isolation.loaded_from(real, loaded) == []
    assert isolation.loaded_from(real, {"helpers2": str(project / "helpers.py")}) == []  # another name's file


def test_a_sitecustomize_already_loaded_from_pythonpath_makes_it_re_execute(tmp_path):
    """The fallback: a module of the user's folder is loaded before torchdoctor runs, so only a fresh process
    without PYTHONPATH is clean; the probe still gets PYTHONPATH back."""
    project = shadow_dir(tmp_path)
    marker = tmp_path / "imported"
    (project / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'a').write('x')\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result, report = run(
        [sys.executable, "-m", "torchdoctor", "env", "--format", "json"], cwd=elsewhere, pythonpath=project
    )
    (failure,) = findings(report, "torch-import-failure")  # the probe still sees PYTHONPATH
    named = {f["location"]["file"] for f in findings(report, "module-shadowing")} | {failure["location"]["file"]}
    assert result.returncode == 1 and named >= {str(project / "random.py")}
    assert marker.read_text() == "xx"  # at start-up and in the probe, never in the re-executed process
