"""nonfinite-values: the first step and parameter, then the first module on the next forward."""

from __future__ import annotations

import torch
from conftest import batches, mlp, names, session, train_step
from torch import nn


class Poison(nn.Module):
    """Turns its input into NaN when armed (stands in for an overflowing layer)."""

    armed = False

    def forward(self, x):
        return x * float("nan") if self.armed else x


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.poison, self.out = nn.Linear(8, 16), Poison(), nn.Linear(16, 3)

    def forward(self, x):
        return self.out(self.poison(torch.relu(self.inp(x))))


def _blow_up_at_step_3(restore: bool):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with session(model, opt) as s:
        for i, (x, y) in enumerate(batches(6)):
            good = {k: v.clone() for k, v in model.state_dict().items()}
            model.poison.armed = i >= 3
            train_step(model, opt, x, y)
            if restore and i == 3:
                model.load_state_dict(good)  # a guarded loop rolls the bad step back
    return s


def test_nan_gradients_name_the_step_and_that_the_weights_are_now_nan():
    first, where = _blow_up_at_step_3(restore=False).findings
    assert (first.name, first.code, str(first.severity)) == ("nonfinite-values", "TD309", "error")
    assert "at step 3: all 4 parameters have non-finite gradients" in first.message
    assert first.location.step == 3 and first.location.param == "inp.weight"
    assert "step 3 already wrote NaN/Inf into the weights" in where.message


def test_nan_localisation_names_the_first_module_with_a_nan_output():
    first, where = _blow_up_at_step_3(restore=True).findings
    assert "the first module with a NaN/Inf output was `poison (Poison)`" in where.message
    assert where.location.module == "poison (Poison)"


def test_nan_from_backward_names_the_affected_parameters():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, _ = batches(1)[0]
    with session(model, opt, checks="nonfinite-values") as s:
        opt.zero_grad()
        h = (model[0](x) * 0).sqrt()  # finite forward; sqrt'(0) = inf makes only the first layer's grads NaN
        model[2](model[1](h)).sum().backward()
        opt.step()
    assert "2 of 4 parameters have non-finite gradients (first `0.weight`, last `0.bias`)" in s.findings[0].message


def test_nan_in_the_data_is_blamed_on_the_input():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batches(1)[0]
    bad = x.clone()
    bad[0, 0] = float("inf")
    with session(model, opt) as s:
        train_step(model, opt, x, y)
        train_step(model, opt, bad, y)
        train_step(model, opt, bad, y)
    assert names(s) == ["nonfinite-values", "nonfinite-values"]
    assert "input batch of Sequential already contains NaN/Inf" in s.findings[1].message


def test_a_one_off_nan_batch_is_reported_as_coming_from_the_batch_or_loss():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batches(1)[0]
    good = {k: v.clone() for k, v in model.state_dict().items()}
    with session(model, opt) as s:
        opt.zero_grad()
        (model(x).sum() * float("nan")).backward()  # a NaN loss
        opt.step()
        model.load_state_dict(good)  # the weights are restored, as a guarded loop would
        train_step(model, opt, x, y)
    assert "produced finite outputs everywhere" in s.findings[1].message


def test_nan_parameters_are_found_at_a_periodic_check():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.no_grad():
        model[2].bias[1] = float("nan")
    x, y = batches(1)[0]
    with session(model, opt, checks="nonfinite-values") as s:
        opt.zero_grad()
        model(x).sum().backward()
        for p in model.parameters():
            p.grad = torch.nan_to_num(p.grad)  # grads finite, the weight is not
        opt.step()
    assert "parameter `2.bias` holds NaN/Inf at step 0" in s.findings[0].message


def test_finite_training_is_quiet_and_checks_are_not_repeated_after_a_hit():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with session(model, opt, every=1) as s:
        for x, y in batches(4):
            train_step(model, opt, x, y)
    assert s.findings == []


def _wide() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 64, bias=False), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))


def test_small_gradients_are_checked_every_step_so_a_nan_loss_is_caught_at_its_step():
    model = _wide()  # biases hold < 1% of the elements: they are checked every step, the weights every 5
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with session(model, opt, every=5, checks="nonfinite-values") as s:
        for step in range(4):
            opt.zero_grad()
            loss = model(torch.randn(4, 64)).sum()
            (loss * float("nan") if step == 2 else loss).backward()
            opt.step()
    assert s.findings[0].location.step == 2 and "may have begun" not in s.findings[0].message


def test_a_nan_only_in_large_gradients_is_caught_at_the_next_full_check():
    model = _wide()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with session(model, opt, every=5, checks="nonfinite-values") as s:
        for step in range(7):
            opt.zero_grad()
            h = model[0](torch.randn(4, 64))
            if step >= 2:
                h = (h * 0).sqrt()  # sqrt'(0): NaN reaches only the first, bias-free layer's weight
            model[2:](model[1](h)).sum().backward()
            opt.step()
            model[0].weight.data.nan_to_num_(0.0)  # keeps the forward finite, so only that gradient is NaN
    first, where = s.findings  # the loop calls the layers: the model is seen through its last layer
    assert first.location.step == 5 and first.location.param == "0.weight"
    assert "watch last read all gradients at step 0, finite: it began at one of the steps since" in first.message
    assert where.message.startswith("NaN/Inf localisation")
