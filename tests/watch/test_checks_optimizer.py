"""The optimizer-wiring checks fire on real tiny loops with the mistake, and name where."""

from __future__ import annotations

import torch
from conftest import batches, mlp, names, session, train_step
from torch import nn


def test_missing_zero_grad_fires_at_the_second_step_and_counts_repeats():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with session(model, opt) as s:
        for x, y in batches(5):
            train_step(model, opt, x, y, zero=False)
    [f] = [f for f in s.findings if f.name == "missing-zero-grad"]
    assert (f.code, str(f.severity)) == ("TD301", "error")
    assert f.location.step == 1 and f.location.param == "2.bias"  # smallest parameter with a gradient
    assert f.count == 4
    assert "optimizer.zero_grad(" in f.fix.code


def test_missing_zero_grad_in_an_accumulation_loop_that_never_clears():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with session(model, opt) as s:
        data = batches(8)
        for i in range(0, 8, 2):
            for x, y in data[i : i + 2]:
                nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    assert "missing-zero-grad" in names(s)


def test_stale_optimizer_params_after_rebinding_a_layer_names_the_new_one():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model[2] = nn.Linear(16, 3)  # re-bound after the optimizer was built
    with session(model, opt, every=1) as s:
        for x, y in batches(2):
            train_step(model, opt, x, y)
    stale = [f for f in s.findings if f.name == "stale-optimizer-params"]
    assert len(stale) == 1 and stale[0].code == "TD302"
    assert "2 of its 4 parameters" in stale[0].message and "`2.weight`" in stale[0].message
    assert stale[0].location.param == "2.weight"
    assert stale[0].fix.code == "opt = torch.optim.SGD(model.parameters(), **opt.defaults)"  # the test's names
    namespace = {"torch": torch, "model": model, "opt": opt}
    exec(stale[0].fix.code, namespace)  # the fix pastes: the same optimizer, same settings, the model's parameters
    rebuilt = namespace["opt"]
    assert type(rebuilt) is type(opt) and rebuilt.defaults == opt.defaults
    assert [id(p) for p in rebuilt.param_groups[0]["params"]] == [id(p) for p in model.parameters()]
    assert [f for f in s.findings if f.name == "param-not-in-optimizer"] == []  # one replaced layer, one finding


def test_a_replaced_layer_hides_no_other_parameter_missing_from_the_optimizer():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3), nn.Linear(3, 3))
    opt = torch.optim.SGD(model[:3].parameters(), lr=0.1)  # the last layer forgotten
    model[2] = nn.Linear(16, 3)  # and one re-bound
    with session(model, opt, every=1) as s:
        for x, y in batches(2):
            train_step(model, opt, x, y)
    assert sorted(names(s)) == ["param-not-in-optimizer", "stale-optimizer-params"]
    [missing] = [f for f in s.findings if f.name == "param-not-in-optimizer"]
    assert "`3.weight`, `3.bias`" in missing.message and "2.weight" not in missing.message


def test_stale_optimizer_params_when_the_whole_model_was_rebuilt():
    model = mlp()
    opt = torch.optim.Adam(model.parameters())
    model = mlp()  # e.g. re-created after loading a config
    with session(model, opt) as s:
        pass
    assert names(s) == ["stale-optimizer-params"]


def test_stale_params_are_not_claimed_for_an_optimizer_of_another_model():
    g, d = mlp(), mlp()
    opt_g, opt_d = torch.optim.SGD(g.parameters(), lr=0.1), torch.optim.SGD(d.parameters(), lr=0.1)
    with session(g, [opt_g, opt_d]) as s:  # d itself was not given to watch()
        pass
    assert s.findings == []


def test_param_not_in_optimizer_for_a_head_added_later():
    model = mlp()
    opt = torch.optim.SGD(model[0].parameters(), lr=0.1)  # forgot the rest
    with session(model, opt, every=1) as s:
        for x, y in batches(3):
            train_step(model, opt, x, y)
    [f] = [f for f in s.findings if f.name == "param-not-in-optimizer"]
    assert (f.code, str(f.severity)) == ("TD303", "warning")
    assert "`2.weight`, `2.bias`" in f.message
    exec(f.fix.code, {"model": model, "optimizer": opt})  # the fix names the module, and pastes
    assert {id(p) for p in model[2].parameters()} <= {id(p) for g in opt.param_groups for p in g["params"]}


