"""Under torchrun: every rank's findings to rank 0, which prints one report with them folded across ranks.

The program's own process group is usually destroyed before it ends, so the exchange goes through the
store torchrun's agent keeps at MASTER_ADDR:MASTER_PORT for the whole job (a `TCPStore` client), under
keys of this run (TORCHELASTIC_RUN_ID and the restart count). Rank 0 waits a short while for the others;
a rank that died or never reported is named in the report. Nothing here raises: without the store, each
rank reports on its own.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Mapping, Optional

from torchdoctor.findings import Finding

WAIT_SECONDS = 15.0


def launched_ranks(environ: Mapping[str, str]) -> Optional[tuple[int, int, str, int, str]]:
    """(rank, world size, master address, port, key prefix) when torchrun launched several ranks, else None."""
    run_id, rank, world = environ.get("TORCHELASTIC_RUN_ID"), environ.get("RANK"), environ.get("WORLD_SIZE")
    addr, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")
    if (
        not (run_id and rank and world and addr and port)
        or not (rank.isdigit() and world.isdigit() and port.isdigit())
        or int(world) < 2
    ):
        return None
    prefix = f"torchdoctor/run/{run_id}/{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    return int(rank), int(world), addr, int(port), prefix


def exchange(
    findings: list[Finding], status: int, environ: Mapping[str, str] = os.environ, wait: float = WAIT_SECONDS
) -> Optional[dict[str, Any]]:
    """Send this rank's findings; on rank 0, gather every rank's. Returns None when there is nothing to
    exchange with (or it failed: then the caller reports locally); `{"sent": True}` on the other ranks;
    on rank 0 `{"received": {rank: findings}, "status": {rank: exit status}, "missing": [ranks]}`."""
    launch = launched_ranks(environ)
    if launch is None:
        return None
    rank, world, addr, port, prefix = launch
    try:
        from datetime import timedelta

        from torch.distributed import TCPStore

        store = TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=wait), wait_for_workers=False)
        store.set(prefix + str(rank), json.dumps({"findings": [f.to_dict() for f in findings], "status": status}))
    except Exception:
        return None
    if rank != 0:
        return {"sent": True}
    received: dict[int, list[Finding]] = {}
    statuses: dict[int, int] = {}
    missing: list[int] = []
    deadline = time.monotonic() + wait
    for other in range(world):
        try:
            store.wait([prefix + str(other)], timedelta(seconds=max(0.1, deadline - time.monotonic())))
            payload = json.loads(store.get(prefix + str(other)))
            received[other] = [Finding.from_dict(d) for d in payload.get("findings", [])]
            statuses[other] = int(payload.get("status", 0))
        except Exception:
            missing.append(other)
    return {"received": received, "status": statuses, "missing": missing}
