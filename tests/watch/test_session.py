"""The watch session: entry styles, on_finding modes, selection, hook removal, contained faults, memory."""

from __future__ import annotations

import gc
import importlib.machinery
import logging
import subprocess
import sys
import tracemalloc
import warnings
import weakref

import pytest
import torch
from conftest import batches, mlp, names, session, train_step
from pitfall_factory import make_pitfall
from torch import nn
from torch.utils.data import DataLoader

import torchdoctor
from torchdoctor.watch import session as session_module
from torchdoctor.watch.context import WatchContext


def _no_zero_grad_loop(model, opt, steps: int = 3) -> None:
    for x, y in batches(steps):
        train_step(model, opt, x, y, zero=False)


def test_torchdoctor_import_and_check_listing_stay_torch_free():
    code = (
        "import sys, torchdoctor; from torchdoctor import registry; registry.all_checks('runtime'); "
        "torchdoctor.TorchDoctorWarning, torchdoctor.TorchDoctorError; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_context_manager_decorator_and_start_stop_find_the_same():
    found = []
    for style in ("with", "decorator", "start-stop"):
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        s = session(model, opt)
        if style == "with":
            with s:
                _no_zero_grad_loop(model, opt)
        elif style == "decorator":
            s(_no_zero_grad_loop)(model, opt)
        else:
            s.start()
            assert s.start() is s  # idempotent
            _no_zero_grad_loop(model, opt)
            s.stop()
        found.append([(f.name, f.code, f.count, f.location.step) for f in s.findings])
    assert found[0] == found[1] == found[2] == [("missing-zero-grad", "TD301", 2, 1)]


def test_findings_carry_the_public_fields():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with session(model, opt) as s:
        _no_zero_grad_loop(model, opt)
    f = s.findings[0]
    assert (f.name, f.code, str(f.severity), f.count) == ("missing-zero-grad", "TD301", "error", 2)
    assert f.message and f.fix and f.location.param == "2.bias"
    assert f.to_dict()["location"] == {"param": "2.bias", "step": 1}


def test_warn_mode_warns_once_per_finding():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with pytest.warns(torchdoctor.TorchDoctorWarning) as record:
        with torchdoctor.watch(model, opt, report=False):
            _no_zero_grad_loop(model, opt, steps=5)
    assert len(record) == 1 and "TD301 missing-zero-grad" in str(record[0].message)
    assert issubclass(torchdoctor.TorchDoctorWarning, UserWarning)


def test_raise_mode_stops_at_the_first_error_and_cleans_up():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with pytest.raises(torchdoctor.TorchDoctorError, match="TD301") as info:
        with torchdoctor.watch(model, opt, on_finding="raise", report=False):
            _no_zero_grad_loop(model, opt, steps=5)
    assert info.value.finding.name == "missing-zero-grad"
    assert not opt._optimizer_step_pre_hooks and not torch.nn.modules.module._global_forward_hooks
    assert nn.Module.__dict__["_call_impl"] is ORIGINAL_CALL_IMPL


def test_log_mode_and_callable_mode(caplog):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with caplog.at_level(logging.INFO, logger="torchdoctor"):
        with torchdoctor.watch(model, opt, on_finding="log", report=False):
            _no_zero_grad_loop(model, opt)
    assert [r.levelname for r in caplog.records] == ["ERROR"] and "TD301" in caplog.records[0].getMessage()
    got = []
    with torchdoctor.watch(model, opt, on_finding=got.append, report=False):
        _no_zero_grad_loop(model, opt)
    assert [f.name for f in got] == ["missing-zero-grad"]


def test_select_and_ignore_by_name_or_code_and_unknown_names():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with session(model, opt, ignore=["missing-zero-grad"]) as s:
        _no_zero_grad_loop(model, opt)
    assert s.findings == []
    with session(model, opt, checks="TD301") as s:
        _no_zero_grad_loop(model, opt)
    assert names(s) == ["missing-zero-grad"] and s.facts["checks"] == ["missing-zero-grad"]
    with pytest.raises(ValueError, match="unknown check 'no-such-check'"):
        session(model, opt, checks=["no-such-check"])


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"model": "net"}, "model must be a Module"),
        ({"every": 0}, "every must be a positive"),
        ({"on_finding": "shout"}, "on_finding must be one of"),
        ({"loader": [1]}, "loader must be a DataLoader"),
    ],
)
def test_bad_arguments_are_one_line_errors(kwargs, error):
    args = {"model": mlp(), **kwargs}
    with pytest.raises((TypeError, ValueError), match=error):
        torchdoctor.watch(args.pop("model"), **args)


