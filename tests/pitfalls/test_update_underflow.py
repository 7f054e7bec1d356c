"""update-underflow (TD324): pure-bf16 weights whose small updates round away, and a learning rate stuck at
0, are reported; fp32 training, bf16 with updates above its precision, frozen parameters and a short warm-up
at lr 0 are quiet."""

import torch
from pitfall_training import train
from torch import nn

import torchdoctor
from torchdoctor import registry

UNDERFLOW = registry.get("update-underflow")


def _loss(ns):
    model = ns["model"]
    with torch.no_grad():
        out = model(ns["x_all"].to(model[0].weight.dtype)).float().squeeze(-1)
    return torch.nn.functional.mse_loss(out, ns["y_all"]).item()


def test_bad_example_learns_worse_and_is_flagged():
    namespace: dict = {}
    exec(UNDERFLOW.bad.setup, namespace)
    start = _loss(namespace)
    bad_found, bad = train(UNDERFLOW, UNDERFLOW.bad, 8, _loss)
    good_found, good = train(UNDERFLOW, UNDERFLOW.good, 8, _loss)
    # the bf16 weights gained less than a third of what the same steps gave the fp32 ones
    assert bad > 1.1 * good and start - bad < 0.3 * (start - good), (start, bad, good)
    [f] = bad_found
    assert f.code == "TD324" and "stored in bfloat16" in f.message and "lr 0.0001" in f.message
    assert f.fix.code.startswith("model.float()")
    assert good_found == []


def _run(model, opt, steps=40, every=10, scheduler=None, dtype=torch.float32):
    torch.manual_seed(1)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    with torchdoctor.watch(
        model, opt, checks=["update-underflow"], every=every, on_finding=lambda f: None, report=False
    ) as s:
        for _ in range(steps):
            opt.zero_grad()
            nn.functional.mse_loss(model(x.to(dtype)).float(), y).backward()
            opt.step()
            if scheduler is not None:
                scheduler.step()
    return s.findings


def _model(dtype=torch.float32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(dtype)


def test_learning_rate_zero_is_reported():
    model = _model()
    [f] = _run(model, torch.optim.SGD(model.parameters(), lr=0.0))
    assert (
        "the learning rate of SGD is 0" in f.message and "3 parameter(s)" in f.message
    )  # 2.bias: too few elements to judge
    model = _model()  # one group at 0: only its parameters
    opt = torch.optim.Adam([{"params": model[0].parameters(), "lr": 0.0}, {"params": model[2].parameters()}], lr=1e-2)
    [f] = _run(model, opt)
    assert "2 parameter(s)" in f.message and "`0.weight`" in f.message and "`2.weight`" not in f.message


def test_quiet_on_working_training_frozen_parameters_and_warm_up():
    model = _model()
    assert _run(model, torch.optim.SGD(model.parameters(), lr=0.01)) == []
    model = _model(torch.bfloat16)  # bf16 weights with updates above their precision
    assert _run(model, torch.optim.Adam(model.parameters(), lr=1e-2), dtype=torch.bfloat16) == []
    model = _model()
    model[0].requires_grad_(False)  # frozen: no gradient, never expected to change
    assert _run(model, torch.optim.SGD(model.parameters(), lr=0.01)) == []
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    warm_up = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.0 if step < 8 else 1.0)  # 8 steps at lr 0
    assert _run(model, opt, every=1, scheduler=warm_up) == []
