"""One rank of the `watch` under DDP tests: runs every scenario in turn on one gloo process group (each
process pays for `import torch` once) and writes what each session found to OUT_DIR/rank<N>.json.

Usage: RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p OUT_DIR=d python watch_ddp_worker.py
"""

from __future__ import annotations

import json
import os
import time
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import torchdoctor

EVERY = 2


def data(n: int, seed: int, size: int = 8, d_in: int = 6) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, d_in, generator=g), torch.randint(0, 3, (size,), generator=g)) for _ in range(n)]


def net(batchnorm: bool = False) -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Linear(6, 8)] + ([nn.BatchNorm1d(8)] if batchnorm else []) + [nn.ReLU(), nn.Linear(8, 3)]
    return nn.Sequential(*layers)


def step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def session(model: nn.Module, opt: torch.optim.Optimizer, **kwargs):
    return torchdoctor.watch(model, opt, every=EVERY, on_finding=lambda f: None, report=False, **kwargs)


def buffer_drift(rank: int) -> object:
    """BatchNorm under broadcast_buffers=False, each rank on its own data: the running stats drift apart."""
    model = DDP(net(batchnorm=True), broadcast_buffers=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with session(model, opt) as s:
        for x, y in data(5, seed=10 + rank):
            step(model, opt, x, y)
    return s


def same_data(rank: int) -> object:
    """Every rank iterates the same batches (no DistributedSampler)."""
    model = DDP(net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with session(model, opt) as s:
        for x, y in data(5, seed=20):
            step(model, opt, x, y)
    return s


def param_changed(rank: int) -> object:
    """Rank 1 scales a weight by hand after step 1: outside DDP, so the ranks' models differ from then on."""
    model = DDP(net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with session(model, opt) as s:
        for i, (x, y) in enumerate(data(5, seed=30 + rank)):
            if i == 1 and rank == 1:
                with torch.no_grad():
                    model.module[2].weight.mul_(2)
            step(model, opt, x, y)
    return s


def clean(rank: int) -> object:
    """The correct loop: BatchNorm with broadcast buffers, DistributedSampler and set_epoch, two epochs."""
    g = torch.Generator().manual_seed(40)
    dataset = TensorDataset(torch.randn(160, 6, generator=g), torch.randint(0, 3, (160,), generator=g))
    sampler = DistributedSampler(dataset, shuffle=True, seed=1)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    model = DDP(net(batchnorm=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with session(model, opt, loader=loader) as s:
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for x, y in loader:
                step(model, opt, x, y)
    return s


def tutorial(rank: int) -> object:
    """PyTorch's DDP tutorial (multigpu.py, on CPU): it peeks at one batch before training, then calls
    set_epoch(epoch) at the start of each epoch, from epoch 0."""
    g = torch.Generator().manual_seed(41)
    dataset = TensorDataset(torch.randn(128, 6, generator=g), torch.randint(0, 3, (128,), generator=g))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=16, shuffle=False, sampler=sampler, pin_memory=False)
    model = DDP(net())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with session(model, opt, loader=loader) as s:
        for epoch in range(2):
            b_sz = len(next(iter(loader))[0])  # the tutorial's _run_epoch: a peek for the log line
            sampler.set_epoch(epoch)
            for x, y in loader:
                step(model, opt, x, y)
            assert b_sz == 16
    return s


def fsdp2(rank: int) -> object:
    """FSDP2 (fully_shard) on CPU/gloo where torch supports it: the checks that apply work (here a NaN batch
    at step 2), nothing fails internally; None where fully_shard cannot be imported."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        return None
    model = net()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with session(model, opt) as s:
        for i, (x, y) in enumerate(data(4, seed=50 + rank)):
            step(model, opt, x / 0 * 0 if i == 2 else x, y)  # planted: a NaN batch at step 2
    return s


def early_stop(rank: int) -> object:
    """Rank 1 leaves the session after 2 steps; rank 0 trains on alone (no_sync: no DDP collectives)."""
    model = DDP(net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with session(model, opt) as s:
        for i, (x, y) in enumerate(data(10, seed=50 + rank)):
            if rank == 1 and i == 2:
                break
            if i < 2:
                step(model, opt, x, y)
            else:
                with model.no_sync():
                    step(model, opt, x, y)
    return s


def slow_rank(rank: int) -> object:
    """Rank 1 stalls between backward and step for longer than the timeout: rank 0 gives up comparing."""
    model = DDP(net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stall = float(os.environ["TORCHDOCTOR_WATCH_TIMEOUT"]) + 1.5
    with session(model, opt) as s:
        for i, (x, y) in enumerate(data(6, seed=60 + rank)):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            if rank == 1 and i == 2:
                time.sleep(stall)
            opt.step()
    return s


def straggler(rank: int) -> object:
    """Rank 1 spends 40 ms before each forward (work rank 0 does not do): rank 0 waits in the all-reduce."""
    model = DDP(net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with session(model, opt, checks=["straggler-rank"]) as s:
        for x, y in data(14, seed=70 + rank):
            if rank == 1:
                time.sleep(0.04)
            step(model, opt, x, y)
    return s


SCENARIOS = [buffer_drift, same_data, param_changed, clean, tutorial, fsdp2, early_stop, slow_rank, straggler]


def summary(found: list) -> list[dict]:
    return [
        {
            "name": f.name,
            "severity": str(f.severity),
            "message": f.message,
            "location": f.location.to_dict() if f.location else None,
        }
        for f in found
    ]


def main() -> None:
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", FutureWarning)  # broadcast_buffers is deprecated in torch 2.13
    dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
    only = os.environ.get("SCENARIOS")
    results = {}
    for scenario in SCENARIOS:
        if only and scenario.__name__ not in only.split(","):
            continue
        start = time.perf_counter()
        s = scenario(rank)
        if s is None:
            results[scenario.__name__] = None
            continue
        results[scenario.__name__] = {
            "seconds": time.perf_counter() - start,
            "findings": summary(s.findings),
            "rank_findings": summary(s.rank_findings) if s.rank_findings is not None else None,
            "ranks": s.facts.get("ranks"),
            "step_time": s.facts.get("step_time"),
        }
        dist.barrier()  # the next scenario starts together (the slow and early ranks catch up here)
    with open(os.path.join(os.environ["OUT_DIR"], f"rank{rank}.json"), "w") as fh:
        json.dump(results, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
