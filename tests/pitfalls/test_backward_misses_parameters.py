"""backward-misses-parameters (TD315): fires on real tiny loops whose loss lost its graph; quiet on correct
loops, gradient accumulation, closures, frozen teachers and zero_grad(set_to_none=False)."""

import torch
from torch import nn

import torchdoctor


def _loop(rebuild, steps: int = 3, accumulate: int = 1, set_to_none: bool = True, teacher: bool = False):
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    frozen = nn.Linear(4, 1).requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    watched = [model, frozen] if teacher else model
    with torchdoctor.watch(watched, opt, on_finding=lambda f: None, report=False) as s:
        for _ in range(steps):
            opt.zero_grad(set_to_none=set_to_none)
            for _ in range(accumulate):
                x, y = torch.randn(8, 4), torch.randn(8, 1)
                if teacher:
                    y = frozen(x)
                loss = rebuild(nn.functional.mse_loss(model(x), y))
                loss.backward()
            opt.step()
    return s


def test_fires_on_a_loss_rebuilt_from_item_or_detached():
    for rebuild in (
        lambda loss: torch.tensor(loss.item(), requires_grad=True),
        lambda loss: loss.detach().requires_grad_(),
    ):
        s = _loop(rebuild)
        [f] = s.findings
        assert (f.code, f.name, f.location.step, f.location.module) == (
            "TD315",
            "backward-misses-parameters",
            0,
            "Sequential",
        )
        assert "no gradient on any of its 4 parameter tensors" in f.message


def test_quiet_on_correct_loops_accumulation_and_teachers():
    assert _loop(lambda loss: loss).findings == []
    assert _loop(lambda loss: loss, accumulate=3).findings == []
    assert _loop(lambda loss: loss, teacher=True).findings == []


def test_quiet_on_closures_and_set_to_none_false():
    model = nn.Linear(4, 1)
    opt = torch.optim.LBFGS(model.parameters(), max_iter=3)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    with torchdoctor.watch(model, opt, on_finding=lambda f: None, report=False) as s:
        for _ in range(3):

            def closure():
                opt.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                return loss

            opt.step(closure)
    assert s.findings == []
    assert _loop(lambda loss: loss, set_to_none=False).findings == []
