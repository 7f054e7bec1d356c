"""`watch` under DistributedDataParallel: two real gloo ranks on 127.0.0.1 run every scenario of
watch_ddp_worker.py in one launch; the in-process tests cover the exchange's chunking, the tolerance of
the fingerprints and the merging of the ranks' findings."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from two_ranks import free_port, run_two_ranks

from torchdoctor.findings import Finding, Location, Severity
from torchdoctor.watch import distributed as wd

WORKER = Path(__file__).with_name("watch_ddp_worker.py")
TIMEOUT_S = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Both ranks' results per scenario: {scenario: [rank 0's, rank 1's]}."""
    out = tmp_path_factory.mktemp("ddp")
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DISTRIBUTED_DEBUG"}  # DETAIL segfaults DDP()
    env.update(
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        OUT_DIR=str(out),
        TORCHDOCTOR_WATCH_TIMEOUT=str(TIMEOUT_S),
        OMP_NUM_THREADS="1",
    )
    run_two_ranks(WORKER, env, timeout=90)
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return {name: [results[0][name], results[1][name]] for name in results[0]}


def _named(result: dict, name: str) -> list[dict]:
    return [f for f in result["findings"] if f["name"] == name]


def _problems(result: dict) -> list[str]:
    return [
        f["name"]
        for f in result["findings"]
        if f["severity"] in ("warning", "error") or "failed internally" in f["message"]
    ]


def test_batchnorm_drift_under_broadcast_buffers_false(ranks):
    for result in ranks["buffer_drift"]:
        [f] = _named(result, "ddp-buffer-desync")
        assert f["severity"] == "warning" and f["location"] == {"key": "1.running_mean", "step": 2}
        assert "1.running_mean" in f["message"] and "1.running_var" in f["message"]
        assert "differ between rank 0 and rank 1" in f["message"] and "broadcast_buffers=False" in f["message"]
        assert "num_batches_tracked" not in f["message"]  # every rank counted the same batches
        assert _problems(result) == ["ddp-buffer-desync"]
        [small] = _named(result, "syncbn-missing")  # 8 samples per rank
        assert small["severity"] == "info" and "batch of 8 samples" in small["message"]


def test_identical_batches_on_every_rank(ranks):
    for result in ranks["same_data"]:
        [f] = _named(result, "ddp-same-data")
        assert f["message"].startswith("All 2 ranks received identical input batches at steps 0 and 2")
        assert _problems(result) == ["ddp-same-data"]


def test_parameter_changed_on_one_rank_is_named_with_the_rank(ranks):
    for result in ranks["param_changed"]:
        [f] = _named(result, "ddp-param-desync")
        assert f["location"] == {"param": "2.weight", "step": 2}
        assert "1 parameter(s) differ between rank 0 and rank 1 at step 2" in f["message"]
        assert _problems(result) == ["ddp-param-desync"]


def test_clean_loop_with_distributed_sampler_is_quiet_and_reported_once(ranks):
    zero, one = ranks["clean"]
    assert _problems(zero) == [] and _problems(one) == []
    assert zero["ranks"] == {"world_size": 2, "reported": [0, 1], "missing": [], "notes": []}
    assert zero["rank_findings"] is not None and one["rank_findings"] is None  # only rank 0 has the merged report


def test_merged_report_on_rank_0_shows_cross_rank_findings_once(ranks):
    zero = ranks["buffer_drift"][0]
    assert sorted(f["name"] for f in zero["rank_findings"]) == ["ddp-buffer-desync", "syncbn-missing"]
    assert not any(f["message"].startswith("[") for f in zero["rank_findings"])  # same on both ranks: no prefix


def test_a_straggler_rank_is_named_and_equal_ranks_are_not(ranks):
    for result in ranks["straggler"]:
        [finding] = _named(result, "straggler-rank")
        assert finding["message"].startswith("rank 1 is the straggler") and finding["location"]["rank"] == 1
    assert [f for f in ranks["straggler"][0]["rank_findings"] if f["name"] == "straggler-rank"]
    # rank 0 waits for rank 1 in the gradient all-reduce: its breakdown puts that wait in backward
    shares = [result["step_time"]["phases"]["backward"]["share"] for result in ranks["straggler"]]
    assert shares[0] > 0.5 > shares[1], shares
    for name in ("clean", "tutorial", "buffer_drift", "same_data"):  # equal work on both ranks
        assert not any(_named(result, "straggler-rank") for result in ranks[name]), name


def test_a_rank_that_stops_early_does_not_hang_the_other(ranks):
    zero, one = ranks["early_stop"]
    assert zero["seconds"] < TIMEOUT_S  # rank 0 read rank 1's goodbye at its next exchange: no waiting at all
    assert zero["ranks"]["reported"] == [0, 1]  # rank 1's findings came with its goodbye
    assert "rank(s) 1 ended their watch session while rank 0 was at step 2" in zero["ranks"]["notes"][0]
    assert "were still training" in one["ranks"]["notes"][0]
    assert _problems(zero) == [] and _problems(one) == []