def test_optimizer_state_dtype_mismatch_after_casting_the_model():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = batches(1)[0]
    train_step(model, opt, x, y)  # momentum buffers are float32 now
    model.double()  # same Parameter objects, new dtype: the state is stranded
    with session(model, opt) as s:
        pass
    [f] = s.findings
    assert (f.name, f.code) == ("optimizer-state-device", "TD304")
    assert "torch.float32" in f.message and "torch.float64" in f.message
    assert f.location.key == "momentum_buffer"


def test_optimizer_state_cast_after_loading_inside_the_session_is_found_before_the_next_step():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = batches(1)[0]
    train_step(model, opt, x, y)
    saved = opt.state_dict()
    with session(model, opt, every=1) as s:
        opt.load_state_dict(saved)  # casts the state to the parameters as they are now: fine
        assert s.findings == []
        model.double()  # ...but the model is cast afterwards
        train_step(model, opt, x.double(), y)
    [f] = s.findings
    assert f.name == "optimizer-state-device" and f.location.step == 0


def test_optimizer_state_on_another_device_is_found_at_start():
    model = mlp()
    opt = torch.optim.Adam(model.parameters())
    x, y = batches(1)[0]
    train_step(model, opt, x, y)
    for st in opt.state.values():
        st["exp_avg"] = st["exp_avg"].to("meta")  # stands in for state left on another device
    with session(model, opt) as s:
        pass
    [f] = s.findings
    assert f.name == "optimizer-state-device" and "on meta but the parameter is on cpu" in f.message


def test_unused_parameters_after_three_checked_steps():
    class TwoHeads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.aux = nn.Linear(8, 3), nn.Linear(8, 3)

        def forward(self, x):
            return self.body(x)

    model = TwoHeads()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with session(model, opt, every=1) as s:
        for x, y in batches(4):
            train_step(model, opt, x, y)
    [f] = s.findings
    assert (f.name, f.code, str(f.severity)) == ("unused-parameters", "TD305", "info")
    assert "`aux.weight`, `aux.bias`" in f.message and f.location.step == 2
    assert f.fix.code == "model.aux.requires_grad_(False)"  # the test's own name for the model
    exec(f.fix.code, {"model": model})  # pasted before the loop: quiet
    with session(model, opt, every=1) as s:
        for x, y in batches(4):
            train_step(model, opt, x, y)
    assert s.findings == []


def test_optimizer_state_cast_after_loading_is_mended_by_the_pasted_fix():
    model = mlp()
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = batches(1)[0]
    train_step(model, adam, x, y)
    adam.load_state_dict(adam.state_dict())  # stands for a resumed state, loaded while the model is float32
    model.to(torch.float64)
    with session(model, adam, every=1) as s:
        pass
    [f] = s.findings
    assert "torch.float32 but the parameter is torch.float64" in f.message
    assert f.fix.code == "adam.load_state_dict(adam.state_dict())"
    exec(f.fix.code, {"adam": adam})
    with session(model, adam, every=1) as s:
        train_step(model, adam, x.double(), y)
    assert s.findings == []


def _wgan_gp(zero_critic: bool, steps: int = 4):
    """WGAN-GP (Gulrajani et al.): the critic's last bias gets an exactly-zero gradient every step."""
    critic = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    generator = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
    opt_c = torch.optim.Adam(critic.parameters(), lr=1e-4, betas=(0.0, 0.9))
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-4, betas=(0.0, 0.9))
    with session([critic, generator], [opt_c, opt_g]) as s:
        for _ in range(steps):
            real, fake = torch.randn(16, 8), generator(torch.randn(16, 4)).detach()
            if zero_critic:
                opt_c.zero_grad()
            alpha = torch.rand(16, 1)
            mixed = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
            (grad,) = torch.autograd.grad(critic(mixed).sum(), mixed, create_graph=True)
            penalty = 10 * ((grad.norm(2, dim=1) - 1) ** 2).mean()
            (critic(fake).mean() - critic(real).mean() + penalty).backward()
            opt_c.step()
            opt_g.zero_grad()
            (-critic(generator(torch.randn(16, 4))).mean()).backward()
            opt_g.step()
    return s


def test_wgan_gp_critic_without_zero_grad_is_found_at_step_1():
    s = _wgan_gp(zero_critic=False)
    [f] = [f for f in s.findings if f.name == "missing-zero-grad"]
    assert f.location.step == 1 and f.location.param != "Sequential#1.2.bias"


def test_wgan_gp_with_zero_grad_is_quiet():
    assert _wgan_gp(zero_critic=True).findings == []
