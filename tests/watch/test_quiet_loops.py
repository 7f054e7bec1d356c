"""Correct code stays quiet: the "must NOT flag" column of the Runtime table, on real tiny loops."""

from __future__ import annotations

import warnings

import torch
from conftest import batches, mlp, problems, session, train_step
from torch import nn

import torchdoctor


def test_textbook_loop_gives_no_warning_and_no_finding():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any TorchDoctorWarning fails the test
        with torchdoctor.watch(model, opt, every=1, report=False) as s:
            for _ in range(3):
                for x, y in batches():
                    train_step(model, opt, x, y)
    assert s.findings == []


def test_gradient_accumulation_with_set_to_none_false_and_model_zero_grad():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with session(model, opt, every=1) as s:
        data = batches(12)
        for i in range(0, 12, 4):
            for x, y in data[i : i + 4]:  # four backwards, one step
                (nn.functional.cross_entropy(model(x), y) / 4).backward()
            opt.step()
            if i % 8 == 0:
                opt.zero_grad(set_to_none=False)
            else:
                model.zero_grad()
    assert problems(s) == []


def test_manual_grad_reset_and_in_place_zeroing_are_clearing():
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with session(model, opt, every=1) as s:
        for i, (x, y) in enumerate(batches(8)):
            for p in model.parameters():
                if i % 2:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.detach_()
                    p.grad.zero_()
            train_step(model, opt, x, y, zero=False)
    assert problems(s) == []


def test_frozen_parameters_are_not_unused_or_missing_from_the_optimizer():
    model = mlp()
    model[0].requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    with session(model, opt, every=1) as s:
        for _ in range(2):
            for x, y in batches():
                train_step(model, opt, x, y)
    assert s.findings == []


def test_gan_with_two_optimizers_is_quiet():
    g, d = (
        nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 6)),
        nn.Sequential(nn.Linear(6, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1)),
    )
    opt_g, opt_d = torch.optim.Adam(g.parameters(), 2e-4), torch.optim.Adam(d.parameters(), 2e-4)
    bce = nn.BCEWithLogitsLoss()
    with session([g, d], [opt_g, opt_d], every=1) as s:
        for _ in range(12):
            real, z = torch.randn(16, 6), torch.randn(16, 4)
            fake = g(z)
            opt_d.zero_grad()
            d_loss = bce(d(real), torch.ones(16, 1)) + bce(d(fake.detach()), torch.zeros(16, 1))
            d_loss.backward()
            opt_d.step()
            opt_g.zero_grad()
            g_loss = bce(d(fake), torch.ones(16, 1))  # also fills d's grads; opt_d clears them next round
            g_loss.backward()
            opt_g.step()
    assert problems(s) == []


def test_amp_on_cpu_with_grad_scaler_scheduler_and_clipping_is_quiet():
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu")
    with session(model, opt, every=1) as s:
        for x, y in batches(10):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            sched.step()
    assert problems(s) == []


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(8 * 4 * 4, 4))

    def forward(self, x):
        return self.head(self.features(x))


def _cnn_epochs(validate_under) -> list[str]:
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(8, 3, 8, 8), torch.randint(0, 4, (8,))
    with session(model, opt, every=1) as s:
        for _ in range(3):
            model.train()
            for _ in range(4):
                train_step(model, opt, x, y)
            model.eval()
            with validate_under():
                total = 0.0
                for _ in range(3):
                    total += nn.functional.cross_entropy(model(x), y).item()
    return problems(s)


def test_cnn_with_batchnorm_validated_under_no_grad_and_eval_is_quiet():
    assert _cnn_epochs(torch.no_grad) == []


def test_validation_under_inference_mode_is_quiet():
    assert _cnn_epochs(torch.inference_mode) == []


class TinyRNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn, self.head = nn.RNN(4, 8, batch_first=True), nn.Linear(8, 1)

    def forward(self, x, h=None):
        out, h = self.rnn(x, h)
        return self.head(out[:, -1]), h


def test_truncated_bptt_and_a_bounded_loss_cache_are_not_leaks():
    model = TinyRNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    recent: list[torch.Tensor] = []
    with session(model, opt, every=1) as s:
        h = None
        for _ in range(70):
            h = h.detach() if h is not None else None  # truncate the carried graph every chunk
            loss = torch.zeros(())
            for _ in range(3):
                pred, h = model(torch.randn(2, 5, 4), h)
                loss = loss + pred.pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            recent = (recent + [loss])[-10:]  # a cache of graphs that plateaus
    assert s.facts["optimizers"][0]["steps"] == 70
    assert problems(s) == []
