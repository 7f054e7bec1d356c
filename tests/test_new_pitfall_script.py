"""scripts/pitfalls.py new: allocates the next code of the family and writes a definition that loads."""

import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

from torchdoctor import registry
from torchdoctor.pitfall import Pitfall, Scope

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "pitfalls.py"


def test_new_writes_a_loadable_definition_with_the_next_code(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "new",
            "forgot-something",
            "--door",
            "runtime",
            "--door",
            "source",
            "--root",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    last = max(int(p.code[2:]) for p in registry.all_checks() if p.code.startswith("TD3"))
    assert out.stdout.startswith(f"TD{last + 1} forgot-something")
    spec = importlib.util.spec_from_file_location("forgot_something", tmp_path / "checks" / "forgot_something.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pitfall = module.FORGOT_SOMETHING
    assert isinstance(pitfall, Pitfall) and pitfall.scopes == [Scope.RUNTIME, Scope.SOURCE]
    written = (tmp_path / "checks" / "forgot_something.py").read_text()
    fields = [p for p in inspect.signature(Pitfall).parameters if p != "self"]
    assert [f for f in fields if f"    {f}=" not in written] == []  # every documented field, to fill in
    assert set(pitfall.details) == {"runtime", "source"}
    stub = (tmp_path / "tests" / "pitfalls" / "test_forgot_something.py").read_text()
    assert "run_example(FORGOT_SOMETHING, FORGOT_SOMETHING.bad, door)" in stub and "PITFALLS.md" not in stub
    compile(stub, "test_forgot_something.py", "exec")
    again = subprocess.run(
        [sys.executable, str(SCRIPT), "new", "forgot-something", "--door", "env", "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 2 and "already exists" in again.stderr


def test_what_new_writes_passes_ruff_as_ci_runs_it(tmp_path):
    """The stubs pass `ruff format --check` and `ruff check` under the project's configuration, for every door
    (imports in order, one function name per function door)."""
    doors = [arg for door in ("source", "env", "runtime", "checkpoint") for arg in ("--door", door)]
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "new", "every-door", *doors, "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    written = [tmp_path / "checks" / "every_door.py", tmp_path / "tests" / "pitfalls" / "test_every_door.py"]
    config = str(SCRIPT.parents[1] / "pyproject.toml")
    for command in (["format", "--check", "--diff"], ["check", "--no-cache"]):
        ruff = subprocess.run(
            [sys.executable, "-m", "ruff", *command, "--config", config, *map(str, written)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ruff.returncode == 0, ruff.stdout + ruff.stderr
