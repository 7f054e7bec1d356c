"""Distributed checks of `torchdoctor env` under torchrun: ranks that disagree (versions, GPUs, launch
variables, settings that must match) and launchers that pass `--local-rank`."""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Iterator

from torchdoctor.env.facts import EnvFacts, RankFacts
from torchdoctor.findings import Finding, Severity
from torchdoctor.registry import Scope, check


def _by_value(ranks: list[RankFacts], get: Callable[[RankFacts], Any]) -> dict[Any, list[int]]:
    groups: dict[Any, list[int]] = defaultdict(list)
    for r in ranks:
        groups[get(r)].append(r.rank)
    return groups


def _describe(groups: dict[Any, list[int]]) -> str:
    return "; ".join(f"{value if value is not None else 'unset'} on rank {', '.join(map(str, ranks))}"
                     for value, ranks in sorted(groups.items(), key=lambda kv: kv[1]))


@check(code="TD405", name="rank-env-mismatch", scope=Scope.ENV, severity="error",
       summary="Under torchrun, ranks differ in torch/CUDA/NCCL/Python versions, launch variables or settings that must agree.")
def rank_env_mismatch(facts: EnvFacts) -> Iterator[Finding]:
    ranks = facts.ranks
    if facts.missing_ranks:
        yield Finding(
            f"Rank(s) {', '.join(map(str, facts.missing_ranks))} did not report to rank 0 in time: they crashed "
            "before torchdoctor ran, hang (e.g. in CUDA initialisation), or cannot reach MASTER_ADDR:MASTER_PORT.",
            fix="Look at those ranks' own output (torchrun prints it with --tee 3 / --log-dir), and check that "
                "every node can reach MASTER_ADDR:MASTER_PORT.",
        )
    if len(ranks) < 2:
        return
    world = _by_value(ranks, lambda r: r.world_size)
    if len(world) > 1:
        yield Finding(f"Ranks disagree on WORLD_SIZE: {_describe(world)}.",
                      fix="Launch every node with the same --nnodes and --nproc-per-node.")
    dupes = {rank: n for rank, n in _by_value(ranks, lambda r: r.rank).items() if len(n) > 1}
    if dupes:
        yield Finding(f"Several processes claim the same RANK ({', '.join(map(str, dupes))}).",
                      fix="Give each node its own --node-rank (or use a rendezvous backend: --rdzv-backend=c10d).")
    local = {key: n for key, n in _by_value(ranks, lambda r: (r.hostname, r.local_rank)).items() if len(n) > 1}
    for (host, local_rank), n in local.items():
        yield Finding(f"Ranks {', '.join(map(str, n))} on {host} share LOCAL_RANK={local_rank}: they will use the "
                      "same GPU ('NCCL WARN Duplicate GPU detected').",
                      fix="Start one torchrun per node; don't set LOCAL_RANK by hand.")
    master = _by_value(ranks, lambda r: (r.master_addr, r.master_port))
    if len(master) > 1:
        yield Finding(f"Ranks disagree on MASTER_ADDR:MASTER_PORT: {_describe(master)}.",
                      fix="Pass the same --master-addr/--master-port (or --rdzv-endpoint) on every node.")
    for label, get in (("torch", lambda r: r.torch.get("version")), ("CUDA", lambda r: r.torch.get("cuda")),
                       ("cuDNN", lambda r: r.torch.get("cudnn")), ("NCCL", lambda r: r.torch.get("nccl")),
                       ("Python", lambda r: r.python)):
        groups = _by_value(ranks, get)
        if len(groups) > 1:
            yield Finding(
                f"Ranks run different {label} versions: {_describe(groups)}. Collectives can hang or fail with "
                "mismatched builds, and results differ between ranks.",
                fix="Use one environment image (or one shared venv/conda env) on every node.",
            )
    gpus = _by_value(ranks, lambda r: r.gpu)
    if len(gpus) > 1:
        yield Finding(
            f"Ranks use different GPU models: {_describe(gpus)}. Every step waits for the slowest GPU, and "
            "numerics (TF32, kernels chosen) can differ.",
            fix="Schedule the job on identical GPUs (or accept the slowest GPU's pace).",
            severity=Severity.WARNING,
        )
    names = sorted({k for r in ranks for k in r.env_vars})
    for name in names:
        groups = _by_value(ranks, lambda r: r.env_vars.get(name))
        if len(groups) > 1:
            yield Finding(
                f"{name} differs between ranks: {_describe(groups)}.",
                fix=f"Export the same {name} on every node (or pass it through the job launcher's environment).",
                severity=Severity.WARNING,
            )


@check(code="TD406", name="local-rank-argument", scope=Scope.ENV, severity="error",
       summary="The launcher passes --local-rank (torch.distributed.launch); scripts parsing only --local_rank break.")
def local_rank_argument(facts: EnvFacts) -> Iterator[Finding]:
    arg = facts.launch.local_rank_arg if facts.launch else None
    if arg is None:
        return
    yield Finding(
        f"This process was started with `{arg}=N` in its arguments: it was launched by torch.distributed.launch "
        "(deprecated), which passes `--local-rank=N` since torch 2.0 (`--local_rank=N` before). A training "
        "script that declares only one spelling fails with 'error: unrecognized arguments: --local-rank=0', "
        "and under torchrun no such argument comes at all.",
        fix="Launch with torchrun and read the rank from the environment:\n"
            "    local_rank = int(os.environ[\"LOCAL_RANK\"])\n"
            "or accept both spellings: parser.add_argument(\"--local-rank\", \"--local_rank\", type=int, "
            "default=int(os.environ.get(\"LOCAL_RANK\", 0)))",
        severity=Severity.WARNING,
    )
