"""collective-timeout: a collective (all_reduce, barrier, ...) timed out: where this rank was, and why ranks part."""

from __future__ import annotations

import re
from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import CrashEvent, RuntimeCheck

COLLECTIVE_TIMEOUT = Pitfall(
    code="TD334",
    name="collective-timeout",
    severity="error",
    summary="A collective operation timed out: one rank never joined it (a rank-only branch, uneven data, a "
    "slow rank 0); which rank was where.",
    why="""
        Every rank must call the same collectives in the same order. When one rank skips one (a
        `dist.barrier()` or an `all_reduce` inside `if rank == 0:`), runs out of batches earlier (uneven
        shards without `drop_last`), or spends longer than the timeout elsewhere (rank 0 saving a checkpoint
        or evaluating while the others wait in the next all_reduce), the others wait until the watchdog
        kills the job, ten minutes later by default, with an error that names an operation number and no
        line of the script.
    """,
    fix="""
        Make every rank take the same path through collectives: call them outside rank-conditional code,
        give every rank the same number of batches (`DistributedSampler(..., drop_last=True)`, or
        `model.join()` for uneven inputs), and put long rank-0 work behind a `dist.barrier()` that every rank
        reaches, or raise the timeout (`init_process_group(timeout=timedelta(minutes=30))`).
    """,
    bad=Example(
        """
        if dist.get_rank() == 0:
            dist.all_reduce(loss)  # rank 1 never joins this all_reduce
        """,
        setup="import torch\nimport torch.distributed as dist\n",
        unseen={
            "runtime": "needs several processes; tests/pitfalls/test_crash_explanations.py raises the "
            "error a timed-out collective raises"
        },
    ),
    good=Example(
        """
        dist.all_reduce(loss)  # every rank
        if dist.get_rank() == 0:
            print(loss.item())
        """,
        setup="import torch\nimport torch.distributed as dist\n",
        unseen={"runtime": "needs several processes"},
    ),
    details={
        "runtime": """
            When the watched code (or, under `torchrun ... -m torchdoctor run`, each rank's program) ends
            with a distributed backend error that says a collective timed out (NCCL's watchdog, gloo's
            "Timed out waiting"), the check reports this rank's number and where it was: its optimizer
            steps, and the operation, its sequence number and the timeout when the error names them. Each
            rank's report says where that rank was, so the rank that is behind stands out. Quiet for any
            other exception, including a distributed error that is not a timeout.
        """,
    },
)

_TIMEOUT = re.compile(
    r"collective operation timeout|Timed out waiting|timed out after|Timeout\(ms\)=|"
    r"wait timeout|operation timed out",
    re.I,
)
_OP = re.compile(r"OpType=([A-Z_]+)")
_SEQ = re.compile(r"SeqNum=(\d+)")
_MS = re.compile(r"Timeout\(ms\)=(\d+)|waiting (\d+)ms")


@COLLECTIVE_TIMEOUT.runtime
class CollectiveTimeout(RuntimeCheck):
    """At a crash: a collective that timed out, with where this rank was."""

    def on_crash(self, event: CrashEvent) -> Iterator[Finding]:
        import os

        from torchdoctor.sdk.runtime import evidence

        chain = list(evidence.iter_exceptions(event.exception))
        hit = next((e for e in chain if _is_distributed(e) and _TIMEOUT.search(str(e))), None)
        if hit is None:
            return
        text = str(hit)
        rank = self.ctx.rank if self.ctx.world_size > 1 else _int(os.environ.get("RANK"))
        world = self.ctx.world_size if self.ctx.world_size > 1 else _int(os.environ.get("WORLD_SIZE"))
        op, seq, ms = _OP.search(text), _SEQ.search(text), _MS.search(text)
        what = (op.group(1).lower() if op else "a collective") + (f" #{seq.group(1)}" if seq else "")
        waited = next((g for g in (ms.groups() if ms else ()) if g), None)
        steps = ", ".join(f"{wo.label} {wo.steps} steps" for wo in self.ctx.optimizers) or "no optimizer step yet"
        who = f"rank {rank}" + (f" of {world}" if world else "") if rank is not None else "this process"
        yield Finding(
            f"{what.capitalize()} timed out"
            + (f" after {int(waited) / 1000:g} s" if waited else "")
            + f" on {who}, which had done {steps}: another rank did not join it. Compare the ranks' reports: "
            "the rank that is behind (fewer steps) or absent is the one that skipped or is stuck before this "
            "collective.",
            fix=Fix(
                title="Call collectives on every rank, outside rank-only branches, and give every rank the same "
                "number of batches:",
                code="sampler = DistributedSampler(dataset, drop_last=True)\n"
                "# long work on rank 0 only: follow it with dist.barrier() on every rank, or raise the timeout",
            ),
            location=Location(rank=rank),
        )


def _is_distributed(exc: BaseException) -> bool:
    """A c10d error (DistBackendError and friends) or a RuntimeError from a backend."""
    kind = type(exc)
    return (
        kind.__module__.startswith("torch.distributed")
        or "Dist" in kind.__name__
        or (
            isinstance(exc, RuntimeError)
            and any(w in str(exc) for w in ("gloo", "NCCL", "c10d", "ProcessGroup", "Watchdog"))
        )
    )


def _int(value: "str | None") -> "int | None":
    return int(value) if value is not None and value.isdigit() else None
