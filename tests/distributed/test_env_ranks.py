"""`torchdoctor env` across ranks: the cross-rank checks on synthetic rank facts, the folding of every
rank's findings, and real launches (torchrun, a missing rank, torch.distributed.launch's --local-rank)."""

import json
import os
import socket
import subprocess
import sys

import pytest

from torchdoctor import registry
from torchdoctor.env import distributed as dist
from torchdoctor.env.facts import EnvFacts, LaunchFacts, RankFacts
from torchdoctor.findings import Finding, Location, Severity


def rank(r, **changes):
    base = dict(
        rank=r,
        hostname="node0",
        local_rank=r,
        world_size=2,
        local_world_size=2,
        master_addr="node0",
        master_port="29500",
        python="3.11.7",
        torch={"version": "2.5.1+cu124", "cuda": "12.4", "cudnn": 90100, "nccl": "2.21.5"},
        gpu="NVIDIA A100-SXM4-80GB",
        env_vars={"OMP_NUM_THREADS": "1"},
    )
    base.update(changes)
    return RankFacts(**base)


def mismatch(ranks, missing=()):
    facts = EnvFacts(ranks=ranks, missing_ranks=list(missing))
    return registry.run_fact_checks([registry.get("rank-env-mismatch")], "env", facts)


def test_identical_ranks_are_quiet():
    assert mismatch([rank(0), rank(1)]) == []


def test_different_versions_gpus_and_settings_are_named_with_their_ranks():
    findings = mismatch(
        [
            rank(0),
            rank(
                1,
                torch={"version": "2.4.0+cu121", "cuda": "12.1", "cudnn": 90100, "nccl": "2.21.5"},
                gpu="NVIDIA GeForce RTX 3090",
                env_vars={"OMP_NUM_THREADS": "8"},
            ),
        ]
    )
    text = {f.message.split(":")[0]: f for f in findings}
    assert "2.5.1+cu124 on rank 0; 2.4.0+cu121 on rank 1" in text["Ranks run different torch versions"].message
    assert "Ranks run different CUDA versions" in text
    assert text["Ranks use different GPU models"].severity == Severity.WARNING
    assert "8 on rank 1" in text["OMP_NUM_THREADS differs between ranks"].message


def test_inconsistent_launch_variables():
    findings = mismatch([rank(0), rank(1, world_size=4, local_rank=0, master_port="29501")], missing=[2, 3])
    messages = " | ".join(f.message for f in findings)
    assert "Rank(s) 2, 3 did not report" in messages
    assert "disagree on WORLD_SIZE" in messages and "share LOCAL_RANK=0" in messages
    assert "disagree on MASTER_ADDR:MASTER_PORT" in messages
    assert all(f.severity == Severity.ERROR for f in findings)


def test_local_rank_argument_only_when_a_launcher_passed_it():
    check = [registry.get("local-rank-argument")]
    assert registry.run_fact_checks(check, "env", EnvFacts(launch=LaunchFacts(rank=0, world_size=2))) == []
    [f] = registry.run_fact_checks(check, "env", EnvFacts(launch=LaunchFacts(local_rank_arg="--local-rank")))
    assert "--local-rank=N" in f.message and 'os.environ["LOCAL_RANK"]' in f.fix.code


def test_fold_ranks_says_which_ranks_saw_what():
    shared = Finding("shm small", fix="f", code="TD111", name="shm-too-small", severity=Severity.WARNING)
    own = [shared]
    gpu = Finding(
        "GPU1 hot",
        fix="f",
        code="TD114",
        name="gpu-health",
        severity=Severity.WARNING,
        location=Location(device="GPU1"),
    )
    others = [rank(0), rank(1, findings=[shared.to_dict(), gpu.to_dict()])]
    folded = {f.name: f for f in dist.fold_ranks(own, others)}
    assert folded["shm-too-small"].message == "[all 2 ranks] shm small"
    assert folded["gpu-health"].message == "[rank 1] GPU1 hot" and folded["gpu-health"].location.rank == 1


def test_launch_facts_and_why_ranks_cannot_be_compared():
    assert dist.launch_facts({}) is None
    launch = dist.launch_facts({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    assert dist.multi_rank_problem(launch) is None
    assert "MASTER_PORT" in dist.multi_rank_problem(
        dist.launch_facts({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"})
    )
    assert "torchrun" in dist.multi_rank_problem(None)


def run(cmd, env=None, timeout=120):
    full_env = {**os.environ, "NO_COLOR": "1", **(env or {})}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        if env is None or var not in env:
            full_env.pop(var, None)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)


@pytest.mark.slow
def test_torchrun_two_ranks_report_once(tmp_path):
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port()),
        "-m",
        "torchdoctor",
        "env",
        "--format",
        "json",
    ]
    result = run(torchrun)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)  # exactly one JSON document: rank 1 stayed quiet
    assert sorted(r["rank"] for r in report["facts"]["ranks"]) == [0, 1]
    assert report["facts"]["missing_ranks"] == []
    assert [f for f in report["findings"] if f["severity"] != "info"] == []


