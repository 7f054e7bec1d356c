"""dataparallel-slow: nn.DataParallel over several GPUs, where DistributedDataParallel is faster and balanced."""

from __future__ import annotations

from typing import Any, Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import RuntimeCheck, wrapper_chain

from ._perf import ms

_NEEDS_GPUS = (
    "it takes two GPUs (on the CPU `nn.DataParallel` keeps no device ids and just calls the module) and, "
    "for the fix, one process per GPU launched by torchrun."
)

DATAPARALLEL_SLOW = Pitfall(
    code="TD343",
    name="dataparallel-slow",
    severity="info",
    summary="nn.DataParallel trains on several GPUs from one process: slower and less balanced than "
    "DistributedDataParallel.",
    why="""
        `nn.DataParallel` runs every GPU from one Python process: at every forward it copies the model from the
        first GPU to the others, splits the batch, runs the replicas in threads that share one GIL, and gathers
        all outputs back on the first GPU, which also computes the loss and runs the optimizer. The first GPU
        is the busiest and runs out of memory first, the others wait for it, and the copies grow with the
        model: adding GPUs often adds little speed. PyTorch recommends `DistributedDataParallel` (one process
        per GPU, gradients averaged with all-reduce while the backward runs) even on a single machine.
    """,
    fix="""
        Launch one process per GPU with `torchrun --nproc_per_node=<GPUs> train.py`, and in the script
        initialise the process group, wrap the model in `DistributedDataParallel` on the process's own GPU, and
        shard the data with a `DistributedSampler` (call `set_epoch(epoch)` every epoch).
    """,
    bad=Example(
        """
        model = nn.DataParallel(Net().to("cuda:0"), device_ids=[0, 1])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in DataLoader(dataset, batch_size=64, shuffle=True):
            optimizer.zero_grad()
            criterion(model(x.to("cuda:0")), y.to("cuda:0")).backward()
            optimizer.step()
        """,
        unseen={"runtime": _NEEDS_GPUS},
    ),
    good=Example(
        """
        # torchrun --nproc_per_node=2 train.py
        torch.distributed.init_process_group("nccl")
        rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(rank)
        model = nn.parallel.DistributedDataParallel(Net().to(rank), device_ids=[rank])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        sampler = DistributedSampler(dataset)
        for x, y in DataLoader(dataset, batch_size=32, sampler=sampler):
            optimizer.zero_grad()
            criterion(model(x.to(rank)), y.to(rank)).backward()
            optimizer.step()
        """,
        unseen={"runtime": _NEEDS_GPUS},
    ),
    details={
        "runtime": """
            At the end of the session `watch` looks through each watched model's wrappers for an
            `nn.DataParallel` with two device ids or more, and reports it with the share of each step spent in
            the forward (where DataParallel replicates the model, scatters the batch and gathers the outputs)
            from the step-time breakdown. Quiet: `DataParallel` over one device or on the CPU (it only calls
            the module), and `DistributedDataParallel`.
        """,
    },
)


@DATAPARALLEL_SLOW.runtime
class DataParallelSlow(RuntimeCheck):
    """At the end: a DataParallel wrapper over two devices or more, with the forward's share of the step."""

    uses_clock = True

    def on_stop(self) -> Iterator[Finding]:
        from torch import nn

        for wm in self.ctx.models:
            for wrapper in wrapper_chain(wm.module):
                if isinstance(wrapper, nn.DataParallel) and len(wrapper.device_ids or []) > 1:
                    yield self._finding(wm.label, wrapper)

    def _finding(self, label: str, dp: Any) -> Finding:
        from torchdoctor.sdk.runtime import FORWARD

        gpus = len(dp.device_ids)
        measured = ""
        clock = self.ctx.clock
        rows = clock.rows() if clock is not None else []
        if rows:
            forward = sorted(r[FORWARD] for r in rows)[len(rows) // 2]
            step = sorted(r[-1] for r in rows)[len(rows) // 2]
            measured = (
                f" Here the forward (replicate, scatter, run, gather) took {ms(forward)} of a {ms(step)} "
                f"step (median over {len(rows)} steps)."
            )
        return Finding(
            f"{label} is wrapped in nn.DataParallel over {gpus} GPUs: one process copies the model to every GPU "
            f"at each forward and gathers every output on GPU {dp.device_ids[0]}, which also runs the loss and "
            f"the optimizer; DistributedDataParallel (one process per GPU) is faster and balanced.{measured}",
            fix=Fix(
                title=f"Run one process per GPU: torchrun --nproc_per_node={gpus} train.py, and in train.py:",
                code='torch.distributed.init_process_group("nccl")\n'
                'rank = int(os.environ["LOCAL_RANK"])\n'
                "torch.cuda.set_device(rank)\n"
                "model = nn.parallel.DistributedDataParallel(model.to(rank), device_ids=[rank])\n"
                "loader = DataLoader(dataset, batch_size=batch_size // world_size, "
                "sampler=DistributedSampler(dataset))",
            ),
            location=Location(module=label),
        )
