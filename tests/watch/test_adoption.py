"""`watch(model)` adopts an optimizer built later whose parameters belong to the watched model."""

from __future__ import annotations

import torch
from conftest import batches, mlp, names, problems, session, train_step


def test_an_optimizer_built_inside_the_session_is_adopted():
    model = mlp()
    with session(model) as s:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in batches(4):
            train_step(model, opt, x, y, zero=False)  # forgets zero_grad
    assert "missing-zero-grad" in names(s)
    assert s.facts["optimizers"] == [{"label": "SGD", "steps": 4}] and s.facts["adopted_optimizers"] == ["SGD"]


def test_the_adopted_optimizer_reaches_the_checks_from_its_first_step():
    model = mlp()
    seen = []
    with session(model) as s:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in batches(3):
            train_step(model, opt, x, y)
        seen.append(s._ctx.step)
    assert seen == [3] and problems(s) == []


def test_another_models_optimizer_is_left_alone():
    watched, other = mlp(), mlp()
    opt = torch.optim.SGD(watched.parameters(), lr=0.1)
    with session(watched, opt) as s:
        other_opt = torch.optim.SGD(other.parameters(), lr=0.1)
        for x, y in batches(3):
            train_step(watched, opt, x, y)
            train_step(other, other_opt, x, y, zero=False)  # not watched: its missing zero_grad is not ours
    assert problems(s) == [] and "adopted_optimizers" not in s.facts
    assert s.facts["optimizers"] == [{"label": "SGD", "steps": 3}]


def test_a_second_stage_optimizer_over_the_watched_model_is_followed():
    model = mlp()
    first = torch.optim.Adam(model.parameters(), lr=1e-3)
    with session(model, first) as s:
        for x, y in batches(2):
            train_step(model, first, x, y)
        second = torch.optim.SGD(model[2].parameters(), lr=0.1)
        for x, y in batches(3):
            train_step(model, second, x, y)
    steps = {o["label"]: o["steps"] for o in s.facts["optimizers"]}
    assert steps == {"Adam": 2, "SGD": 3} and problems(s) == []  # the user's own optimizer is never retired


def test_no_hook_is_left_behind():
    from torch.nn.modules.module import _global_forward_pre_hooks
    from torch.optim.optimizer import _global_optimizer_pre_hooks

    before = (len(_global_optimizer_pre_hooks), len(_global_forward_pre_hooks))
    model = mlp()
    with session(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        train_step(model, opt, *batches(1)[0])
    assert (len(_global_optimizer_pre_hooks), len(_global_forward_pre_hooks)) == before
