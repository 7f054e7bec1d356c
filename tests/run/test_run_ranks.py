"""Under torchrun, every rank's findings reach rank 0 through the launcher's store, folded across ranks."""

from __future__ import annotations

import socket
from datetime import timedelta

from torch.distributed import TCPStore

from torchdoctor.findings import Finding, Location, Severity
from torchdoctor.run.ranks import exchange, launched_ranks


def _env(rank: int, port: int) -> dict[str, str]:
    return {
        "TORCHELASTIC_RUN_ID": "job",
        "RANK": str(rank),
        "WORLD_SIZE": "3",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rank_zero_gathers_what_the_others_sent_and_names_the_missing_one():
    port = _free_port()
    agent = TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False)
    finding = Finding(
        "grads add up", code="TD301", name="missing-zero-grad", severity=Severity.ERROR, location=Location(step=1)
    )
    assert exchange([finding], 0, _env(1, port)) == {"sent": True}
    answer = exchange([], 3, _env(0, port), wait=1.0)  # rank 2 never reports (it died)
    assert answer is not None and answer["missing"] == [2] and answer["status"] == {0: 3, 1: 0}
    assert answer["received"][0] == [] and [f.message for f in answer["received"][1]] == ["grads add up"]
    del agent


def test_without_torchrun_there_is_nothing_to_exchange():
    assert launched_ranks({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "x", "MASTER_PORT": "1"}) is None
    assert launched_ranks({**_env(0, 1), "WORLD_SIZE": "1"}) is None
    assert (
        exchange(
            [],
            0,
            {
                "TORCHELASTIC_RUN_ID": "job",
                "RANK": "1",
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(_free_port()),
            },
            wait=0.5,
        )
        is None
    )  # no store there: report locally