BREAK_RANKS = """import os, sys
rank = os.environ.get("LOCAL_RANK")
if rank in ("1", "2"):
    class Broken:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" and rank == "1":
                raise ImportError("rank 1's torch is broken on purpose")
            if name == "torch":
                import time
                time.sleep(600)
    sys.meta_path.insert(0, Broken())
"""


@pytest.mark.slow
def test_ranks_whose_torch_import_fails_or_hangs_still_get_rank_0s_report(tmp_path):
    """Rank 1 cannot import torch, rank 2's import hangs (so neither has a TCPStore client): each posts its report
    through the launcher's store in plain Python and exits 0, so torchrun lets rank 0 print the merged report,
    whose exit code is the error."""
    (tmp_path / "sitecustomize.py").write_text(BREAK_RANKS)
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "3",
        "--master-port",
        str(free_port()),
        "-m",
        "torchdoctor",
        "env",
        "--format",
        "json",
        "--timeout",
        "8",
    ]
    result = run(torchrun, env={"PYTHONPATH": str(tmp_path)})
    report = json.loads(result.stdout)  # one JSON document: rank 0's
    assert sorted(r["rank"] for r in report["facts"]["ranks"]) == [0, 1, 2] and report["facts"]["missing_ranks"] == []
    failures = sorted(f["message"] for f in report["findings"] if f["name"] == "torch-import-failure")
    assert failures[0].startswith("[rank 1] `import torch` fails: ImportError: rank 1's torch is broken")
    assert failures[1].startswith("[rank 2] `import torch` hangs") and "sitecustomize.py:10 in find_spec" in failures[1]
    assert result.returncode == 1  # rank 0's report carries the error
    assert "local_rank: 1" not in result.stderr and "local_rank: 2" not in result.stderr  # they ended well


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_rank_that_never_comes_does_not_hang_rank_0():
    env = {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    result = run(
        [sys.executable, "-m", "torchdoctor", "env", "--distributed", "--timeout", "4", "--format", "json"], env=env
    )
    assert result.returncode == 1, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["facts"]["missing_ranks"] == [1]
    assert any(
        f["name"] == "rank-env-mismatch"
        and "Rank(s) 1 did not report" in f["message"]
        and "rank 1 never reached the launcher's store" in f["message"]
        for f in report["findings"]
    )


@pytest.mark.slow
def test_a_rank_that_cannot_reach_rank_0_reports_locally():
    env = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "port",
    }  # fails at once (an unreachable address fails after TCPStore's retries)
    result = run([sys.executable, "-m", "torchdoctor", "env", "--distributed", "--format", "json"], env=env)
    assert result.stderr.startswith(
        "torchdoctor: rank 1 could not report to rank 0 (the launcher's store at MASTER_ADDR:MASTER_PORT"
    ), result.stderr[-2000:]
    report = json.loads(result.stdout)  # its own report, printed where it ran
    assert report["facts"]["torch"]["ok"] is True and result.returncode == 0


def test_rank_0_says_what_a_missing_rank_was_doing():
    findings = mismatch([rank(0)], missing=[1, 2])
    facts = EnvFacts(ranks=[rank(0)], missing_ranks=[1, 2], missing_doing={"1": "initialising CUDA"})
    [f] = registry.run_fact_checks([registry.get("rank-env-mismatch")], "env", facts)
    assert "rank 1 was initialising CUDA; rank 2 never reached the launcher's store" in f.message
    assert "never reached" in findings[0].message


def test_launch_variables_without_a_launcher_are_a_note_not_a_wait():
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    result = run([sys.executable, "-m", "torchdoctor", "env", "--timeout", "60", "--format", "json"], env=env)
    report = json.loads(result.stdout)
    [note] = [f for f in report["findings"] if f["name"] == "rank-env-mismatch"]
    assert note["severity"] == "info" and note["message"].startswith("RANK=0, WORLD_SIZE=2, MASTER_ADDR=127.0.0.1")
    assert "unset RANK WORLD_SIZE MASTER_ADDR MASTER_PORT" in note["fix"]["title"]
    assert result.returncode == 0 and report["facts"]["ranks"] == []


def test_distributed_flag_without_a_launcher_is_a_usage_error():
    result = run([sys.executable, "-m", "torchdoctor", "env", "--distributed"])
    assert result.returncode == 2
    assert result.stderr.startswith("torchdoctor: error: --distributed: no RANK/WORLD_SIZE")
    assert result.stderr.count("\n") == 1
