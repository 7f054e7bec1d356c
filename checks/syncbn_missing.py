"""syncbn-missing: BatchNorm under DDP normalises each rank's small batch on its own (no SyncBatchNorm)."""

from __future__ import annotations

from typing import Any

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import RuntimeCheck

from ._ddp_examples import DDP_SETUP, UNSEEN

SMALL_BATCH = 16  # per-rank BatchNorm batches below this make noisy statistics (Wu & He, Group Norm, fig. 1)

SYNCBN_MISSING = Pitfall(
    code="TD404",
    name="syncbn-missing",
    severity="info",
    summary="BatchNorm under DDP with a small per-rank batch and no SyncBatchNorm.",
    why="""
        BatchNorm estimates mean and variance from the batch it sees. Under DDP that is each rank's batch, not
        the global one: with 2 to 8 samples per GPU (detection, segmentation, large inputs) the statistics are
        noisy and accuracy drops (Wu and He, "Group Normalization", 2018). `SyncBatchNorm` computes them over all
        ranks' samples at the cost of one extra collective per BatchNorm layer. Informational: with 16 or more
        samples per rank plain BatchNorm is usually fine.
    """,
    fix="""
        Convert the model with `nn.SyncBatchNorm.convert_sync_batchnorm(model)` before wrapping it in DDP, or use
        a normalisation that does not depend on the batch (GroupNorm, LayerNorm).
    """,
    bad=Example(
        """
        sampler = DistributedSampler(dataset)
        loader = DataLoader(dataset, batch_size=8, sampler=sampler)  # 8 samples per rank
        model = DDP(model.to(device))  # its BatchNorm1d normalises each rank's 8 samples on their own
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
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
        sampler = DistributedSampler(dataset)
        loader = DataLoader(dataset, batch_size=8, sampler=sampler)
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # statistics over all ranks' samples
        model = DDP(model.to(device))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
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
            For a model wrapped in `DistributedDataParallel` over every rank (with more than one rank) that
            contains BatchNorm layers other than `SyncBatchNorm`, `watch` looks at the input of the first such
            layer called in training mode: a batch dimension below 16 is reported once, as info. The hook removes
            itself after that first call; nothing is exchanged between ranks.
        """,
    },
)


@SYNCBN_MISSING.distributed
class SyncBNMissing(RuntimeCheck):
    """The first training call of a plain BatchNorm layer inside a DDP model: its input's batch size."""

    def on_start(self) -> None:
        from torch.nn.modules.batchnorm import SyncBatchNorm, _BatchNorm
        from torch.nn.modules.module import register_module_forward_pre_hook

        from torchdoctor.sdk.runtime import ddp_over_world, dynamo_tracing

        self.tracing = dynamo_tracing

        self.layers: dict[int, tuple[str, str]] = {}  # id -> (label.name, type)
        self.counts: dict[str, int] = {}
        if self.ctx.world_size < 2:
            return
        for wm in self.ctx.models:
            if ddp_over_world(wm.module, self.ctx.world_size) is None:
                continue
            for name, m in wm.inner.named_modules():
                if isinstance(m, _BatchNorm) and not isinstance(m, SyncBatchNorm):
                    self.layers[id(m)] = (f"{wm.label}.{name}" if len(self.ctx.models) > 1 else name, type(m).__name__)
            self.counts[wm.label] = sum(
                isinstance(m, _BatchNorm) and not isinstance(m, SyncBatchNorm) for m in wm.inner.modules()
            )
        if self.layers:
            self.handle = self.ctx.hooks.add(register_module_forward_pre_hook(self._pre_forward))

    def _pre_forward(self, module: Any, args: Any) -> None:
        if self.tracing():  # a layer inside a compiled forward: dynamo inlines this hook, which must add nothing
            return
        layer = self.layers.get(id(module))
        if layer is None or not module.training:
            return
        try:
            import torch

            self.ctx.hooks.remove(self.handle)
            self.layers = {}
            x = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if x is None or x.dim() < 2 or x.shape[0] >= SMALL_BATCH:
                return
            name, kind = layer
            total = sum(self.counts.values())
            layers = (
                f"The BatchNorm layer {name} ({kind})"
                if total == 1
                else f"{total} BatchNorm layers ({kind} {name} first)"
            )
            self.ctx.emit(
                self,
                Finding(
                    f"{layers} normalise{'s' if total == 1 else ''} each rank's batch of {x.shape[0]} samples on its "
                    f"own "
                    "under DistributedDataParallel: with so few samples per "
                    f"rank the batch statistics are noisy, while {self.ctx.world_size} ranks together see "
                    f"{x.shape[0] * self.ctx.world_size}.",
                    fix=Fix(
                        title="Compute BatchNorm statistics over all ranks (convert before wrapping in DDP):",
                        code="model = nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
                        "model = DDP(model.to(device), device_ids=[local_rank])",
                    ),
                    location=Location(module=name, step=self.ctx.step),
                ),
            )
        except Exception as exc:  # never break the user's forward
            self.ctx.fault(self, exc)
