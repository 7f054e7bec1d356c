"""Any optimizer object (wrappers of accelerate, Lightning, DeepSpeed style), hooks that fail one at a time,
sessions that nest and stop in any order, torch.compile(fullgraph=True), torch.func transforms, meta models."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from conftest import batches, mlp, names, problems, session, train_step
from torch import nn


class AcceleratedStyle(torch.optim.Optimizer):
    """Like accelerate's AcceleratedOptimizer: an Optimizer subclass that never runs Optimizer.__init__."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)

    def step(self, closure=None):
        return self.optimizer.step(closure)


class LightningStyle:
    """Like Lightning's LightningOptimizer: not an Optimizer; shares the wrapped one's __dict__."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.__dict__ = {k: v for k, v in optimizer.__dict__.items() if k not in ("step", "__del__")}
        self._optimizer = optimizer

    def step(self, closure=None):
        return self._optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none)


class NoHookState(torch.optim.Optimizer):
    """A DeepSpeed-style optimizer of its own that never runs Optimizer.__init__: no hook dictionaries."""

    def __init__(self, params) -> None:
        self.param_groups = [{"params": list(params), "lr": 0.1}]
        self.state = {}

    @torch.no_grad()
    def step(self, closure=None):
        for p in self.param_groups[0]["params"]:
            if p.grad is not None:
                p.add_(p.grad, alpha=-0.1)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.param_groups[0]["params"]:
            p.grad = None


@pytest.mark.parametrize(
    "wrap",
    [AcceleratedStyle, LightningStyle, lambda o: LightningStyle(AcceleratedStyle(o)), None],
    ids=["accelerate", "lightning", "both", "no-hook-state"],
)
def test_wrapped_optimizers_are_watched(wrap):
    for zero in (False, True):
        model = mlp()
        opt = NoHookState(model.parameters()) if wrap is None else wrap(torch.optim.SGD(model.parameters(), lr=0.1))
        with session(model, opt) as s:
            for x, y in batches(4):
                train_step(model, opt, x, y, zero=zero)
        assert s.hook_errors == []
        assert names(s) == ([] if zero else ["missing-zero-grad"])
        assert s.facts["optimizers"][0]["steps"] == 4
    if wrap is not None:
        assert s.facts["optimizers"][0]["label"] == "SGD"
    inner = getattr(opt, "_optimizer", opt)
    inner = getattr(inner, "optimizer", inner)
    assert not {"zero_grad", "step"} & (set(vars(opt)) | set(vars(inner)))  # every patch is taken off


def test_an_optimizer_without_one_is_a_one_line_error():
    with pytest.raises(TypeError, match="optimizer must be a Optimizer"):
        session(mlp(), object())


def test_a_hook_that_cannot_be_installed_is_named_and_the_rest_still_works():
    class FrozenZeroGrad(torch.optim.SGD):
        def __setattr__(self, name, value):
            if name == "zero_grad":
                raise AttributeError("read-only")
            super().__setattr__(name, value)

    model = mlp()
    opt = FrozenZeroGrad(model.parameters(), lr=0.1)
    with pytest.warns(
        UserWarning,
        match=r"could not watch FrozenZeroGrad.zero_grad \(AttributeError: read-only\); "
        r"checks that go without it: missing-zero-grad, nonfinite-values",
    ):
        s = session(model, opt).start()
    for x, y in batches(3):
        train_step(model, opt, x, y, zero=False)  # missing-zero-grad still sees it through its gradient hook
    model.eval()
    for _ in range(2):
        model(x).sum().item()  # the forward hook is still on
    s.stop()
    assert names(s) == ["missing-zero-grad", "eval-without-no-grad"] and len(s.facts["hooks_failed"]) == 1


@pytest.mark.parametrize("order", ["lifo", "fifo"])
def test_sessions_nest_and_stop_in_any_order(order):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    outer, inner = session(model, opt).start(), session(model, opt).start()
    for x, y in batches(3):
        train_step(model, opt, x, y, zero=False)
    for s in [inner, outer] if order == "lifo" else [outer, inner]:
        s.stop()
    assert names(outer) == names(inner) == ["missing-zero-grad"]
    assert "zero_grad" not in opt.__dict__ and not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks


def test_a_finished_session_holds_nothing():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    s = session(model, opt, loader=torch.utils.data.DataLoader(list(range(4))))
    with s:
        for x, y in batches(2):
            train_step(model, opt, x, y)
    refs = [weakref.ref(model), weakref.ref(opt)]
    del model, opt
    gc.collect()
    assert [r() for r in refs] == [None, None]
    with pytest.raises(RuntimeError, match="freed since it stopped"):
        s.start()


def test_a_finished_session_can_start_again_on_what_is_alive():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    s = session(model, opt)
    for _ in range(2):
        with s:
            for x, y in batches(3):
                train_step(model, opt, x, y, zero=False)
    assert [(f.name, f.count) for f in s.findings] == [("missing-zero-grad", 4)]


def _compiled_run(fullgraph: bool, watched: bool) -> tuple[int, int, list[str]]:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @torch.compile(fullgraph=fullgraph, backend="eager")
    def loss_of(x, y):
        return nn.functional.cross_entropy(model(x), y)

    s = session(model, opt, every=1).start() if watched else None
    for x, y in batches(12):
        opt.zero_grad()
        loss_of(x, y).backward()
        opt.step()
    if s is not None:
        s.stop()
    breaks = sum(counters["graph_break"].values())
    return breaks, counters["stats"]["unique_graphs"], problems(s) if s else []


@pytest.mark.parametrize("fullgraph", [True, False])
def test_compiling_a_function_that_calls_the_model_adds_no_graph_break_or_recompile(fullgraph):
    assert _compiled_run(fullgraph, watched=True) == _compiled_run(fullgraph, watched=False)[:2] + ([],)
    assert _compiled_run(fullgraph, watched=False)[:2] == (0, 1)


def test_torch_func_transforms_are_not_internal_errors():
    from torch.func import functional_call, grad, vmap

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_of(p, x, y):
        return nn.functional.cross_entropy(functional_call(model, p, (x.unsqueeze(0),)), y.unsqueeze(0))

    with session(model, opt, every=1) as s:
        for x, y in batches(3):
            per_sample = vmap(grad(loss_of), in_dims=(None, 0, 0))(params, x, y)  # DP-SGD style
            for k, p in model.named_parameters():
                p.grad = per_sample[k].mean(0)
            opt.step()
            train_step(model, opt, x, y)
    assert problems(s) == []


def test_a_model_on_the_meta_device_is_not_an_internal_error():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with session(model, opt, every=1) as s:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4, 8, device="meta")).sum().backward()
            opt.step()
    assert problems(s) == []
