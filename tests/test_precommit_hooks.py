"""The hooks of .pre-commit-hooks.yaml, run by pre-commit itself (`try-repo` on this checkout) in a new git repo."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("pre_commit", reason="pre-commit is in the test extra")
ROOT = Path(__file__).resolve().parents[1]


class _RunsACommand:
    """What an attacker pickles: loading it would call os.system; torchdoctor must only read it."""

    def __reduce__(self) -> tuple:
        return (os.system, ("echo pwned",))


def _try_repo(repo: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"),
        # the hooks run the torchdoctor installed beside this python, as in a user's environment
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "pre_commit", "try-repo", str(ROOT), *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_hooks_block_an_unsafe_pickle_and_a_lint_error_and_pass_clean_files(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "bad.py").write_text('import torch\nx = torch.zeros(2)\nx.to("cpu")\n')
    (repo / "good.py").write_text('import torch\nx = torch.zeros(2)\nx = x.to("cpu")\n')
    (repo / "notes.txt").write_text("not a checkpoint\n")
    torch.save({"w": torch.zeros(2)}, repo / "weights.pt")
    torch.save({"b": torch.ones(3)}, repo / "more.ckpt")
    (repo / "downloaded.pth").write_bytes(pickle.dumps(_RunsACommand()))
    (repo / "cut.pt").write_bytes((repo / "weights.pt").read_bytes()[:200])  # a copy that ended early
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)

    blocked = _try_repo(repo, tmp_path, "--all-files")
    out = blocked.stdout
    assert blocked.returncode == 1, out + blocked.stderr
    assert "torchdoctor lint" in out and "torchdoctor check-ckpt" in out and out.count("Failed") == 2
    assert "TD501 to-result-discarded" in out and "where: bad.py:3:1" in out and "good.py:" not in out
    assert "4 checkpoints" in out  # every checkpoint in one call, the text file in none
    assert "TD201 unsafe-pickle" in out and "where: downloaded.pth" in out  # each offending file is named
    assert "TD210 checkpoint-unreadable" in out and "where: cut.pt" in out and out.count("✗ TD") == 3
    assert "Largest tensors" not in out and "weights.pt" not in out  # clean files print no structure

    clean = _try_repo(repo, tmp_path, "--files", "good.py", "weights.pt", "more.ckpt", "notes.txt")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert clean.stdout.count("Passed") == 2
