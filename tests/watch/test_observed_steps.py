"""Long runs: watch observes every step of the first 32, then the periodic ones, and anything new at once."""

from __future__ import annotations

import torch
from conftest import batches, names, problems, session
from torch import nn

from torchdoctor.watch.contract import Event

STEPS = 1300  # past step 100 * every (1000), where the periodic steps come every 100


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3))


def _step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, zero: bool = True) -> None:
    if zero:
        opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def test_a_long_correct_run_is_quiet_and_observed_on_the_schedule():
    model, data = _model(), batches(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with session(model, opt) as s:
        for _ in range(STEPS):
            _step(model, opt, *data[0])
        hub = s._hub
    assert problems(s) == []
    ctx = hub.ctx
    observed = [n for n in range(STEPS) if ctx.observes(n)]
    assert observed[32:36] == [40, 50, 60, 70] and observed[-3:] == [1000, 1100, 1200]
    # the set-up checks (settings, which parameters the optimizers hold, every weight): every 100 steps, then 1000
    setup = [n for n in range(STEPS) if ctx.setup_due(n)]
    assert setup[:5] == [0, 10, 20, 30, 100] and setup[-3:] == [800, 900, 1000]
    assert hub.seen[Event.FORWARD] == len(observed)  # the other steps' forwards reached no check
    assert hub.seen[Event.PERIODIC] == len([n for n in range(STEPS) if ctx.periodic(n)])


def test_a_first_validation_late_in_a_run_is_news():
    """An evaluation with autograd on, first run at an unobserved step (1234): its forwards are of a new kind
    (eval mode), so they and the next step are observed."""
    model, data = _model(), batches(2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with session(model, opt) as s:
        for step in range(STEPS):
            if step == 1234:
                model.eval()
                for _ in range(3):
                    model(data[1][0])  # no torch.no_grad(): graphs recorded for nothing
                model.train()
            _step(model, opt, *data[0])
    found = [f for f in s.findings if f.name == "eval-without-no-grad"]
    assert found and found[0].location.step == 1234


def test_a_wrapped_model_put_in_eval_through_its_wrapper_is_news_too():
    """`dp.module.eval()` leaves the wrapper's own flag in train mode: the forwards are still of a new kind."""
    model, data = _model(), batches(2)
    wrapped = nn.DataParallel(model)  # on the CPU it calls the model itself
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with session(wrapped, opt) as s:
        for step in range(STEPS):
            if step == 1234:
                wrapped.module.eval()
                for _ in range(3):
                    wrapped(data[1][0])  # no torch.no_grad()
                wrapped.module.train()
            _step(wrapped, opt, *data[0])
    found = [f for f in s.findings if f.name == "eval-without-no-grad"]
    assert found and found[0].location.step == 1234


def test_a_model_left_in_eval_late_in_a_run_is_found_at_its_next_step():
    model, data = _model(), batches(2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with session(model, opt) as s:
        for step in range(STEPS):
            if step == 1111:
                model.eval()
                with torch.no_grad():
                    model(data[1][0])  # validation, and train() is never called again
            _step(model, opt, *data[0])
    found = [f for f in s.findings if f.name == "train-mode-not-restored"]
    assert found and found[0].location.step == 1111


def test_zero_grad_dropped_late_in_a_run_is_found_at_the_next_observed_step():
    model, data = _model(), batches(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with session(model, opt) as s:
        for step in range(STEPS):
            _step(model, opt, *data[0], zero=step < 1050)
    found = [f for f in s.findings if f.name == "missing-zero-grad"]
    assert found and found[0].location.step == 1100


def test_a_nan_between_observed_steps_names_the_last_step_read_finite():
    model, data = _model(), batches(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with session(model, opt, checks="nonfinite-values") as s:
        for step in range(1310):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(data[0][0]), data[0][1])
            (loss * float("nan") if step == 1234 else loss).backward()
            opt.step()
    first = s.findings[0]
    assert first.location.step == 1300
    assert "watch last read this gradient at step 1200, finite: it began at one of the steps since" in first.message


def test_clearing_again_without_a_step_is_news():
    """GradScaler-free skipped steps late in a run: zero_grad() again and again with no step between is observed,
    so the stalled run is reported after 50 of them, as early in a run."""
    model, data = _model(), batches(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with session(model, opt, checks="nonfinite-values") as s:
        for step in range(1234 + 60):
            opt.zero_grad()
            nn.functional.cross_entropy(model(data[0][0]), data[0][1]).backward()
            if step < 1234:
                opt.step()
    assert set(names(s)) == {"nonfinite-values"} and "skipped 50 times in a row" in s.findings[0].message
    assert s.findings[0].location.step == 1234


def test_instrumentation_for_observed_steps_is_off_at_the_others():
    """The loss taps (a patch of torch.nn.functional.cross_entropy) are on exactly at the observed steps."""
    model, data = _model(), batches(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    original = nn.functional.cross_entropy
    plain: list[bool] = []  # after each step: is the next one left unpatched?
    with session(model, opt) as s:
        for _ in range(1100):
            _step(model, opt, *data[0])
            plain.append(nn.functional.cross_entropy is original)
        ctx = s._hub.ctx
    assert nn.functional.cross_entropy is original
    assert [n + 1 for n in range(1100) if not plain[n]] == [n for n in range(1, 1101) if ctx.observes(n)]


def test_a_check_that_asks_for_every_step_gets_every_step(monkeypatch):
    """A plug-in check with ``every_step = True`` hears every forward and step; the others only observed ones."""
    from pitfall_factory import make_pitfall

    from torchdoctor import registry
    from torchdoctor.watch import RuntimeCheck

    heard: dict[str, list[int]] = {"every": [], "observed": []}

    class Every(RuntimeCheck):
        every_step = True

        def on_step_pre(self, event):
            heard["every"].append(event.step)

    class Observed(RuntimeCheck):
        def on_step_pre(self, event):
            heard["observed"].append(event.step)

    for code, name, cls in (("TD497", "test-every-step", Every), ("TD498", "test-observed-steps", Observed)):
        info = make_pitfall(code, name, "runtime", cls)
        monkeypatch.setitem(registry._CHECKS, info.name, info)
        monkeypatch.setitem(registry._BY_CODE, info.code, info.name)
    model, data = _model(), batches(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with session(model, opt, checks=["test-every-step", "test-observed-steps"]) as s:
        for _ in range(1100):
            _step(model, opt, *data[0])
        ctx = s._hub.ctx
    assert heard["every"] == list(range(1100))
    assert heard["observed"] == [n for n in range(1100) if ctx.observes(n)]
