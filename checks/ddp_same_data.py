"""ddp-same-data: every rank receives the identical batch, so N ranks do the work of one."""

from __future__ import annotations

from typing import Any, Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import StepEvent

from ._cross_rank import FingerprintedInForward
from ._ddp_examples import DDP_SETUP, UNSEEN

DDP_SAME_DATA = Pitfall(
    code="TD403",
    name="ddp-same-data",
    severity="error",
    summary="Every rank receives the identical batch: no DistributedSampler, so N ranks do the work of one.",
    why="""
        A `DataLoader(shuffle=True)` with the same seed on every rank, or one without any sampler, yields the same
        batches on every rank. DDP then averages N gradients of the same batch: an epoch takes as long as on one
        GPU, the extra GPUs add nothing, and the effective batch size is not what the learning rate was tuned for
        (Lightning-AI/pytorch-lightning#7813, karpathy/llama2.c#522).
    """,
    fix="""
        Give each rank its own shard with `DistributedSampler` (do not pass `shuffle=True` to the DataLoader as
        well) and call `sampler.set_epoch(epoch)` at the start of every epoch.
    """,
    bad=Example(
        """
        loader = DataLoader(dataset, batch_size=16, shuffle=True)  # the same order on every rank
        model = DDP(model.to(device))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(epochs):
            for x, y in loader:
                optimizer.zero_grad(set_to_none=True)
                loss_fn(model(x.to(device)), y.to(device)).backward()
                optimizer.step()
        """,
        setup=DDP_SETUP,
        unseen=UNSEEN,
    ),
    good=Example(
        """
        sampler = DistributedSampler(dataset, shuffle=True)  # each rank gets its own shard
        loader = DataLoader(dataset, batch_size=16, sampler=sampler)
        model = DDP(model.to(device))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for x, y in loader:
                optimizer.zero_grad(set_to_none=True)
                loss_fn(model(x.to(device)), y.to(device)).backward()
                optimizer.step()
        """,
        setup=DDP_SETUP,
        unseen=UNSEEN,
    ),
    details={
        "distributed": """
            For a model wrapped in `DistributedDataParallel` over every rank, `watch` fingerprints the inputs
            (positional and keyword) of the first training forward of every `every`-th step: per-sample sums of
            each tensor, hashed to 8 bytes. The ranks exchange the hashes at that step's optimizer step. Ranks
            whose hashes are equal at two consecutive exchanges, while their batches changed between them, are
            reported as an error; constant inputs (a fixed synthetic batch) prove nothing and stay quiet.
        """,
    },
)


@DDP_SAME_DATA.distributed
class DDPSameData(FingerprintedInForward):
    """An 8-byte hash of the first training batch of each due step. Ranks with equal hashes at two
    exchanges whose batches changed in between get the same data (constant inputs prove nothing)."""

    part = "data"

    def on_start(self) -> None:
        super().on_start()
        self.previous: Optional[tuple[int, list[Any]]] = None  # (step, each rank's hash) of the last exchange

    def on_periodic(self, event: StepEvent) -> Iterator[Finding]:
        rnd = self._round(event)
        if rnd is None:
            return
        hashes = [p.get("data") for p in rnd.payloads]
        if any(h is None for h in hashes):
            return
        previous, self.previous = self.previous, (rnd.step, hashes)
        if previous is None:
            return
        before = previous[1]
        same = sorted(
            {
                r
                for r in range(len(hashes))
                for s in range(len(hashes))
                if r != s and hashes[r] == hashes[s] and before[r] == before[s] and hashes[r] != before[r]
            }
        )
        if not same:
            return
        self.reported = True
        who = f"All {len(hashes)} ranks" if len(same) == len(hashes) else "Ranks " + ", ".join(map(str, same))
        yield Finding(
            f"{who} received identical input batches at steps {previous[0]} and {rnd.step} (the batches change "
            "from step to step, but not from rank to rank): the data is not split between ranks, so every rank "
            "trains on the same samples and the extra ranks add no data.",
            fix=Fix(
                title="Give each rank its own shard with a DistributedSampler and advance its epoch:",
                code="sampler = DistributedSampler(dataset, shuffle=True)\n"
                "loader = DataLoader(dataset, batch_size=per_rank_batch, sampler=sampler)\n"
                "for epoch in range(epochs):\n"
                "    sampler.set_epoch(epoch)\n"
                "    for x, y in loader:\n"
                "        ...",
            ),
            location=Location(step=rnd.step),
        )
