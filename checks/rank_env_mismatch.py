"""rank-env-mismatch: under torchrun, ranks differ in versions, launch variables or settings that must agree."""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any, Callable, Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Pitfall, Severity
from torchdoctor.sdk.env import EnvFacts, RankFacts

from ._envutil import MACHINE_STATE

RANK_ENV_MISMATCH = Pitfall(
    code="TD405",
    name="rank-env-mismatch",
    severity="error",
    summary=(
        "Under torchrun, ranks differ in torch/CUDA/NCCL/Python versions, launch variables or settings that must agree."
    ),
    why="""
        Under torchrun, the ranks of one job run different torch/CUDA/cuDNN/NCCL/Python versions, use different GPU
        models, disagree on the launch variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT), or set
        variables that must agree (NCCL_*, CUBLAS_WORKSPACE_CONFIG, TORCH_DISTRIBUTED_DEBUG, OMP_NUM_THREADS, ...)
        differently. Each rank alone looks healthy; only comparing them shows the problem.

        - Mismatched torch or NCCL builds make collectives hang or abort, often with nothing clearer than
          `NCCL WARN ... unhandled system error` or a timeout after 30 minutes
          (`Watchdog caught collective operation timeout`).
        - Two ranks on one host with the same LOCAL_RANK share a GPU: `NCCL WARN Duplicate GPU detected : rank 0
          and rank 1 both on CUDA device ...`.
        - A WORLD_SIZE or MASTER_ADDR that differs between nodes means the rendezvous never completes.
        - Different GPU models make every step wait for the slowest one, and kernels/TF32 defaults differ.
        - A rank that never reports crashed before the job started or cannot reach MASTER_ADDR:MASTER_PORT.
    """,
    fix="""
        Run every node from one image or one shared environment, launch every node with the same torchrun
        arguments (only `--node-rank` differs, or use `--rdzv-backend=c10d`), and export settings such as
        `NCCL_*` or `CUBLAS_WORKSPACE_CONFIG` through the job launcher so that each rank sees the same value.
    """,
    bad=Example(
        """
            # node 0 was upgraded, node 1 was not
            node0$ torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 --master-addr node0 train.py  # torch 2.5.1
            node1$ torchrun --nnodes 2 --node-rank 1 --nproc-per-node 8 --master-addr node0 train.py  # torch 2.4.0
        """,
        language="bash",
        unseen={"env": MACHINE_STATE},
    ),
    good=Example(
        """
            # check the job's environment first: every rank reports to rank 0, which prints one report
            node0$ torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 --master-addr node0 -m torchdoctor env
            node1$ torchrun --nnodes 2 --node-rank 1 --nproc-per-node 8 --master-addr node0 -m torchdoctor env
        """,
        language="bash",
        unseen={"env": MACHINE_STATE},
    ),
    details={
        "env": """
            `torchdoctor env` notices that it was launched as one rank of several (RANK, WORLD_SIZE, MASTER_ADDR and
            MASTER_PORT set by torchrun, which also sets TORCHELASTIC_RUN_ID, or by torch.distributed.launch, which
            passes `--local-rank`; `--distributed` insists on it for other launchers). The same variables without
            a launcher are an info note, with no waiting: they are usually left over in a shell. Each rank gathers its
            own facts and findings; its torch
            probe then writes a short summary into the launcher's TCPStore (torchrun's agent store, or one rank 0
            hosts), and rank 0 collects every summary, waiting at most `--timeout` seconds: a rank that never comes
            is reported, never waited for. Rank 0 compares the summaries and prints one report for the whole job,
            each finding saying on which ranks it was seen; the other ranks print nothing and exit 0.
            Versions and launch variables are errors; GPU models and settings that differ are warnings.
            See the guide `docs/torchrun.md` for running it on one and on several machines.
        """,
    },
)


def _env_var(name: str, rank: RankFacts) -> Optional[str]:
    """The value of one environment variable on a rank (None when unset)."""
    return rank.env_vars.get(name)


def _by_value(ranks: list[RankFacts], get: Callable[[RankFacts], Any]) -> dict[Any, list[int]]:
    """The ranks grouped by the value `get` reads from each."""
    groups: dict[Any, list[int]] = defaultdict(list)
    for r in ranks:
        groups[get(r)].append(r.rank)
    return groups


def _describe(groups: dict[Any, list[int]]) -> str:
    """Groups of ranks as text: '2.5.1 on rank 0, 1; 2.4.0 on rank 2'."""
    return "; ".join(
        f"{value if value is not None else 'unset'} on rank {', '.join(map(str, ranks))}"
        for value, ranks in sorted(groups.items(), key=lambda kv: kv[1])
    )


