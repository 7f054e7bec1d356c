"""train-mode-not-restored (TD314): fires on real tiny loops left in eval() after validation; quiet on
correct loops, on deliberately frozen BatchNorm, on models without Dropout/BatchNorm, and on teachers."""

import pytest
import torch
from torch import nn

import torchdoctor


def net(dropout: bool = True, bn: bool = True) -> nn.Module:
    layers = [nn.Linear(8, 16)] + ([nn.BatchNorm1d(16)] if bn else []) + [nn.ReLU()]
    layers += ([nn.Dropout(0.2)] if dropout else []) + [nn.Linear(16, 3)]
    return nn.Sequential(*layers)


def data(n: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(n)]


def fit(model, optimizer, epochs=3, restore=False, freeze_bn=False, teacher=None):
    """Train for `epochs`, validating (eval + no_grad) after each; returns the session's findings."""
    loader = data()
    with torchdoctor.watch(
        [model] + ([teacher] if teacher else []), optimizer, on_finding=lambda f: None, report=False
    ) as session:
        for _ in range(epochs):
            if restore:
                model.train()
            if freeze_bn:
                for m in model.modules():
                    if isinstance(m, nn.BatchNorm1d):
                        m.eval()
            for x, y in loader:
                optimizer.zero_grad()
                out = model(x)
                if teacher is not None:
                    out = out + teacher(x).detach()
                nn.functional.cross_entropy(out, y).backward()
                optimizer.step()
            model.eval()
            with torch.no_grad():
                for x, _ in loader[:1]:
                    model(x)
    return [f for f in session.findings if f.name == "train-mode-not-restored"]


def test_fires_on_every_step_trained_in_eval_mode_after_validation():
    model = net()
    [finding] = fit(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert finding.code == "TD314" and str(finding.severity) == "warning"
    assert "BatchNorm1d" in finding.message and "Dropout" in finding.message
    assert finding.location.step == 3 and finding.count == 6  # epochs 2 and 3, three steps each
    assert "model.train()" in str(finding.fix)


def test_fires_for_dropout_alone():
    model = net(bn=False)
    [finding] = fit(model, torch.optim.SGD(model.parameters(), lr=0.1), epochs=2)
    assert "Dropout" in finding.message and "BatchNorm" not in finding.message


def test_quiet_when_train_mode_is_restored():
    model = net()
    assert fit(model, torch.optim.SGD(model.parameters(), lr=0.1), restore=True) == []


def test_quiet_when_batchnorm_is_frozen_on_purpose():
    model = net(dropout=False)
    assert fit(model, torch.optim.SGD(model.parameters(), lr=0.1), restore=True, freeze_bn=True) == []


def test_quiet_for_models_without_dropout_or_batchnorm():
    model = net(dropout=False, bn=False)
    assert fit(model, torch.optim.SGD(model.parameters(), lr=0.1)) == []


def test_quiet_for_a_frozen_teacher_in_eval_mode():
    model, teacher = net(), net().eval().requires_grad_(False)
    assert fit(model, torch.optim.SGD(model.parameters(), lr=0.1), restore=True, teacher=teacher) == []


# -- in source (torchdoctor lint) ---------------------------------------------------------------------


def lint(code: str) -> list:
    from torchdoctor import registry
    from torchdoctor.sdk import Example
    from torchdoctor.sdk.testing import run_example

    return run_example(registry.get("train-mode-not-restored"), Example(code), "source")


EPOCH = """
import torch

def evaluate(net, loader):
    net.eval()
    with torch.no_grad():
        return sum(net(x).sum().item() for x, _ in loader)

for epoch in range(10):
{body}
"""
TRAIN = """    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
"""


def test_lint_fires_when_validation_in_a_helper_leaves_eval_on():
    [finding] = lint(EPOCH.format(body=TRAIN + "    evaluate(model, val_loader)\n"))
    assert finding.message.startswith("`evaluate(model, val_loader)` runs inside the training loop")
    assert "model.train()" in finding.message


def test_lint_fires_on_train_false():
    [finding] = lint(EPOCH.format(body=TRAIN + "    model.train(False)\n"))
    assert finding.message.startswith("`model.train(False)` runs inside the training loop")


def test_lint_quiet_when_eval_comes_before_the_training_of_every_iteration():
    # every step, the first too, trains in eval mode: a deliberate choice (as watch judges it)
    assert lint(EPOCH.format(body="    model.train(False)\n" + TRAIN)) == []


def test_lint_quiet_when_the_loop_restores_train_mode():
    assert lint(EPOCH.format(body="    model.train()\n" + TRAIN + "    evaluate(model, val_loader)\n")) == []


def test_lint_quiet_when_a_local_training_helper_calls_train():
    code = EPOCH.replace(
        "for epoch",
        """def train_one_epoch(net):
    net.train()
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(net(x), y).backward()
        optimizer.step()

for epoch""",
    ).format(body="    train_one_epoch(model)\n    evaluate(model, val_loader)\n")
    assert lint(code) == []


def test_lint_quiet_for_batchnorm_frozen_layer_by_layer():
    body = (
        "    for m in model.modules():\n        if isinstance(m, torch.nn.BatchNorm2d):\n            m.eval()\n" + TRAIN
    )
    assert lint(EPOCH.format(body="    model.train()\n" + body)) == []
    assert lint(EPOCH.format(body=body)) == []


def test_lint_quiet_when_the_model_goes_to_code_it_cannot_see():
    assert lint(EPOCH.format(body=TRAIN + "    evaluate(model, val_loader)\n    trainer_utils.prepare(model)\n")) == []


@pytest.mark.parametrize(
    "first, expected", [("net.eval()  # linear probing: BatchNorm statistics stay frozen", 0), ("", 1)]
)
def test_lint_quiet_when_the_training_function_sets_eval_itself(first, expected):
    # simsiam's main_lincls.py: train() switches the model to eval() before its steps on purpose, so the
    # evaluation's eval() after it leaves nothing behind; the look-alike without it is reported
    code = EPOCH.replace(
        "for epoch",
        f"""def train_one_epoch(net):
    {first}
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(net(x), y).backward()
        optimizer.step()

for epoch""",
    ).format(body="    train_one_epoch(model)\n    evaluate(model, val_loader)\n")
    assert len(lint(code)) == expected
