"""shuffle-with-sampler, sampler-epoch-not-set and to-result-discarded on small scripts."""

import pytest

DDP = """
import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

def main(dataset, model, optimizer, epochs):
    train_sampler = DistributedSampler(dataset)
    train_loader = DataLoader(dataset, batch_size=32, sampler=train_sampler)
    for epoch in range(epochs):
        # remember: train_sampler.set_epoch(epoch)
        for x, y in train_loader:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
"""


@pytest.mark.rule("sampler-epoch-not-set")
def test_sampler_without_set_epoch_fires_even_with_the_word_in_a_comment(lint, fired):
    [f] = fired(lint(DDP), "sampler-epoch-not-set")
    assert f.code == "TD311" and f.location.line == 7 and "train_sampler.set_epoch(epoch)" in f.fix.title


@pytest.mark.rule("sampler-epoch-not-set")
def test_set_epoch_called_is_quiet(lint):
    code = DDP.replace(
        "        # remember: train_sampler.set_epoch(epoch)\n",
        "        # shuffle differently every epoch\n        train_sampler.set_epoch(epoch)\n",
    )
    assert lint(code) == []


@pytest.mark.rule("sampler-epoch-not-set")
def test_set_epoch_called_by_an_imported_function_in_the_epoch_loop_is_quiet(lint):
    code = DDP.replace(
        "        # remember: train_sampler.set_epoch(epoch)\n", "        start_epoch(train_loader, epoch)\n"
    )
    code = "from hooks import start_epoch\n" + code
    other = "def start_epoch(loader, epoch):\n    loader.sampler.set_epoch(epoch)  # reseed\n"
    assert lint(code, others={"hooks.py": other}) == []
    only_comment = "def start_epoch(loader, epoch):\n    pass  # loader.sampler.set_epoch(epoch)\n"
    assert lint(code, others={"hooks.py": only_comment}) != []
    # set_epoch somewhere in the project, but not reached from this epoch loop: the bug is still there
    assert lint(DDP, others={"hooks.py": other}) != []


@pytest.mark.rule("sampler-epoch-not-set")
def test_loader_passed_to_a_train_function_each_epoch_fires(lint, fired):
    code = """
    def main():
        sampler = DistributedSampler(ds, shuffle=True)
        loader = DataLoader(ds, sampler=sampler, batch_size=8)
        for epoch in range(10):
            train_one_epoch(model, loader, optimizer)
    """
    assert len(fired(lint(code), "sampler-epoch-not-set")) == 1


@pytest.mark.rule("sampler-epoch-not-set")
@pytest.mark.parametrize(
    "code",
    [
        # one pass only: the order never needs to change
        "sampler = DistributedSampler(ds)\nloader = DataLoader(ds, sampler=sampler)\nfor x in loader:\n    pass\n",
        # no shuffling: set_epoch changes nothing
        "sampler = DistributedSampler(ds, shuffle=False)\nloader = DataLoader(ds, sampler=sampler)\n"
        "for e in range(3):\n    for x in loader:\n        pass\n",
    ],
)
def test_samplers_that_need_no_set_epoch_are_quiet(lint, code):
    assert lint(code) == []


@pytest.mark.rule("shuffle-with-sampler")
def test_shuffle_with_sampler_fires(lint, fired):
    code = """
    from torch.utils.data import DataLoader, DistributedSampler
    loader = DataLoader(train_set, batch_size=64, shuffle=True, sampler=DistributedSampler(train_set))
    for x in loader:
        pass
    """
    [f] = fired(lint(code), "shuffle-with-sampler")
    assert f.code == "TD502" and f.location.line == 3


@pytest.mark.rule("shuffle-with-sampler")
@pytest.mark.parametrize(
    "kwargs",
    ["shuffle=(sampler is None), sampler=sampler", "shuffle=True, sampler=None", "shuffle=False, sampler=sampler"],
)
def test_shuffle_look_alikes_are_quiet(lint, kwargs):
    assert lint(f"loader = DataLoader(ds, {kwargs})\n") == []


MOVE = """
import torch

def train(model, loader, optimizer, device):
    model.to(device)
    for step, (images, labels) in enumerate(loader):
        images.to(device)
        labels = labels.to(device)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
"""


@pytest.mark.rule("to-result-discarded")
def test_discarded_to_on_a_batch_tensor_fires(lint, fired):
    [f] = fired(lint(MOVE), "to-result-discarded")
    assert f.code == "TD501" and f.location.line == 7 and f.fix.code == "images = images.to(device)"


@pytest.mark.rule("to-result-discarded")
def test_discarded_cuda_on_a_factory_tensor_fires(lint, fired):
    code = "import torch\nmask = torch.zeros(4, 4)\nmask.cuda()\n"
    assert len(fired(lint(code), "to-result-discarded")) == 1


@pytest.mark.rule("to-result-discarded")
@pytest.mark.parametrize(
    "code",
    [
        "model = Net()\nmodel.to(device)\n",  # modules move in place
        "for batch in loader:\n    batch.to(device)\n",  # BatchEncoding / PyG Data move in place
        "x = torch.zeros(3)\nx = x.to(device)\n",
        "def f(x):\n    x.to('cuda')\n",  # unknown type
        "for a, b in zip(loader_a, loader_b):\n    a.to(device)\n",  # whole batches (BatchEncoding moves in place)
    ],
)
def test_to_look_alikes_are_quiet(lint, code):
    assert lint(code) == []
