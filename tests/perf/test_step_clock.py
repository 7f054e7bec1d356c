"""The step-time breakdown: its shares agree with torch.profiler on the same steps, it reaches the facts and the
printed report, and a session whose checks need no clock keeps none."""

import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import torchdoctor
from torchdoctor.watch.timing import PHASES, SAMPLE, SKIP, WINDOW, StepClock


class Slow(Dataset):
    """Each sample waits 1 ms: 16 ms of data wait per batch of 16."""

    def __len__(self) -> int:
        return 16 * 14

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(0.001)
        return torch.randn(512), i % 10


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(512, 512), nn.ReLU())], nn.Linear(512, 10))


def _step(model, opt, x, y, micro_steps: int = 1):
    opt.zero_grad()
    for _ in range(micro_steps):  # gradient accumulation: forward, backward, forward, backward, step
        nn.functional.cross_entropy(model(x.repeat(8, 1)), y.repeat(8)).backward()
    opt.step()


def _profiled_shares(prof) -> dict[str, float]:
    """data, backward and optimizer from the profiler's own ranges over its active steps; forward is the rest."""
    steps = data = backward = optimizer = 0.0
    for e in prof.events():
        span = e.time_range.elapsed_us()
        if e.name.startswith("ProfilerStep"):
            steps += span
        elif e.cpu_parent is None or e.cpu_parent.name.startswith("ProfilerStep"):
            if e.name.startswith("enumerate(DataLoader)"):
                data += span
            elif e.name.startswith("autograd::engine::evaluate_function"):
                backward += span
            elif e.name.startswith("Optimizer.step#"):
                optimizer += span
    shares = {"data": data / steps, "backward": backward / steps, "optimizer": optimizer / steps}
    return {**shares, "forward": 1 - sum(shares.values())}


@pytest.mark.parametrize("micro_steps", [1, 2])
def test_breakdown_agrees_with_the_profiler_on_the_same_steps(micro_steps, every_step):
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    loader = DataLoader(Slow(), batch_size=16)
    active = 10
    schedule = torch.profiler.schedule(wait=0, warmup=2, active=active, repeat=1)
    with torchdoctor.watch(model, opt, checks=["input-bound"], on_finding=lambda f: None, report=False) as session:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule) as prof:
            for x, y in loader:
                _step(model, opt, x, y, micro_steps)
                prof.step()
        clock = session._ctx.clock
    rows = clock.rows()[1 : active + 1]  # the profiler's active steps, newest first (the last step ran after them)
    ours = {name: sum(r[i] for r in rows) / sum(r[-1] for r in rows) for i, name in enumerate(PHASES)}
    ours["forward"] += ours.pop("other")  # the profiler's remainder holds what runs between the step and next batch
    theirs = _profiled_shares(prof)
    assert theirs["data"] > 0.1 and theirs["backward"] > 0.1  # the profiler saw both: the comparison means something
    print({k: (round(ours[k], 3), round(v, 3)) for k, v in theirs.items()})
    for name, share in theirs.items():
        assert abs(ours[name] - share) <= 0.10, (name, ours, theirs)


def test_breakdown_in_the_facts_and_the_printed_report(capsys):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchdoctor.watch(model, opt, checks=["input-bound"], on_finding=lambda f: None) as session:
        for x, y in DataLoader(Slow(), batch_size=16):
            _step(model, opt, x, y)
    facts = session.facts["step_time"]
    # 14 steps: the warm-up (step 0) and the multiples of 5 (5 and 10, which could be periodic steps) untimed
    assert facts["steps"] == 11 and facts["warmup_steps"] == 1 and facts["timed_every"] == SAMPLE
    assert set(facts["phases"]) == set(PHASES)
    assert sum(p["share"] for p in facts["phases"].values()) == pytest.approx(1, abs=1e-3)
    assert facts["phases"]["data"]["median_ms"] >= 16 * 0.9  # each batch slept 16 ms in the loader
    assert facts["loader"]["num_workers"] == 0 and facts["loader"]["batch_size"] == 16
    assert facts["step_median_ms"] <= facts["step_p90_ms"] and facts["steps_per_s"] > 0
    assert session.report().to_dict()["facts"]["step_time"] == facts
    err = capsys.readouterr().err
    assert "step time" in err and "steps/s" in err and "data " in err and "optimizer " in err