def _hook_counts(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    return {
        "forward": sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
        + len(torch.nn.modules.module._global_forward_hooks)
        + int(nn.Module.__dict__["_call_impl"] is not ORIGINAL_CALL_IMPL),  # watch's forward patch
        "step": len(opt._optimizer_step_pre_hooks) + len(opt._optimizer_step_post_hooks),
        "grad": sum(len(p._backward_hooks or {}) for p in model.parameters()),
        "zero_grad": int("zero_grad" in vars(opt)) + int("zero_grad" in vars(model)),  # only the optimizer's
        "loader": DataLoader.__iter__ is ORIGINAL_ITER,
        "saved": torch._C._autograd._top_saved_tensors_default_hooks(False) is None,
    }


ORIGINAL_ITER = DataLoader.__iter__
ORIGINAL_CALL_IMPL = nn.Module.__dict__["_call_impl"]
CLEAN = {"forward": 0, "step": 0, "grad": 0, "zero_grad": 0, "loader": True, "saved": True}


def test_every_hook_is_removed_on_exit_and_after_an_exception():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(list(zip(*batches(1)[0])), batch_size=4)
    assert _hook_counts(model, opt) == CLEAN
    for fail in (False, True):
        with pytest.raises(KeyError) if fail else _nothing():
            with session(model, opt, every=1) as s:
                for x, y in loader:
                    train_step(model, opt, x, y)
                train_step(model, opt, x, y)  # the missing-zero-grad sentinel hook is installed now
                inside = _hook_counts(model, opt)
                if fail:
                    raise KeyError("boom")
        assert inside["forward"] and inside["step"] and inside["grad"] and inside["zero_grad"] == 1
        assert not inside["loader"] and inside["saved"]  # saved-tensor hooks are never used
        assert _hook_counts(model, opt) == CLEAN
        assert not s.active


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_check_that_raises_is_disabled_reported_once_and_training_goes_on(monkeypatch):
    from torchdoctor.checks.missing_zero_grad import MissingZeroGrad

    calls = []

    def broken(self, event):
        calls.append(event.step)
        raise ZeroDivisionError("bug in a check")

    monkeypatch.setattr(MissingZeroGrad, "on_step_pre", broken)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    before = [p.detach().clone() for p in model.parameters()]
    with session(model, opt, every=1) as s:
        for x, y in batches(5):
            train_step(model, opt, x, y)
    assert calls == [0]  # disabled after its first fault
    [f] = s.findings
    assert f.code == "TD301" and str(f.severity) == "info" and f.count == 1
    assert "failed internally" in f.message and "ZeroDivisionError: bug in a check" in f.message
    assert s.facts["optimizers"][0]["steps"] == 5
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_a_check_that_fails_to_start_does_not_stop_the_others(monkeypatch):
    from torchdoctor.checks.nondeterministic_settings import NondeterministicSettings

    monkeypatch.setattr(NondeterministicSettings, "on_start", lambda self: 1 / 0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with session(model, opt) as s:
        _no_zero_grad_loop(model, opt)
    assert sorted(names(s)) == ["missing-zero-grad", "nondeterministic-settings"]


def test_the_report_is_printed_on_exit_to_stderr(capsys):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torchdoctor.watch(model, opt, on_finding=lambda f: None):
        _no_zero_grad_loop(model, opt)
    err = capsys.readouterr().err
    assert "torchdoctor runtime · Sequential" in err and "TD301 missing-zero-grad" in err and "(×2)" in err
    assert "optimizer SGD  3 steps" in err
    with torchdoctor.watch(model, opt, report=False):
        pass
    assert capsys.readouterr().err == ""


def test_wrapped_models_are_seen_through(monkeypatch):
    model = mlp()
    with monkeypatch.context() as m:  # without a GPU, DataParallel just calls the CPU module
        m.setattr(torch.cuda, "is_available", lambda: False)
        dp = nn.DataParallel(model)
    opt = torch.optim.SGD(dp.parameters(), lr=0.01)
    with session(dp, opt) as s:
        _no_zero_grad_loop(dp, opt)
    assert s.findings[0].location.param == "2.bias"  # no "module." prefix
    assert s.facts["models"] == [{"label": "Sequential", "wrappers": ["DataParallel"], "parameters": 195}]


def test_the_session_keeps_no_tensor_and_no_model_alive():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    s = session(model, opt, every=1)
    with s:
        x, y = batches(1)[0]
        loss = train_step(model, opt, x, y)
        gone = [weakref.ref(loss), weakref.ref(x)]
        del loss, x
        gc.collect()
        assert [r() for r in gone] == [None, None]  # nothing kept between steps
        train_step(model, opt, *batches(1)[0])
    assert s.findings == [] and s._ctx.models == []
    ref = weakref.ref(model)
    del model, opt  # a finished session holds its arguments only weakly
    gc.collect()
    assert ref() is None


def test_no_memory_growth_of_its_own_over_1000_steps():
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 4), torch.randn(8, 2)

    def step():
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    # tracemalloc makes every allocation of the loop slower, and its snapshots are real work inside the loop:
    # the steps' CPU time moves, which is step-time-drift's evidence, not this test's subject
    with session(model, opt, every=1, ignore=["step-time-drift"]) as s:
        tracemalloc.start()
        for _ in range(200):  # let allocator free lists and caches settle while traced
            step()
        gc.collect()
        first = tracemalloc.take_snapshot()
        for _ in range(1000):
            step()
        gc.collect()
        second = tracemalloc.take_snapshot()
        tracemalloc.stop()
    ours = [tracemalloc.Filter(True, "*torchdoctor*"), tracemalloc.Filter(True, "*checks/runtime_*")]
    growth = sum(d.size_diff for d in second.filter_traces(ours).compare_to(first.filter_traces(ours), "filename"))
    # one leaked object per step would be >= 28 KB (an int); what remains is allocator free-list noise
    assert growth < 16384, f"watch grew by {growth} bytes over 1000 steps"
    assert s.findings == [] and s.facts["optimizers"][0]["steps"] == 1200


def test_checks_see_the_context_they_are_documented_to_see():
    model, other = mlp(), mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = {}

    def spy(finding):
        pass

    s = session([model, other], opt, every=3, on_finding=spy)
    with s:
        ctx: WatchContext = s._ctx
        seen["labels"] = [wm.label for wm in ctx.models]
        seen["name"] = ctx.param_name(next(other.parameters()))
        seen["every"] = ctx.every
    assert seen == {"labels": ["Sequential#1", "Sequential#2"], "name": "Sequential#2.0.weight", "every": 3}
    assert s._ctx.models == []  # released at exit


def test_a_compiled_model_is_seen_through_even_when_compiled_before_watch():
    model = mlp()
    compiled = torch.compile(model, backend="eager")
    opt = torch.optim.SGD(compiled.parameters(), lr=0.1)
    x, y = batches(1)[0]
    train_step(compiled, opt, x, y)  # first compiled call before the session starts
    with session(compiled, opt) as s:
        for _ in range(3):
            train_step(compiled, opt, x, y, zero=False)
        model.eval()
        for _ in range(2):
            compiled(x).sum().item()
    assert [(f.name, f.location.param or f.location.module) for f in s.findings] == [
        ("missing-zero-grad", "2.bias"),
        ("eval-without-no-grad", "Sequential"),
    ]
    assert s.facts["models"][0]["wrappers"] == ["torch.compile"]


def test_instrumentation_failing_inside_backward_or_data_loading_is_contained(monkeypatch):
    from torchdoctor.checks import missing_zero_grad

    from torchdoctor.watch import fingerprint

    class Exploding(list):
        def append(self, item):
            raise MemoryError("no room")

    original_init = missing_zero_grad._Sentinel.__init__

    def init(self, param):
        original_init(self, param)
        self.zero_flags = Exploding()

    monkeypatch.setattr(missing_zero_grad._Sentinel, "__init__", init)
    monkeypatch.setattr(fingerprint, "fingerprint", lambda batch: 1 / 0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(torch.arange(24.0).view(24, 1))

    loader = DataLoader(Stream(), batch_size=4, num_workers=2)
    with session(model, opt) as s:
        assert sum(len(b) for b in loader) == 48  # data loading went on
        _no_zero_grad_loop(model, opt, steps=4)  # so did backward, with the sentinel's hook failing
    faults = {f.name: f for f in s.findings if "failed internally" in f.message}
    assert "MemoryError: no room" in faults["missing-zero-grad"].message
    assert "ZeroDivisionError" in faults["iterable-dataset-duplication"].message


@pytest.mark.gloo_in_process
def test_distributed_runtime_checks_join_under_torch_distributed(tmp_path, monkeypatch, capsys):
    import torch.distributed as dist

    from torchdoctor import registry
    from torchdoctor.findings import Finding
    from torchdoctor.watch import RuntimeCheck

    class CrossRank(RuntimeCheck):  # what a ddp_*.py check of issue 5 looks like
        def on_periodic(self, event):
            flag = torch.ones(1)
            dist.all_reduce(flag)  # collectives are safe here: same steps on every rank
            yield Finding(f"saw {int(flag)} rank(s) of {self.ctx.world_size} at step {event.step}")

    info = make_pitfall("TD499", "test-cross-rank", "distributed", CrossRank)
    monkeypatch.setitem(registry._CHECKS, info.name, info)
    monkeypatch.setitem(registry._BY_CODE, info.code, info.name)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        with session(model, opt, every=2) as s:
            for x, y in batches(3):
                train_step(model, opt, x, y)
        # one problem, whatever the step in its message: folded, keeping the first step's words
        assert [(f.name, f.message, f.count) for f in s.findings] == [
            ("test-cross-rank", "saw 1 rank(s) of 1 at step 0", 2)
        ]
        ddp = nn.parallel.DistributedDataParallel(mlp())
        ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        with session(ddp, ddp_opt, ignore="test-cross-rank") as s:
            _no_zero_grad_loop(ddp, ddp_opt)
        assert [(f.name, f.location.param) for f in s.findings] == [("missing-zero-grad", "2.bias")]
        assert s.facts["models"][0]["wrappers"] == ["DistributedDataParallel"]
        monkeypatch.setattr(dist, "get_rank", lambda *a: 1)
        with torchdoctor.watch(model, opt, on_finding=lambda f: None):
            pass
        assert capsys.readouterr().err == ""  # only rank 0 prints the report
    finally:
        dist.destroy_process_group()
    with session(model, opt) as s:
        train_step(model, opt, *batches(1)[0])
    assert s.findings == []  # without torch.distributed the distributed checks stay out


def test_saving_and_copying_the_model_during_a_session_carries_nothing_of_watch():
    import copy
    import io

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchdoctor.watch(model, opt, on_finding=lambda f: None, report=False):  # a local, unpicklable callback
        for x, y in batches(2):
            train_step(model, opt, x, y)
        buffer = io.BytesIO()
        torch.save(model, buffer)  # a whole pickled model, as many scripts still do
        ema = copy.deepcopy(model)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for m in (loaded, ema):
        assert not any(sub._forward_hooks for sub in m.modules())
        assert not any(p._backward_hooks for p in m.parameters())


def test_a_warning_at_a_line_of_another_file_than_the_callers_is_said_at_that_line(tmp_path):
    """At the end of `torchdoctor run` the caller is the console script, and a finding names the user's
    file and line: the warning must not read that line from the console script's source."""
    launcher = tmp_path / "torchdoctor_script.py"
    launcher.write_text("warn(TorchDoctorWarning('found'), (train, 40))\n")
    script = {
        "__name__": "__main__",
        "__loader__": importlib.machinery.SourceFileLoader("__main__", str(launcher)),
        "warn": session_module._warn_at_user_line,
        "TorchDoctorWarning": torchdoctor.TorchDoctorWarning,
        "train": str(tmp_path / "train.py"),
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(launcher.read_text(), str(launcher), "exec"), script)
    assert [(w.filename, w.lineno) for w in caught] == [(str(tmp_path / "train.py"), 40)]


def test_nested_sessions_share_the_forward_patch_and_stop_in_any_order():
    """Two sessions over two models: each hears exactly its own model's forwards, a forward that raises
    leaves the call depth right (the next forwards are still heard), and the patch of nn.Module._call_impl
    stays while one session listens and is gone once both stopped, whichever stops first."""
    from torchdoctor.watch.contract import Event

    a, b = mlp(), mlp()
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
    outer = session(a, opt_a).start()
    inner = session(b, opt_b).start()
    with pytest.raises(RuntimeError):
        a(torch.randn(2, 5))  # wrong width: the forward raises inside the patch
    for x, y in batches(3):
        train_step(a, opt_a, x, y)
        train_step(b, opt_b, x, y)
    b[0](torch.randn(2, 8))  # a submodule called on its own: heard by b's session only
    heard = (outer._hub.seen.get(Event.FORWARD), inner._hub.seen.get(Event.FORWARD))
    outer.stop()  # the outer one first: the inner one still hears b
    assert nn.Module.__dict__["_call_impl"] is not ORIGINAL_CALL_IMPL
    train_step(b, opt_b, *batches(1)[0])
    assert inner._hub.seen.get(Event.FORWARD) == 5
    inner.stop()
    assert heard == (3, 4)
    assert nn.Module.__dict__["_call_impl"] is ORIGINAL_CALL_IMPL
    assert outer.findings == [] and inner.findings == []