@RANK_ENV_MISMATCH.env
def rank_env_mismatch(facts: EnvFacts) -> Iterator[Finding]:
    """Ranks that did not report, or that disagree on what every rank must share; launch variables
    without a launcher are a note."""
    ranks = facts.ranks
    launch = facts.launch
    if (
        launch is not None
        and launch.run_id is None
        and launch.local_rank_arg is None
        and not ranks
        and not facts.missing_ranks
    ):
        launch_vars = [
            n for n in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if n in facts.env_vars
        ]
        if launch_vars:
            yield Finding(
                f"{', '.join(f'{n}={facts.env_vars[n]}' for n in launch_vars)} are set, but no launcher started this "
                "process, so only this machine was examined. Left in a shell, they make the next "
                "`init_process_group()` wait for ranks that never come.",
                fix=Fix(
                    title=f"unset {' '.join(launch_vars)} (or launch with `torchrun --nproc-per-node N -m "
                    "torchdoctor env`; "
                    "`--distributed` compares ranks started by another launcher)."
                ),
                severity=Severity.INFO,
            )
    if facts.missing_ranks:
        doing = [
            f"rank {r} was {facts.missing_doing[str(r)]}" for r in facts.missing_ranks if str(r) in facts.missing_doing
        ]
        silent = [str(r) for r in facts.missing_ranks if str(r) not in facts.missing_doing]
        if silent:
            doing.append(
                f"rank {', '.join(silent)} never reached the launcher's store (still importing torch, "
                "crashed before, or cannot reach MASTER_ADDR:MASTER_PORT)"
            )
        yield Finding(
            f"Rank(s) {', '.join(map(str, facts.missing_ranks))} did not report to rank 0 in time: "
            + "; ".join(doing)
            + ".",
            fix=Fix(
                title="Read those ranks' own reports: a rank that cannot reach rank 0 prints its own (torchrun "
                "shows it "
                "with --tee 3 / --log-dir); check that every node can reach MASTER_ADDR:MASTER_PORT."
            ),
        )
    if len(ranks) < 2:
        return
    world = _by_value(ranks, lambda r: r.world_size)
    if len(world) > 1:
        yield Finding(
            f"Ranks disagree on WORLD_SIZE: {_describe(world)}.",
            fix=Fix(title="Launch every node with the same --nnodes and --nproc-per-node."),
        )
    dupes = {rank: n for rank, n in _by_value(ranks, lambda r: r.rank).items() if len(n) > 1}
    if dupes:
        yield Finding(
            f"Several processes claim the same RANK ({', '.join(map(str, dupes))}).",
            fix=Fix(title="Give each node its own --node-rank (or use a rendezvous backend: --rdzv-backend=c10d)."),
        )
    local = {key: n for key, n in _by_value(ranks, lambda r: (r.hostname, r.local_rank)).items() if len(n) > 1}
    for (host, local_rank), n in local.items():
        yield Finding(
            f"Ranks {', '.join(map(str, n))} on {host} share LOCAL_RANK={local_rank}: they will use the "
            "same GPU ('NCCL WARN Duplicate GPU detected').",
            fix=Fix(title="Start one torchrun per node; don't set LOCAL_RANK by hand."),
            key=f"{host} {local_rank}",
        )
    master = _by_value(ranks, lambda r: (r.master_addr, r.master_port))
    if len(master) > 1:
        yield Finding(
            f"Ranks disagree on MASTER_ADDR:MASTER_PORT: {_describe(master)}.",
            fix=Fix(title="Pass the same --master-addr/--master-port (or --rdzv-endpoint) on every node."),
        )
    for label, get in (
        ("torch", lambda r: r.torch.get("version")),
        ("CUDA", lambda r: r.torch.get("cuda")),
        ("cuDNN", lambda r: r.torch.get("cudnn")),
        ("NCCL", lambda r: r.torch.get("nccl")),
        ("Python", lambda r: r.python),
    ):
        groups = _by_value(ranks, get)
        if len(groups) > 1:
            yield Finding(
                f"Ranks run different {label} versions: {_describe(groups)}. Collectives can hang or fail with "
                "mismatched builds, and results differ between ranks.",
                fix=Fix(title="Use one environment image (or one shared venv/conda env) on every node."),
                key=label,
            )
    gpus = _by_value(ranks, lambda r: r.gpu)
    if len(gpus) > 1:
        yield Finding(
            f"Ranks use different GPU models: {_describe(gpus)}. Every step waits for the slowest GPU, and "
            "numerics (TF32, kernels chosen) can differ.",
            fix=Fix(title="Schedule the job on identical GPUs (or accept the slowest GPU's pace)."),
            severity=Severity.WARNING,
        )
    names = sorted({k for r in ranks for k in r.env_vars})
    for name in names:
        groups = _by_value(ranks, functools.partial(_env_var, name))
        if len(groups) > 1:
            yield Finding(
                f"{name} differs between ranks: {_describe(groups)}.",
                fix=Fix(
                    title=f"Export the same {name} on every node (or pass it through the job launcher's environment)."
                ),
                severity=Severity.WARNING,
                key=name,
            )
