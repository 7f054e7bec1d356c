"""Cross-rank runtime checks of `watch` under DistributedDataParallel: buffers and parameters that drift
apart, ranks fed identical batches, and BatchNorm on small per-rank batches without SyncBatchNorm.

Fingerprints are exchanged at PERIODIC points over torchdoctor's own gloo group with a timeout
(`torchdoctor.watch.distributed`); every rank makes the same comparison on the same data, so each
reports the same finding at the same step (and ``on_finding="raise"`` stops all of them together).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Optional

from torchdoctor.findings import Finding, Location, Severity
from torchdoctor.registry import Scope, check
from torchdoctor.watch.contract import RuntimeCheck, StepEvent

if TYPE_CHECKING:
    from torchdoctor.watch.distributed import RankExchange, Round

SHOWN = 4  # names listed in a message
SMALL_BATCH = 16  # per-rank BatchNorm batches below this make noisy statistics (Wu & He, Group Norm, fig. 1)


def _exchange(chk: RuntimeCheck, part: str) -> Optional["RankExchange"]:
    """The session's exchange when `part` can be compared (a DDP model spanning every rank), else None."""
    from torchdoctor.watch.distributed import exchange_for

    if chk.ctx.world_size < 2:
        return None
    ex = exchange_for(chk.ctx)
    return ex if ex.want(part, chk) else None


def _differing(rnd: "Round", part: str, names: list[str]) -> list[tuple[str, list[int], float, float]]:
    """(name, ranks whose tensor differs from rank 0's, rank 0's sum, the first such rank's sum) per tensor."""
    from torchdoctor.watch.distributed import stats_differ

    vectors = [v for v in (p.get(part) for p in rnd.payloads) if v is not None]
    if len(vectors) != len(rnd.payloads) or any(len(v) != len(names) for v in vectors):
        return []  # some rank took no fingerprint at this step, or the models differ: nothing to compare
    out = []
    for i, name in enumerate(names):
        ranks = [r for r in range(1, len(vectors)) if stats_differ(vectors[0][i], vectors[r][i])]
        if ranks:
            out.append((name, ranks, vectors[0][i][0], vectors[ranks[0]][i][0]))
    return out


def _listing(diffs: list[tuple[str, list[int], float, float]]) -> str:
    shown = [f"{name} (sum {a:.6g} on rank 0, {b:.6g} on rank {ranks[0]})" for name, ranks, a, b in diffs[:SHOWN]]
    more = f" and {len(diffs) - SHOWN} more" if len(diffs) > SHOWN else ""
    return ", ".join(shown) + more


def _ranks(diffs: list[tuple[str, list[int], float, float]]) -> str:
    ranks = sorted({r for _, rs, _, _ in diffs for r in rs})
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _batchnorm_buffers(ex: "RankExchange") -> set[str]:
    """Names (as in `RankExchange.names`) of buffers that belong to BatchNorm layers."""
    from torch.nn.modules.batchnorm import _BatchNorm

    prefix_of = {id(wm): (f"{wm.label}." if len(ex.models) > 1 else "") for wm, _ in ex.models}
    return {f"{prefix_of[id(wm)]}{mod}.{b}" if mod else f"{prefix_of[id(wm)]}{b}"
            for wm, _ in ex.models for mod, m in wm.inner.named_modules() if isinstance(m, _BatchNorm)
            for b, _ in m.named_buffers(recurse=False)}


class _CrossRankCheck(RuntimeCheck):
    """A check that compares one `part` of the ranks' fingerprints at PERIODIC, and reports once."""

    part = ""

    def on_start(self) -> None:
        self.ex = _exchange(self, self.part)
        self.reported = False

    def _round(self, event: StepEvent) -> Optional["Round"]:
        """This step's exchanged fingerprints, or None (nothing to compare, or already reported)."""
        if self.ex is None or self.reported:
            return None
        return self.ex.round(event)


class _FingerprintedInForward(_CrossRankCheck):
    """Its fingerprint is taken in the next due step's forward, which the exchange arms after each step."""

    def on_step_post(self, event: StepEvent) -> None:
        if self.ex is not None and not self.reported:
            self.ex.on_step_post(event)


@check(code="TD401", name="ddp-buffer-desync", scope=Scope.DISTRIBUTED, severity="warning",
       summary="Buffers (BatchNorm running statistics, masks, counters) differ across DDP ranks.")
class DDPBufferDesync(_FingerprintedInForward):
    """Buffers fingerprinted as the inner module starts a due step's forward (after DDP's broadcast, before
    BatchNorm updates them), compared at PERIODIC."""

    part = "buffers"

    def on_periodic(self, event: StepEvent) -> Iterator[Finding]:
        rnd = self._round(event)
        if rnd is None or self.ex is None:
            return
        names, _ = self.ex.names("buffers")
        diffs = _differing(rnd, "buffers", names)
        if not diffs:
            return
        self.reported = True
        batchnorm = _batchnorm_buffers(self.ex)
        only_bn = all(name in batchnorm for name, *_ in diffs)
        unsynced = [label for label, ddp in ((wm.label, ddp) for wm, ddp in self.ex.models)
                    if not getattr(ddp, "forward_sync_buffers", getattr(ddp, "broadcast_buffers", True))]
        why = (f" DistributedDataParallel({', '.join(unsynced)}) was built with broadcast_buffers=False, so every "
               "rank keeps its own buffers." if unsynced else
               " Something writes them differently per rank outside forward, after DDP's broadcast.")
        yield Finding(
            f"{len(diffs)} buffer(s) differ between rank 0 and {_ranks(diffs)} at step {rnd.step}: {_listing(diffs)}."
            f"{why} Evaluation and checkpoints then depend on which rank they come from"
            + (" (if you average them before evaluating and saving, e.g. timm's distribute_bn, this is expected)."
               if only_bn else "; a mask or counter that differs makes the ranks compute different models."),
            fix="Keep the buffers identical on every rank:\n"
                "model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # statistics over all ranks' batches\n"
                "model = DDP(model, device_ids=[local_rank])  # broadcast_buffers=True (the default) syncs them each forward",
            location=Location(key=diffs[0][0], step=rnd.step),
            severity=Severity.WARNING if only_bn else Severity.ERROR)