def test_no_clock_without_a_check_that_needs_it():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchdoctor.watch(model, opt, checks=["missing-zero-grad"], report=False) as session:
        for x, y in DataLoader(Slow(), batch_size=16):
            _step(model, opt, x, y)
            break
    assert session._ctx.clock is None and "step_time" not in session.facts
    assert not hasattr(torch.utils.data.dataloader._BaseDataLoaderIter.__next__, "__wrapped__")


def test_the_loader_patches_come_off_when_the_session_ends():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    from torch.utils.data import dataloader

    with torchdoctor.watch(model, opt, checks=["input-bound"], report=False):
        assert hasattr(dataloader._BaseDataLoaderIter.__next__, "__wrapped__")
        assert hasattr(dataloader._MultiProcessingDataLoaderIter.__init__, "__wrapped__")
    assert not hasattr(dataloader._BaseDataLoaderIter.__next__, "__wrapped__")
    assert not hasattr(dataloader._MultiProcessingDataLoaderIter.__init__, "__wrapped__")


def test_the_window_and_the_run_history_stay_bounded():
    clock = StepClock(first_optimizer=None)
    for _ in range(WINDOW * SAMPLE + 16 * 200):  # more timed steps than the window keeps, more blocks than are kept
        clock.step_pre()
        clock.step_post(None)
    assert clock.timed == WINDOW and len(clock.rows()) == WINDOW
    assert len(clock.blocks) < 128 and clock.block_size > 16


def test_a_failing_clock_stops_without_breaking_the_loop(monkeypatch, caplog):
    def broken(self, *args):
        raise RuntimeError("boom")

    monkeypatch.setattr(StepClock, "forward_end", broken)
    monkeypatch.setattr(StepClock, "data", broken)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchdoctor.watch(model, opt, checks=["input-bound"], report=False) as session:
        for x, y in DataLoader(Slow(), batch_size=16):
            _step(model, opt, x, y)
    assert session.facts["optimizers"][0]["steps"] == 14  # the loop ran to its end
    assert "step_time" not in session.facts and session.findings == []
    assert "the step clock stopped: RuntimeError: boom" in caplog.text


def test_the_clock_times_a_sample_of_the_steps_never_a_periodic_one(monkeypatch):
    """In the first 32 steps all but the multiples of 5, then one step in 10 (33, 43, ...): the hooks read the
    time only there, while every step is counted and every batch counts toward its loader's pass."""
    calls = {"forward_end": [], "backward_start": [], "step_pre": []}
    for name, seen in calls.items():
        original = getattr(StepClock, name)

        def counted(self, *args, original=original, seen=seen):
            seen.append(self.steps)  # the number of the step being run
            return original(self, *args)

        monkeypatch.setattr(StepClock, name, counted)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(4 * 60, 8), torch.randint(0, 2, (4 * 60,)))
    with torchdoctor.watch(model, opt, checks=["input-bound"], report=False) as session:
        for x, y in DataLoader(data, batch_size=4):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        clock, ctx = session._ctx.clock, session._ctx
    expected = [n for n in range(1, 32) if n % SKIP] + list(range(33, 60, SAMPLE))
    assert len(expected) == 28 and not any(ctx.periodic(n) for n in expected)
    for name, seen in calls.items():
        assert seen == expected, name
    assert clock.steps == 60 and clock.timed == len(expected) == len(clock.rows()) == len(clock.delay_rows())
    assert all(row[-1] > 0 for row in clock.rows())
    [loader] = clock.loaders.values()
    assert loader.batches == 61  # every __next__ counts toward the pass, timed or not (the last: StopIteration)
    assert session.facts["step_time"]["steps"] == len(expected)


def test_block_cpu_is_per_step_of_the_thread_timed_or_not(monkeypatch):
    """A block's CPU time is divided by all its steps, not by the timed ones among them. Deterministic: each
    step takes 1 ms of the thread's CPU time by a fake clock."""
    from torchdoctor.watch import timing

    cpu = [0.0]
    monkeypatch.setattr(timing.time, "thread_time", lambda: cpu[0])
    clock = StepClock(first_optimizer=None)
    for _ in range(1 + 16 * 6):  # the warm-up, then 6 blocks of 16 steps
        cpu[0] += 1e-3
        if clock.timing:
            clock.step_pre()
        clock.step_post(None)
    assert clock.block_size == 16 and clock.blocks_start == 1 and len(clock.blocks) == 6
    assert clock.block_cpu[0] == pytest.approx(17e-3 / 16)  # the first block also holds the warm-up's CPU time
    assert clock.block_cpu[1:] == pytest.approx([1e-3] * 5)
    assert 0 < clock.timed < 16 * 6  # a sample was timed
