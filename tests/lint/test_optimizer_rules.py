"""stale-optimizer-params, optimizer-state-device and dataparallel-optimizer on small scripts."""

import pytest

FINETUNE = """
import torch
import torch.nn as nn
import torchvision

def build(num_classes, device):
    model = torchvision.models.resnet18(weights="DEFAULT")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.fc = nn.Linear(model.fc.in_features, num_classes)
    model = model.to(device)
    return model, optimizer
"""


@pytest.mark.rule("stale-optimizer-params")
def test_head_replaced_after_optimizer_fires(lint, fired):
    [f] = fired(lint(FINETUNE), "stale-optimizer-params")
    assert f.code == "TD302" and f.location.line == 9 and "model.fc" in f.message


@pytest.mark.rule("stale-optimizer-params")
def test_head_replaced_before_optimizer_is_quiet(lint):
    code = FINETUNE.replace(
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)\n    model.fc = "
        "nn.Linear(model.fc.in_features, num_classes)\n",
        "    model.fc = nn.Linear(model.fc.in_features, num_classes)\n    optimizer = "
        "torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)\n",
    )
    assert lint(code) == []


@pytest.mark.rule("stale-optimizer-params")
def test_moving_or_wrapping_after_the_optimizer_is_not_stale(lint):
    code = """
    model = Net()
    optimizer = torch.optim.Adam(model.parameters())
    model = model.to("cuda")
    model = torch.nn.parallel.DistributedDataParallel(model)
    model = torch.compile(model)
    """
    assert lint(code) == []


@pytest.mark.rule("stale-optimizer-params")
def test_new_parameter_after_optimizer_fires_and_add_param_group_is_quiet(lint, fired):
    code = """
    import torch.nn as nn
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    net.scale = nn.Parameter(torch.ones(1))
    """
    assert lint(code) == []  # the old optimizer is never used again: nothing trains with stale parameters
    assert len(fired(lint(code + "opt.step()\n"), "stale-optimizer-params")) == 1
    assert lint(code + "opt.add_param_group({'params': [net.scale]})\n    opt.step()\n") == []


RESUME = """
import torch

def resume(path, device):
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    model.to(device)
    return model, optimizer
"""


@pytest.mark.rule("optimizer-state-device")
def test_optimizer_state_loaded_before_the_move_fires(lint, fired):
    [f] = fired(lint(RESUME), "optimizer-state-device")
    assert f.code == "TD304" and f.location.line == 9 and "model.to(device)" in f.message


@pytest.mark.rule("optimizer-state-device")
def test_moving_first_is_quiet(lint):
    code = RESUME.replace("    model.to(device)\n", "").replace("    model = Net()\n", "    model = Net().to(device)\n")
    assert lint(code) == []


@pytest.mark.rule("optimizer-state-device")
def test_a_second_move_after_an_earlier_one_is_quiet(lint):
    code = RESUME.replace("    model = Net()\n", "    model = Net().to(device)\n")
    assert "model.to(device)" in code and lint(code) == []


@pytest.mark.rule("optimizer-state-device")
def test_moving_to_cpu_is_quiet(lint):
    assert lint(RESUME.replace("model.to(device)", 'model.to("cpu")')) == []


@pytest.mark.rule("dataparallel-optimizer")
def test_dataparallel_around_an_optimizer_fires(lint, fired):
    code = """
    import torch.nn as nn
    model = nn.DataParallel(Net().cuda())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = nn.DataParallel(optimizer, device_ids=[0, 1])
    """
    [f] = fired(lint(code), "dataparallel-optimizer")
    assert f.code == "TD505" and f.location.line == 5
