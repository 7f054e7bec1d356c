"""Under `torchdoctor run`, the DDP-only checks start when the script's process group comes up (the session
starts before `init_process_group`): two real gloo ranks, a correct script and one whose rank 0 changes its
parameters after wrapping."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from two_ranks import free_port, run_two_ranks

WORKER = Path(__file__).with_name("run_ddp_worker.py")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Both ranks' results: [rank 0's, rank 1's], each {"good": ..., "bug": ...}."""
    out = tmp_path_factory.mktemp("run_ddp")
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_DISTRIBUTED_DEBUG", "TORCHELASTIC_RUN_ID")}
    env.update(
        WORLD_SIZE="2",
        PORTS=f"{free_port()},{free_port()}",
        OUT_DIR=str(out),
        TORCHDOCTOR_WATCH_TIMEOUT="10",
        OMP_NUM_THREADS="1",
    )
    run_two_ranks(WORKER, env, timeout=120)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_the_cross_rank_checks_run_under_run_and_stay_quiet_on_a_correct_ddp_script(ranks):
    for rank in ranks:
        good = rank["good"]
        assert good["status"] == 0
        assert {"ddp-param-desync", "ddp-buffer-desync", "ddp-same-data"} <= set(good["checks"])
        assert [f["name"] for f in good["findings"] if f["severity"] in ("warning", "error")] == []


def test_parameters_changed_on_rank_zero_after_wrapping_are_found_on_every_rank(ranks):
    for rank in ranks:
        bug = rank["bug"]
        desync = [f for f in bug["findings"] if f["name"] == "ddp-param-desync"]
        assert len(desync) == 1 and "rank 1" in desync[0]["message"], bug["findings"]
        assert desync[0]["location"]["step"] == 0  # the first exchange, before the first update
        assert bug["status"] == 1  # an error finding
