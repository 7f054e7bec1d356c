"""scheduler-stepped-per-batch (TD317): fires on per-epoch schedules stepped in the batch loop; quiet on
per-epoch stepping, per-iteration schedules over the whole run, periodic schedules and one-epoch runs."""

import torch
from torch import nn
from torch.optim import lr_scheduler as S
from torch.utils.data import DataLoader, TensorDataset

import torchdoctor

LOADER = DataLoader(TensorDataset(torch.randn(96, 4), torch.randn(96, 1)), batch_size=8)  # 12 batches


def _run(make, per_batch: bool, epochs: int = 3):
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = make(opt)
    # only this pitfall: the loop's 0.4 ms steps are a few small ops next to the loader's __next__, so what
    # share of them the loader takes (input-bound's verdict) follows the machine's load
    with torchdoctor.watch(
        model, opt, checks=["scheduler-stepped-per-batch"], on_finding=lambda f: None, report=False
    ) as s:
        for _ in range(epochs):
            for x, y in LOADER:
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                if per_batch:
                    scheduler.step()
            if not per_batch:
                scheduler.step()
    return s


def _own(session) -> list:
    """This rule's findings only: the tests judge this rule, not the timing checks that share the loop."""
    return [f for f in session.findings if f.name == "scheduler-stepped-per-batch"]


def test_fires_on_per_epoch_schedules_stepped_per_batch():
    for make in (
        lambda o: S.StepLR(o, step_size=3, gamma=0.1),
        lambda o: S.MultiStepLR(o, [2, 4, 6]),
        lambda o: S.ExponentialLR(o, gamma=0.6),
    ):
        [f] = _own(_run(make, per_batch=True))
        assert (f.code, f.name, f.location.step) == ("TD317", "scheduler-stepped-per-batch", 12)
        assert "stepped 12 times during the first epoch (12 optimizer steps)" in f.message
        assert "from 0.1 to " in f.message


def test_quiet_on_correct_schedules():
    assert _own(_run(lambda o: S.StepLR(o, step_size=3, gamma=0.1), per_batch=False)) == []
    per_batch_over_the_run = (
        lambda o: S.OneCycleLR(o, max_lr=0.1, total_steps=36),
        lambda o: S.CosineAnnealingLR(o, T_max=12),  # periodic by design: low point every epoch
        lambda o: S.LambdaLR(o, lambda i: min(1.0, (i + 1) / 10)),  # warm-up
        lambda o: S.StepLR(o, step_size=30, gamma=0.5),  # horizon in iterations
    )
    for make in per_batch_over_the_run:
        assert _own(_run(make, per_batch=True)) == []
    assert _own(_run(lambda o: S.StepLR(o, step_size=3, gamma=0.1), per_batch=True, epochs=1)) == []
