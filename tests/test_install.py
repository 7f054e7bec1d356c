"""A wheel install and the editable install both find every built-in check and ship its docs page."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import torchdoctor

ROOT = Path(__file__).resolve().parents[1]
LIST = (
    "import json, torchdoctor, torchdoctor.checks; from torchdoctor import registry; "
    "cs = registry.all_checks(); "
    "print(json.dumps({'file': torchdoctor.checks.__file__, "
    "'checks': sorted(c.name for c in cs if c.origin == 'built-in'), "
    "'docs': all('## How to fix' in c.page() for c in cs if c.origin == 'built-in')}))"
)


def declared_checks() -> list[str]:
    """Check names as written in the sources of checks/, independent of the registry."""
    names = set()
    for path in (ROOT / "checks").glob("*.py"):
        text = path.read_text()
        names.update(re.findall(r'= Pitfall\(\s*code="\w+",\s*name="([a-z0-9-]+)"', text))
    return sorted(names)


def listing(python_path=None, cwd=None) -> dict:
    env = None
    if python_path:
        import os

        env = {**os.environ, "PYTHONPATH": python_path}
    out = subprocess.run(
        [sys.executable, "-c", LIST], capture_output=True, text=True, timeout=120, env=env, cwd=cwd, check=True
    ).stdout
    return json.loads(out)


def test_editable_install_finds_every_check():
    assert Path(torchdoctor.__file__).resolve().parent == ROOT / "torchdoctor", "tests run on the editable install"
    result = listing()
    assert Path(result["file"]).resolve() == ROOT / "checks" / "__init__.py"
    assert result["checks"] == declared_checks() and result["docs"]


def test_a_source_checkout_run_from_its_folder_finds_its_own_checks(tmp_path):
    """`python -m torchdoctor` inside a checkout imports the checkout's torchdoctor/ whatever is installed (a
    wheel, another checkout): its checks/ and docs/, which pyproject.toml maps into the package, come along."""
    import shutil

    for name in ("torchdoctor", "checks", "docs"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    result = listing(cwd=tmp_path)
    assert Path(result["file"]).resolve() == (tmp_path / "checks" / "__init__.py").resolve()
    assert result["checks"] == declared_checks() and result["docs"]


@pytest.mark.slow
def test_wheel_install_finds_every_check(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(ROOT),
        ],
        check=True,
        timeout=300,
        capture_output=True,
    )
    [wheel] = (tmp_path / "dist").glob("torchdoctor-*.whl")
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True,
        timeout=300,
        capture_output=True,
    )
    result = listing(python_path=str(target), cwd=tmp_path)
    assert Path(result["file"]).resolve() == (target / "torchdoctor" / "checks" / "__init__.py").resolve()
    assert result["checks"] == declared_checks() and result["docs"]
    explain = subprocess.run(
        [sys.executable, "-m", "torchdoctor", "explain", "TD111"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PYTHONPATH": str(target), "PATH": ""},
    )
    assert explain.returncode == 0 and explain.stdout.startswith("# shm-too-small (TD111)")