@check(code="TD402", name="ddp-param-desync", scope=Scope.DISTRIBUTED, severity="error",
       summary="Parameters differ across DDP ranks: something changed them outside DDP's synchronised update.")
class DDPParamDesync(_CrossRankCheck):
    """Parameters fingerprinted at PERIODIC (before the step: every rank holds the result of the same
    averaged updates there) and compared with rank 0's."""

    part = "params"

    def on_periodic(self, event: StepEvent) -> Iterator[Finding]:
        rnd = self._round(event)
        if rnd is None or self.ex is None:
            return
        names, _ = self.ex.names("params")
        diffs = _differing(rnd, "params", names)
        if not diffs:
            return
        self.reported = True
        yield Finding(
            f"{len(diffs)} parameter(s) differ between rank 0 and {_ranks(diffs)} at step {rnd.step}, although DDP "
            f"keeps them identical: {_listing(diffs)}. They were changed outside DDP's averaged update on some ranks "
            "only (an update under `if rank == 0:`, a checkpoint loaded on one rank after wrapping, a per-rank "
            "learning rate or optimizer), so the ranks now train different models.",
            fix="Change parameters identically on every rank; load checkpoints on every rank before wrapping in DDP,\n"
                "or copy rank 0's values to all ranks:\n"
                "with torch.no_grad():\n"
                "    for p in model.module.parameters():\n"
                "        dist.broadcast(p, src=0)",
            location=Location(param=diffs[0][0], step=rnd.step))


@check(code="TD403", name="ddp-same-data", scope=Scope.DISTRIBUTED, severity="error",
       summary="Every rank receives the identical batch: no DistributedSampler, so N ranks do the work of one.")
class DDPSameData(_FingerprintedInForward):
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
        same = sorted({r for r in range(len(hashes)) for s in range(len(hashes))
                       if r != s and hashes[r] == hashes[s] and before[r] == before[s] and hashes[r] != before[r]})
        if not same:
            return
        self.reported = True
        who = f"All {len(hashes)} ranks" if len(same) == len(hashes) else "Ranks " + ", ".join(map(str, same))
        yield Finding(
            f"{who} received identical input batches at steps {previous[0]} and {rnd.step} (the batches change "
            "from step to step, but not from rank to rank): the data is not split between ranks, so every rank "
            "trains on the same samples and the extra ranks add no data.",
            fix="Give each rank its own shard with a DistributedSampler and advance its epoch:\n"
                "sampler = DistributedSampler(dataset, shuffle=True)\n"
                "loader = DataLoader(dataset, batch_size=per_rank_batch, sampler=sampler)\n"
                "for epoch in range(epochs):\n"
                "    sampler.set_epoch(epoch)\n"
                "    for x, y in loader:\n"
                "        ...",
            location=Location(step=rnd.step))


@check(code="TD404", name="syncbn-missing", scope=Scope.DISTRIBUTED, severity="info",
       summary="BatchNorm under DDP with a small per-rank batch and no SyncBatchNorm.")
class SyncBNMissing(RuntimeCheck):
    """The first training call of a plain BatchNorm layer inside a DDP model: its input's batch size."""

    def on_start(self) -> None:
        from torch.nn.modules.batchnorm import SyncBatchNorm, _BatchNorm
        from torch.nn.modules.module import register_module_forward_pre_hook

        from torchdoctor.watch.distributed import ddp_over_world

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
            self.counts[wm.label] = sum(isinstance(m, _BatchNorm) and not isinstance(m, SyncBatchNorm)
                                        for m in wm.inner.modules())
        if self.layers:
            self.handle = self.ctx.hooks.add(register_module_forward_pre_hook(self._pre_forward))

    def _pre_forward(self, module: Any, args: Any) -> None:
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
            layers = f"The BatchNorm layer {name} ({kind})" if total == 1 else \
                f"{total} BatchNorm layers ({kind} {name} first)"
            self.ctx.emit(self, Finding(
                f"{layers} normalise{'s' if total == 1 else ''} each rank's batch of {x.shape[0]} samples on its own "
                "under DistributedDataParallel: with so few samples per "
                f"rank the batch statistics are noisy, while {self.ctx.world_size} ranks together see "
                f"{x.shape[0] * self.ctx.world_size}.",
                fix="Compute BatchNorm statistics over all ranks (convert before wrapping in DDP):\n"
                    "model = nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
                    "model = DDP(model.to(device), device_ids=[local_rank])",
                location=Location(module=name, step=self.ctx.step)))
        except Exception as exc:  # never break the user's forward
            self.ctx.fault(self, exc)
