"""`torchdoctor env` under torchrun: read the launch variables, summarise this rank for rank 0, and fold
every rank's findings into one report that says which ranks saw what."""

from __future__ import annotations

import dataclasses
import platform
from typing import Any, Mapping, Optional

from torchdoctor.env.facts import EnvFacts, LaunchFacts, RankFacts
from torchdoctor.findings import Finding, merge_ranks

# Variables that change collective or numerical behaviour: every rank must see the same value.
MUST_AGREE = (
    "TORCH_DISTRIBUTED_DEBUG",
    "CUBLAS_WORKSPACE_CONFIG",
    "CUDA_DEVICE_ORDER",
    "PYTORCH_CUDA_ALLOC_CONF",
    "NCCL_P2P_DISABLE",
    "NCCL_IB_DISABLE",
    "NCCL_SHM_DISABLE",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_NET",
    "NCCL_BUFFSIZE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCH_NCCL_BLOCKING_WAIT",
    "OMP_NUM_THREADS",
)


def _int(value: Optional[str]) -> Optional[int]:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def launch_facts(environ: Mapping[str, str], local_rank_arg: Optional[str] = None) -> Optional[LaunchFacts]:
    """The launch variables a launcher set, or None when nothing says this process was launched as a rank."""
    launch = LaunchFacts(
        rank=_int(environ.get("RANK")),
        local_rank=_int(environ.get("LOCAL_RANK")),
        world_size=_int(environ.get("WORLD_SIZE")),
        local_world_size=_int(environ.get("LOCAL_WORLD_SIZE")),
        master_addr=environ.get("MASTER_ADDR"),
        master_port=environ.get("MASTER_PORT"),
        run_id=environ.get("TORCHELASTIC_RUN_ID"),
        local_rank_arg=local_rank_arg,
    )
    if launch.rank is None and launch.world_size is None and local_rank_arg is None:
        return None
    return launch


def multi_rank_problem(launch: Optional[LaunchFacts]) -> Optional[str]:
    """Why ranks cannot be compared (None when they can): a variable is missing or there is one rank."""
    if launch is None:
        return "no RANK/WORLD_SIZE in the environment: launch with `torchrun --nproc-per-node N -m torchdoctor env`"
    missing = [
        name
        for name, value in (
            ("RANK", launch.rank),
            ("WORLD_SIZE", launch.world_size),
            ("MASTER_ADDR", launch.master_addr),
            ("MASTER_PORT", launch.master_port),
        )
        if value is None
    ]
    if missing:
        return f"{', '.join(missing)} missing from the environment (the launcher sets them)"
    if launch.world_size is not None and launch.world_size < 2:
        return "WORLD_SIZE is 1: there is only one rank"
    return None


def launched_by_launcher(launch: Optional[LaunchFacts]) -> bool:
    """Whether a launcher started this process (torchrun's run id, or torch.distributed.launch's --local-rank),
    as opposed to RANK/WORLD_SIZE/MASTER_* left over in a shell."""
    return launch is not None and (launch.run_id is not None or launch.local_rank_arg is not None)


def rank_summary(facts: EnvFacts, findings: list[Finding]) -> dict[str, Any]:
    """This rank's payload for rank 0 (the probe adds the torch versions before sending it)."""
    launch = facts.launch or LaunchFacts()
    gpus = facts.nvidia.gpus
    gpu = None
    if gpus:
        gpu = (
            gpus[launch.local_rank].name
            if launch.local_rank is not None and launch.local_rank < len(gpus)
            else gpus[0].name
        )
    summary = RankFacts(
        rank=launch.rank or 0,
        hostname=platform.node(),
        local_rank=launch.local_rank,
        world_size=launch.world_size,
        local_world_size=launch.local_world_size,
        master_addr=launch.master_addr,
        master_port=launch.master_port,
        python=facts.system.python,
        gpu=gpu,
        env_vars={k: v for k, v in facts.env_vars.items() if k in MUST_AGREE},
        findings=[f.to_dict() for f in findings],
    )
    return dataclasses.asdict(summary)


def parse_ranks(answer: Optional[dict[str, Any]], world_size: int) -> "tuple[list[RankFacts], list[int]]":
    """Rank 0's view of the exchange: the summaries that arrived and the ranks that did not."""
    if not answer:
        return [], list(range(1, world_size))
    fields = {f.name for f in dataclasses.fields(RankFacts)}
    ranks = [RankFacts(**{k: v for k, v in r.items() if k in fields}) for r in answer.get("ranks", [])]
    return sorted(ranks, key=lambda r: r.rank), sorted(answer.get("missing", []))


def fold_ranks(own: list[Finding], ranks: list[RankFacts], own_rank: int = 0) -> list[Finding]:
    """One finding per problem, saying which ranks saw it: rank 0's own findings plus the other ranks'."""
    received = {own_rank: own}
    received.update({r.rank: [Finding.from_dict(d) for d in r.findings] for r in ranks if r.rank != own_rank})
    return merge_ranks(received, cross_rank={"rank-env-mismatch"})


def exchange_without_torch(payload: dict[str, Any], facts: EnvFacts, timeout: float) -> Optional[dict[str, Any]]:
    """For a rank whose torch probe could not take part in the exchange (its `import torch` failed or hung): post
    this rank's summary through the launcher's store with a plain-Python client, so that rank 0 reports it; on
    rank 0, collect every rank's summary the same way (possible where the launcher's agent hosts the store, as
    torchrun's does). Answers like `RunningProbe.exchange`; None when the store cannot be reached."""
    import json
    import time

    from torchdoctor.env.store import connect

    launch = facts.launch or LaunchFacts()
    rank, world = launch.rank or 0, launch.world_size or 1
    prefix = "torchdoctor/env/" + (launch.run_id or "run") + "/"
    payload = {
        **payload,
        "torch": {"version": facts.torch_version, "cuda": facts.torch_cuda, "cudnn": None, "hip": None, "nccl": None},
    }
    client, _ = connect(launch.master_addr, launch.master_port, timeout)
    if client is None:
        return None
    try:
        client.set(prefix + str(rank), json.dumps(payload, default=str).encode())
        if rank != 0:
            return {"kind": "sent"}
        deadline = time.monotonic() + timeout
        pending, ranks = set(range(world)), []
        while pending and time.monotonic() < deadline:
            for r in sorted(pending):
                if client.check(prefix + str(r)):
                    ranks.append(json.loads(client.get(prefix + str(r))))
                    pending.discard(r)
            if pending:
                time.sleep(0.05)
        doing = {
            str(r): client.get(f"{prefix}doing/{r}").decode("utf-8", "replace")
            for r in sorted(pending)
            if client.check(f"{prefix}doing/{r}")
        }
        client.set(prefix + "collected", b"1")
        return {"ranks": ranks, "missing": sorted(pending), "doing": doing}
    except (OSError, ValueError):
        return None
    finally:
        client.close()