def test_a_stalled_rank_costs_at_most_the_timeout(ranks):
    zero, one = ranks["slow_rank"]
    stall = TIMEOUT_S + 1.5
    assert zero["seconds"] < stall + TIMEOUT_S  # rank 0 waited the timeout once, then trained on unchecked
    assert zero["ranks"]["missing"] == [1] and "did not join the exchange within 2 s" in zero["ranks"]["notes"][0]
    assert "gave up comparing ranks at step 2" in one["ranks"]["notes"][0]
    assert _problems(zero) == [] and _problems(one) == []


# -- in process --------------------------------------------------------------------------------------


@pytest.fixture
def single_rank_group(monkeypatch):
    """A world of one over a HashStore, enough to drive the side group's chunking."""
    from torch.distributed import HashStore

    store = HashStore()
    monkeypatch.setattr("torch.distributed.distributed_c10d._get_default_store", lambda: store)
    group = wd.SideGroup(0, 1, timeout=5)
    yield group
    group.close()


@pytest.mark.gloo_in_process
def test_exchange_splits_large_payloads_into_fixed_size_chunks(single_rank_group):
    payload = bytes(range(256)) * 200  # 51,200 bytes: four chunks
    [msg] = single_rank_group.exchange(wd.STOP, -1, payload)
    assert (msg.kind, msg.step, msg.payload) == (wd.STOP, -1, payload)
    [msg] = single_rank_group.exchange(wd.PERIODIC, 7, b"")
    assert (msg.kind, msg.step, msg.payload) == (wd.PERIODIC, 7, b"")


@pytest.mark.gloo_in_process
def test_side_group_gives_up_when_no_other_rank_joins(monkeypatch):
    from torch.distributed import HashStore

    store = HashStore()
    store.set_timeout(timedelta(seconds=1))
    monkeypatch.setattr("torch.distributed.distributed_c10d._get_default_store", lambda: store)
    group = wd.SideGroup(0, 2, timeout=1)
    start = time.perf_counter()
    assert group.exchange(wd.PERIODIC, 0, b"x") is None
    assert time.perf_counter() - start < 10
    assert "did not join torchdoctor's side group within 1 s" in group.trouble


def test_fingerprint_tolerance_ignores_summation_order_but_not_changes():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(1000, 100, generator=g)

    def rows(*tensors):
        return wd.fingerprint_rows(wd.tensor_stats(list(tensors)), [t.numel() for t in tensors])

    [same] = rows(w)
    [reordered] = rows(w.flip(0).contiguous())  # same values, another summation order
    changed = w.clone()
    changed[3] += 0.5  # one row of 100
    assert not wd.stats_differ(same, reordered)
    assert wd.stats_differ(same, rows(changed)[0])
    assert wd.stats_differ(same, rows(-w)[0])  # same magnitudes, other signs
    assert not wd.stats_differ((float("nan"), float("nan"), 4.0), (float("nan"), float("nan"), 4.0))
    assert wd.stats_differ(same, rows(w[:-1])[0])  # another shape
    halves = rows(w.bfloat16(), torch.tensor(3), torch.tensor([True, False]))
    assert halves[1:] == [[3.0, 9.0, 1.0], [1.0, 1.0, 2.0]] and abs(halves[0][1] - same[1]) < 1e-2 * same[1]


def test_batch_digest_is_order_sensitive_and_ignores_nothing_it_sees():
    x = torch.arange(12.0).reshape(4, 3)
    base = wd.digest(wd.batch_sums(((x, {"mask": x > 2}), {})))
    assert base == wd.digest(wd.batch_sums(((x.clone(), {"mask": x > 2}), {})))
    assert base != wd.digest(wd.batch_sums(((x.flip(0), {"mask": x > 2}), {})))  # same samples, other order
    assert base != wd.digest(wd.batch_sums(((x, {"mask": x > 3}), {})))
    assert len(base) == 16  # 8 bytes


def test_merge_says_which_ranks_saw_what():
    def finding(name, message, severity=Severity.WARNING, **loc):
        return Finding(message, code="TD000", name=name, severity=severity, location=Location(**loc) if loc else None)

    desync = finding("ddp-param-desync", "1 parameter(s) differ", Severity.ERROR, param="w", step=4)
    local = finding("missing-zero-grad", "no zero_grad", step=1)
    merged = {
        f.message: f
        for f in wd.merge_ranks(
            {0: [desync], 1: [desync, local, finding("x", "both")], 2: [desync, finding("x", "both")]}
        )
    }
    assert "1 parameter(s) differ" in merged  # a cross-rank finding every rank made: as is
    assert merged["[rank 1] no zero_grad"].location.rank == 1
    assert "[ranks 1, 2] both" in merged
    alone = wd.merge_ranks({0: [local]})
    assert [f.message for f in alone] == ["no zero_grad"]


def test_the_ddp_tutorial_peek_before_set_epoch_is_quiet(ranks):
    assert [_problems(r) for r in ranks["tutorial"]] == [[], []]


def test_fsdp2_models_are_watched_without_internal_errors(ranks):
    if ranks["fsdp2"][0] is None:
        pytest.skip("torch.distributed.fsdp.fully_shard is not in this torch")
    for result in ranks["fsdp2"]:
        first = result["findings"][0]
        assert (first["name"], first["location"]["step"]) == ("nonfinite-values", 2)
        assert not [f for f in result["findings"] if "failed internally" in f["message"]]
