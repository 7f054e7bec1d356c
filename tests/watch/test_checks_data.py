"""sampler-epoch-not-set and iterable-dataset-duplication on real DataLoaders."""

from __future__ import annotations

import itertools

import torch
from conftest import mlp, names, session
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset

DATA = TensorDataset(torch.randn(16, 8), torch.randint(0, 3, (16,)))


def _epochs(sampler, set_epoch: bool, epochs: int = 3, peek: bool = False, workers: int = 0):
    loader = DataLoader(DATA, batch_size=4, sampler=sampler, num_workers=workers)
    with session(mlp(), loader=loader) as s:
        if peek:  # PyTorch's DDP tutorial: look at one batch before training
            next(iter(loader))
        for epoch in range(epochs):
            if set_epoch:
                sampler.set_epoch(epoch)
            for _ in loader:
                pass
    return s


def test_distributed_sampler_without_set_epoch_is_flagged_once():
    s = _epochs(DistributedSampler(DATA, num_replicas=2, rank=0, shuffle=True), set_epoch=False)
    [f] = s.findings
    assert (f.name, f.code, str(f.severity)) == ("sampler-epoch-not-set", "TD311", "warning")
    assert "epoch still 0" in f.message and "TensorDataset" in f.message and "set_epoch(epoch)" in f.fix.code


def test_set_epoch_each_epoch_and_unshuffled_samplers_are_quiet():
    assert _epochs(DistributedSampler(DATA, num_replicas=2, rank=0, shuffle=True), set_epoch=True).findings == []
    assert _epochs(DistributedSampler(DATA, num_replicas=2, rank=0, shuffle=False), set_epoch=False).findings == []


def test_a_peek_at_one_batch_is_not_a_pass():
    assert _epochs(DistributedSampler(DATA, num_replicas=1, rank=0), set_epoch=True, peek=True).findings == []
    s = _epochs(DistributedSampler(DATA, num_replicas=1, rank=0), set_epoch=False, peek=True)
    assert names(s) == ["sampler-epoch-not-set"]  # the peek does not hide two real passes at one epoch


def test_the_batch_counter_keeps_no_worker_alive():
    import gc
    import weakref

    loader = DataLoader(DATA, batch_size=4, sampler=DistributedSampler(DATA, num_replicas=1, rank=0), num_workers=1)
    with session(mlp(), loader=loader):
        it = iter(loader)
        next(it)
        ref = weakref.ref(it)
        del it
        assert ref() is None  # freed at once (no reference cycle): its worker process shuts down now
    gc.collect()


def test_sampler_of_a_loader_not_given_to_watch_is_seen_too():
    sampler = DistributedSampler(DATA, num_replicas=1, rank=0)
    loader = DataLoader(DATA, batch_size=8, sampler=sampler)
    with session(mlp()) as s:
        for _ in range(2):
            list(loader)
    assert names(s) == ["sampler-epoch-not-set"]


class Unsharded(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(24, dtype=torch.float32).view(24, 1))


class Sharded(IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        start, step = (info.id, info.num_workers) if info else (0, 1)
        return itertools.islice(iter(torch.arange(24, dtype=torch.float32).view(24, 1)), start, None, step)


def _read(dataset) -> object:
    loader = DataLoader(dataset, batch_size=4, num_workers=2)
    with session(mlp()) as s:
        count = sum(len(b) for b in loader)
    s.samples = count
    return s


def test_iterable_dataset_read_by_every_worker_is_flagged():
    s = _read(Unsharded())
    assert s.samples == 48  # the duplication is real: 2 workers × 24 samples
    [f] = s.findings
    assert (f.name, f.code, str(f.severity)) == ("iterable-dataset-duplication", "TD312", "error")
    assert "runs 2 workers" in f.message and "get_worker_info()" in f.fix.code


def test_iterable_dataset_that_shards_is_quiet():
    s = _read(Sharded())
    assert s.samples == 24 and s.findings == []
