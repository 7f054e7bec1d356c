"""eval-without-no-grad and train-mode-in-eval on real validation loops."""

from __future__ import annotations

import torch
from conftest import batches, mlp, names, session, train_step
from torch import nn


def _bn_net() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3))


def test_eval_without_no_grad_fires_when_outputs_are_dropped():
    model = _bn_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = batches(4)
    with session(model, opt) as s:
        for x, y in data:
            train_step(model, opt, x, y)
        model.eval()
        val = 0.0
        for x, y in data:
            val += nn.functional.cross_entropy(model(x), y).item()  # graph built, then dropped
    [f] = s.findings
    assert (f.name, f.code, str(f.severity)) == ("eval-without-no-grad", "TD306", "warning")
    assert f.location.module == "Sequential"
    # the fix is the user's own line, under no_grad (the function also trains: no decorator on it)
    assert f.fix.code == (
        "with torch.no_grad():\n    val += nn.functional.cross_entropy(model(x), y).item()  # graph built, then dropped"
    )
    assert "test_checks_modes.py" in f.fix.title
    assert "KiB per forward" in f.message or "bytes per forward" in f.message


def test_eval_without_no_grad_fires_when_graphs_are_accumulated():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with session(model, opt) as s:
        model.eval()
        val = 0
        for x, y in batches(3):
            val = val + nn.functional.cross_entropy(model(x), y)  # every graph stays alive
        assert names(s) == ["eval-without-no-grad"]
        assert "2 such graph(s) are alive now" in s.findings[0].message  # reported at the second


def test_eval_mode_forward_that_is_back_propagated_is_not_flagged():
    model = _bn_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.eval()  # fine-tuning with frozen BatchNorm statistics
    with session(model, opt) as s:
        for x, y in batches(4):
            train_step(model, opt, x, y)
    assert s.findings == []


def test_backprop_through_an_unfrozen_teacher_is_an_info_note():
    student, teacher = mlp(), mlp()
    teacher.eval()
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    with session([student, teacher], opt) as s:
        for x, _ in batches(3):
            opt.zero_grad()
            loss = (student(x) - teacher(x)).pow(2).mean()  # teacher params still require grad
            loss.backward()
            opt.step()
    [f] = s.findings
    assert (f.name, str(f.severity)) == ("eval-without-no-grad", "info")
    assert "Sequential#2" in f.message and "requires_grad_(False)" in f.fix.code


def test_train_mode_in_eval_fires_for_validation_without_eval():
    model = _bn_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = batches(4)
    with session(model, opt) as s:
        for x, y in data:
            train_step(model, opt, x, y)
        with torch.no_grad():  # forgot model.eval()
            for x, _ in data:
                model(x)
    [f] = s.findings
    assert (f.name, f.code) == ("train-mode-in-eval", "TD307")
    assert "BatchNorm1d, Dropout" in f.message and "model.eval()" in f.fix.code


def test_train_mode_in_eval_ignores_models_without_mode_layers_and_momentum_encoders():
    plain, key_encoder = mlp(), _bn_net()
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    with session([plain, key_encoder], opt) as s:
        for x, y in batches(4):
            with torch.no_grad():
                key_encoder(x)  # MoCo-style: train mode under no_grad, never trained with gradients
            train_step(plain, opt, x, y)
        with torch.no_grad():
            for x, _ in batches(3):
                plain(x)  # train mode, but no Dropout/BatchNorm: same result as eval()
    assert s.findings == []


def test_batchnorm_recalibration_with_update_bn_is_not_validation_without_eval():
    from torch.optim.swa_utils import AveragedModel, update_bn

    model = _bn_net()
    swa = AveragedModel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = batches(4)
    with session([model, swa], opt) as s:
        for x, y in data:
            train_step(model, opt, x, y)
            swa.update_parameters(model)
        update_bn([x for x, _ in data], swa)  # train-mode forwards under no_grad, by design
        update_bn([x for x, _ in data], model)
    assert s.findings == []


def test_mc_dropout_sampling_is_not_validation_without_eval():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = batches(4)
    with session(model, opt) as s:
        for x, y in data:
            train_step(model, opt, x, y)
        with torch.no_grad():
            for x, _ in data:  # train mode on purpose: 10 stochastic passes over the same input
                samples = torch.stack([model(x).softmax(-1) for _ in range(10)])
            model.eval()
            for m in model.modules():  # the other MC-dropout idiom: only the dropout layers back in train()
                if isinstance(m, nn.Dropout):
                    m.train()
            for x, _ in data:
                model(x)
    assert samples.shape[0] == 10 and s.findings == []


def test_new_batches_in_reused_memory_are_not_taken_for_mc_dropout():
    """A new batch is a new input even where its tensor reuses the last one's object or memory: a staging
    buffer refilled in place (`buf.copy_(x)`), or a temporary (`x.to(device)`) freed after its forward whose
    id and memory the next batch gets. Both are validation without eval(), not MC-dropout sampling."""
    data = batches(6)
    for feed in ("staging buffer", "temporaries"):
        model = _bn_net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        buf = torch.empty_like(data[0][0])
        with session(model, opt) as s:
            for x, y in data:
                train_step(model, opt, x, y)
            with torch.no_grad():
                for x, _ in data:
                    model(buf.copy_(x) if feed == "staging buffer" else x * 1.0)
        assert names(s) == ["train-mode-in-eval"], feed
