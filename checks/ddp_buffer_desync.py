"""ddp-buffer-desync: buffers (BatchNorm running statistics, masks, counters) differ across DDP ranks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall, Severity
from torchdoctor.sdk.runtime import StepEvent

from ._cross_rank import FingerprintedInForward, differing, listing, ranks_of
from ._ddp_examples import DDP_SETUP, UNSEEN

if TYPE_CHECKING:
    from torchdoctor.sdk.runtime import RankExchange

DDP_BUFFER_DESYNC = Pitfall(
    code="TD401",
    name="ddp-buffer-desync",
    severity="warning",
    summary="Buffers (BatchNorm running statistics, masks, counters) differ across DDP ranks.",
    why="""
        Buffers of a `DistributedDataParallel` model (BatchNorm running statistics, masks, counters) hold
        different values on different ranks. DDP averages gradients, so parameters stay identical on every rank;
        buffers are not gradients. With `broadcast_buffers=True` (the default) DDP copies rank 0's buffers to
        every rank at the start of each forward. With `broadcast_buffers=False` each rank updates its own
        BatchNorm `running_mean`/`running_var` from its own batches, and they drift apart: evaluation gives
        different results on different ranks, and the checkpoint rank 0 saves holds rank 0's statistics only
        (pytorch/pytorch#13711, open-mmlab/mmdetection#2539). A mask or counter buffer that differs is worse: the
        ranks then compute different models.
    """,
    fix="""
        Keep the default `broadcast_buffers=True`, or convert BatchNorm to `SyncBatchNorm` before wrapping
        (statistics are then computed over every rank's batch, so they stay identical), or average the buffers
        yourself before evaluating and saving (timm's `distribute_bn`). Buffers you change by hand must be changed
        the same way on every rank.
    """,
    bad=Example(
        """
        sampler = DistributedSampler(dataset)
        loader = DataLoader(dataset, batch_size=32, sampler=sampler)
        model = DDP(model.to(device), broadcast_buffers=False)  # each rank keeps its own BatchNorm statistics
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for x, y in loader:
                optimizer.zero_grad(set_to_none=True)
                loss_fn(model(x.to(device)), y.to(device)).backward()
                optimizer.step()
        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), "model.pt")  # rank 0's statistics only
        """,
        setup=DDP_SETUP,
        unseen=UNSEEN,
    ),
    good=Example(
        """
        sampler = DistributedSampler(dataset)
        loader = DataLoader(dataset, batch_size=32, sampler=sampler)
        model = DDP(model.to(device))  # broadcast_buffers=True (the default): rank 0's buffers at every forward
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for x, y in loader:
                optimizer.zero_grad(set_to_none=True)
                loss_fn(model(x.to(device)), y.to(device)).backward()
                optimizer.step()
        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), "model.pt")
        """,
        setup=DDP_SETUP,
        unseen=UNSEEN,
    ),
    details={
        "distributed": """
            Under an initialised process group, for a model wrapped in `DistributedDataParallel` over every rank,
            `watch` takes the sum and the sum of squares of each buffer as the inner module starts the first
            training forward of every `every`-th step: after DDP's broadcast, before BatchNorm updates the
            statistics. At the following optimizer step the ranks exchange these numbers over torchdoctor's own
            gloo group (see docs/torchrun.md) and compare them with rank 0's, within the tolerance that another
            summation order on other hardware explains. Differences in BatchNorm buffers are a warning; in any
            other buffer an error. Buffers DDP was told to ignore are left out.
        """,
    },
)


def _batchnorm_buffers(ex: "RankExchange") -> set[str]:
    """Names (as in `RankExchange.names`) of buffers that belong to BatchNorm layers."""
    from torch.nn.modules.batchnorm import _BatchNorm

    prefix_of = {id(wm): (f"{wm.label}." if len(ex.models) > 1 else "") for wm, _ in ex.models}
    return {
        f"{prefix_of[id(wm)]}{mod}.{b}" if mod else f"{prefix_of[id(wm)]}{b}"
        for wm, _ in ex.models
        for mod, m in wm.inner.named_modules()
        if isinstance(m, _BatchNorm)
        for b, _ in m.named_buffers(recurse=False)
    }


@DDP_BUFFER_DESYNC.distributed
class DDPBufferDesync(FingerprintedInForward):
    """Buffers fingerprinted as the inner module starts a due step's forward (after DDP's broadcast, before
    BatchNorm updates them), compared at PERIODIC."""

    part = "buffers"

    def on_periodic(self, event: StepEvent) -> Iterator[Finding]:
        rnd = self._round(event)
        if rnd is None or self.ex is None:
            return
        names, _ = self.ex.names("buffers")
        diffs = differing(rnd, "buffers", names)
        if not diffs:
            return
        self.reported = True
        batchnorm = _batchnorm_buffers(self.ex)
        only_bn = all(name in batchnorm for name, *_ in diffs)
        unsynced = [
            label
            for label, ddp in ((wm.label, ddp) for wm, ddp in self.ex.models)
            if not getattr(ddp, "forward_sync_buffers", getattr(ddp, "broadcast_buffers", True))
        ]
        why = (
            f" DistributedDataParallel({', '.join(unsynced)}) was built with broadcast_buffers=False, so every "
            "rank keeps its own buffers."
            if unsynced
            else " Something writes them differently per rank outside forward, after DDP's broadcast."
        )
        yield Finding(
            f"{len(diffs)} buffer(s) differ between rank 0 and {ranks_of(diffs)} at step {rnd.step}: {listing(diffs)}."
            f"{why} Evaluation and checkpoints then depend on which rank they come from"
            + (
                " (if you average them before evaluating and saving, e.g. timm's distribute_bn, this is expected)."
                if only_bn
                else "; a mask or counter that differs makes the ranks compute different models."
            ),
            fix=Fix(
                title="Keep the buffers identical on every rank:",
                code="model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # statistics over all ranks' batches\n"
                "model = DDP(model, device_ids=[local_rank])  # broadcast_buffers=True (the default) syncs them each "
                "forward",
            ),
            location=Location(key=diffs[0][0], step=rnd.step),
            severity=Severity.WARNING if only_bn else Severity.ERROR,
        )
