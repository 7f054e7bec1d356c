"""watch's patches and hooks under torch.compile: they never become a compiled frame of their own, never make
dynamo recompile the user's model, never run on torch.compile's fake tensors; and `recompiling` still fires
on a value that changes every step, naming the user's forward."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from conftest import problems, session
from torch import nn


class LossInside(nn.Module):
    """A model whose forward computes its loss (nanoGPT's shape), with dropout (train/eval differ)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.drop = nn.Linear(16, 32), nn.Linear(32, 4), nn.Dropout(0.1)

    def forward(self, x, y):
        logits = self.b(self.drop(torch.relu(self.a(x))))
        return logits, F.cross_entropy(logits, y)


def _periodic_eval_loop(watched: bool) -> tuple[list[str], list[str]]:
    """12 steps of a compiled LossInside, evaluated under no_grad and eval() every 4 steps: (the compiled
    functions' guard failures, the session's problems)."""
    from torch._dynamo.utils import guard_failures

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = LossInside()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = torch.compile(model, backend="eager")
    s = session(compiled, opt, every=2).start() if watched else None  # every=2: observing pauses and resumes
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    for step in range(12):
        if step % 4 == 0:
            with torch.no_grad():
                compiled.eval()
                compiled(x, y)
                compiled.train()
        opt.zero_grad()
        compiled(x, y)[1].backward()
        opt.step()
    if s is not None:
        s.stop()
    failures = [f"{code.co_name}: {str(r).split(':')[1].strip()}" for code, rs in guard_failures.items() for r in rs]
    torch._dynamo.reset()
    return failures, problems(s) if s is not None else []


def test_a_compiled_model_computing_its_loss_recompiles_under_watch_only_as_it_does_alone():
    unwatched, _ = _periodic_eval_loop(watched=False)
    assert unwatched == ["forward: GLOBAL_STATE changed"]  # one version under no_grad, one for training
    assert _periodic_eval_loop(watched=True) == (unwatched, [])


def test_a_model_compiled_after_watch_was_given_it_compiles_none_of_watchs_code():
    """watch(model), then torch.compile(model): the listeners run inside the compiled module's call, and
    dynamo must compile neither them nor the checks they call (it compiled the session's forward handler)."""
    from torch._dynamo.utils import guard_failures

    torch._dynamo.reset()
    model = LossInside()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    with session(model, opt) as s:
        compiled = torch.compile(model, backend="eager")
        for step in range(6):
            if step % 3 == 0:
                with torch.no_grad():
                    compiled(x, y)
            opt.zero_grad()
            compiled(x, y)[1].backward()
            opt.step()
    assert [(code.co_name, code.co_filename) for code in guard_failures] == [("forward", __file__)]
    assert problems(s) == []
    torch._dynamo.reset()


def test_loss_taps_skip_fake_tensors():
    """torch.compile traces the functions of its graph on fake tensors (a loss tap's listener there can read
    no value: DataDependentOutputException before this was fixed)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    model = nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with session(model, opt, every=1) as s:
        with FakeTensorMode():
            probs = torch.softmax(torch.randn(16, 4, requires_grad=True), dim=1)
            F.cross_entropy(probs, torch.randint(0, 4, (16,)))
            F.nll_loss(probs, torch.randint(0, 4, (16,)))
        x = torch.randn(16, 8)
        opt.zero_grad()
        F.cross_entropy(model(x), torch.randint(0, 4, (16,))).backward()
        opt.step()
    assert problems(s) == [] and s.findings == []


def test_root_listeners_hear_outermost_calls_and_cost_a_compiled_model_no_recompile():
    from torch._dynamo.utils import guard_failures

    from torchdoctor.watch.calls import RootPatch

    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    compiled = torch.compile(model, backend="eager")
    compiled(torch.randn(2, 4))
    heard: list[nn.Module] = []
    patch = RootPatch(heard.append)
    compiled(torch.randn(2, 4))
    model(torch.randn(2, 4))
    patch.remove()
    compiled(torch.randn(2, 4))
    assert heard == [compiled, model]  # the outermost calls only, never the layers inside
    assert all(not rs for rs in guard_failures.values())
    torch._dynamo.reset()


class Stepped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 4)

    def forward(self, x, step):
        return self.a(x) * (1 + step % 100)


def test_recompiling_fires_on_a_python_number_that_changes_every_step_at_the_users_forward():
    torch._dynamo.reset()
    model = Stepped()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model, backend="eager", dynamic=False)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    with session(compiled, opt, checks=["recompiling"]) as s:
        for step in range(7):
            opt.zero_grad()
            F.cross_entropy(compiled(x, step), y).backward()
            opt.step()
    [finding] = s.findings
    assert "Stepped.forward()" in finding.message and "keeps changing" in finding.message
    assert finding.location.file == __file__ and finding.location.line == Stepped.forward.__code__.co_firstlineno
    torch._dynamo.reset()


def _mode_loop() -> tuple[list, int]:
    """Evaluation, inference and mixed precision between training steps of a compiled model: (the findings
    of `recompiling`, the recompilations)."""

    from torch._dynamo.utils import guard_failures

    torch._dynamo.reset()
    model = LossInside()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model, backend="eager")
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    modes = [
        torch.no_grad,
        lambda: torch.autocast("cpu", dtype=torch.bfloat16),
        lambda: contextlib.ExitStack(),  # training, grad on
        lambda: _both(torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16)),
        lambda: torch.autograd.set_grad_enabled(False),
        lambda: torch.autocast("cpu", dtype=torch.float16),
    ]
    with session(compiled, opt, checks=["recompiling"]) as s:
        for step in range(18):
            with modes[step % len(modes)]():
                compiled(x, y)
            opt.zero_grad()
            compiled(x, y)[1].backward()
            opt.step()
    recompiles = sum(str(r).split(":")[0].endswith("/0") for rs in guard_failures.values() for r in rs)
    torch._dynamo.reset()
    return s.findings, recompiles


def test_recompiling_quiet_on_mode_combinations_that_repeat():
    """One compiled version per mode combination, then none: only reaching the recompile limit is a finding."""
    findings, recompiles = _mode_loop()
    assert recompiles == 4 and findings == []  # 4: as many as a shape that changes every step needs to fire


def test_recompiling_fires_when_mode_combinations_reach_the_recompile_limit():
    with torch._dynamo.config.patch(recompile_limit=4):
        [finding], _ = _mode_loop()
    assert "reached the recompile limit (4)" in finding.message and "combinations of grad mode" in finding.message
    assert finding.fix.code == "torch._dynamo.config.recompile_limit = 32"


@contextlib.contextmanager
def _both(a, b):
    with a, b:
        yield
