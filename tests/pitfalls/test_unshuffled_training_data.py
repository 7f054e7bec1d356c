"""unshuffled-training-data (TD323): a class-sorted training loader without shuffling is reported, and learns
worse than the shuffled one; validation loaders, time series, IterableDatasets and shuffling samplers are quiet."""

import torch
from pitfall_training import train
from torch import nn
from torch.utils.data import (
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    Subset,
    TensorDataset,
    WeightedRandomSampler,
)
from torch.utils.data.distributed import DistributedSampler

import torchdoctor
from torchdoctor import registry

UNSHUFFLED = registry.get("unshuffled-training-data")


def _accuracy(ns):
    with torch.no_grad():
        return (ns["model"](ns["x_all"]).argmax(1) == ns["y_all"]).float().mean().item()


def test_bad_example_learns_worse_and_is_flagged():
    bad_found, bad = train(UNSHUFFLED, UNSHUFFLED.bad, 5, _accuracy)
    good_found, good = train(UNSHUFFLED, UNSHUFFLED.good, 5, _accuracy)
    assert bad < good - 0.08, (bad, good)  # the class-sorted epochs end on one class
    [f] = bad_found
    assert f.code == "TD323" and "96% one class" in f.message and "shuffle=True" in f.fix.code
    assert good_found == []


X = torch.randn(256, 4)
Y = torch.arange(256) // 64  # stored class by class


class Images(Dataset):
    """A torchvision-style dataset: samples loaded on demand, labels declared in `targets`."""

    def __init__(self):
        self.targets = Y.tolist()

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        return X[i], self.targets[i]


class Stream(IterableDataset):
    def __iter__(self):
        return iter(zip(X, Y))


def _run(train_loader, val_loader=None, epochs=2):
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchdoctor.watch(model, opt, checks=[UNSHUFFLED.name], on_finding=lambda f: None, report=False) as s:
        for _ in range(epochs):
            for x, y in train_loader:
                opt.zero_grad()
                out = model(x)
                (
                    nn.functional.cross_entropy(out, y.long())
                    if not y.is_floating_point()
                    else nn.functional.mse_loss(out[:, 0], y)
                ).backward()
                opt.step()
            for x, _ in val_loader or []:
                with torch.no_grad():
                    model(x)
    return s.findings


def test_fires_on_declared_labels_through_subsets_and_unshuffled_distributed_samplers():
    for loader in (
        DataLoader(Images(), batch_size=16),
        DataLoader(Subset(Images(), range(0, 256, 2)), batch_size=16),
        DataLoader(
            TensorDataset(X, Y),
            batch_size=16,
            sampler=DistributedSampler(TensorDataset(X, Y), num_replicas=1, rank=0, shuffle=False),
        ),
    ):
        [f] = _run(loader)
        assert f.code == "TD323"


def test_quiet_on_validation_time_series_streams_and_shuffling_samplers():
    ds = TensorDataset(X, Y)
    shuffled = DataLoader(ds, batch_size=16, shuffle=True)
    assert _run(shuffled, val_loader=DataLoader(Images(), batch_size=16)) == []  # sorted, but only evaluated
    series = TensorDataset(X, torch.linspace(0, 1, 256))  # float targets in time order
    assert _run(DataLoader(series, batch_size=16)) == []
    assert _run(DataLoader(Stream(), batch_size=16)) == []
    assert _run(DataLoader(ds, batch_size=16, sampler=RandomSampler(ds))) == []
    assert _run(DataLoader(ds, batch_size=16, sampler=WeightedRandomSampler(torch.ones(256), 256))) == []
    interleaved = TensorDataset(X, torch.arange(256) % 4)  # unshuffled, but every batch holds every class
    assert _run(DataLoader(interleaved, batch_size=16)) == []
    assert _run(DataLoader(ds, batch_size=256)) == []  # one batch holds the whole epoch
