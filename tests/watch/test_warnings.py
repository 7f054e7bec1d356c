"""The warnings of `watch(on_finding="warn")`: said at the user's line, with the fix's code and how to silence it."""

from __future__ import annotations

import re
import sys
import warnings

import pytest
import torch
from conftest import batches, mlp
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import torchdoctor
from torchdoctor.errors import TorchDoctorWarning


def _line_below() -> int:
    """The number of the line after the caller's: the line a warning must point at."""
    return sys._getframe(1).f_lineno + 1


def _watched(model, opt=None, **kwargs):
    return torchdoctor.watch(model, opt, report=False, **kwargs)


def test_a_step_warning_points_at_the_users_step_call_and_carries_the_fix_code():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _watched(model, opt):
            for x, y in batches(3):
                nn.functional.cross_entropy(model(x), y).backward()
                line = _line_below()
                opt.step()  # no zero_grad(): missing-zero-grad at the second step
    [w] = [w for w in caught if issubclass(w.category, TorchDoctorWarning)]
    assert (w.filename, w.lineno) == (__file__, line)
    text = str(w.message)
    assert text.startswith("TD301 missing-zero-grad: ")
    lines = text.splitlines()
    assert "  fix: Clear the gradients once per optimizer step:" in lines
    assert any(line.strip().startswith("optimizer.zero_grad(") for line in lines)  # the code, not just the title
    assert lines[-1].startswith('  Silence it with `torchdoctor.watch(model, optimizer, ignore=["missing-zero-grad"])`')
    assert lines[-1].endswith("under `[tool.torchdoctor]`.")


def test_forward_and_loader_warnings_point_at_the_users_lines():
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(16, 8), torch.randint(0, 3, (16,)))
    sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    seen = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _watched(model, opt, loader=loader):
            for _ in range(2):
                seen["loader"] = _line_below()
                for x, y in loader:  # set_epoch() never called: sampler-epoch-not-set at the second pass
                    opt.zero_grad()
                    nn.functional.cross_entropy(model(x), y).backward()
                    opt.step()
            with torch.no_grad():  # validation without model.eval(): train-mode-in-eval
                for x, _ in loader:
                    seen["forward"] = _line_below()
                    model(x)
    where = {
        w.message.args[0].split(":")[0]: (w.filename, w.lineno)
        for w in caught
        if issubclass(w.category, TorchDoctorWarning)
    }
    assert where["TD311 sampler-epoch-not-set"] == (__file__, seen["loader"])
    assert where["TD307 train-mode-in-eval"] == (__file__, seen["forward"])


def test_warning_filters_apply_to_the_users_module():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=TorchDoctorWarning, module=re.escape(__name__) + "$")
        with _watched(model, opt) as s:
            for x, y in batches(3):
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
    assert [f.name for f in s.findings] == ["missing-zero-grad"]
    assert not [w for w in caught if issubclass(w.category, TorchDoctorWarning)]


def test_raise_and_log_modes_carry_the_fix_code(caplog):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level("WARNING", logger="torchdoctor"), _watched(model, opt, on_finding="log"):
        for x, y in batches(3):
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    [record] = [r for r in caplog.records if r.message.startswith("TD301")]
    assert "optimizer.zero_grad(" in record.message and 'ignore=["missing-zero-grad"]' in record.message
    with pytest.raises(torchdoctor.TorchDoctorError, match=r"(?s)TD301.*optimizer\.zero_grad\("):
        with _watched(model, opt, on_finding="raise"):
            for x, y in batches(3):
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()


TRAIN_PY = """\
import torch
from torch import nn
import torchdoctor

model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with torchdoctor.watch(model, opt, report=False):
    for _ in range(3):
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
"""


def test_a_warning_from_python_train_py_under_w_error_deprecation_is_said_and_breaks_nothing(tmp_path, monkeypatch):
    """`python train.py`'s `__main__` has `__loader__` but `__spec__` None: Python 3.12's warn_explicit then warns
    DeprecationWarning about such module_globals, which `-W error::DeprecationWarning` made an exception inside
    the user's `opt.step()` (emulated here as importlib._bootstrap_external._bless_my_loader does it, so the test
    fails on any Python)."""
    import importlib.machinery

    real = warnings.warn_explicit

    def as_312(*args, module_globals=None, **kwargs):
        if module_globals is not None:
            loader = module_globals.get("__loader__")
            spec_loader = getattr(module_globals.get("__spec__"), "loader", None)
            if spec_loader is None and loader is None:
                raise ValueError("Module globals is missing a __spec__.loader")
            if spec_loader is None:
                warnings.warn("Module globals is missing a __spec__.loader", DeprecationWarning, stacklevel=1)
            elif loader is not None and loader != spec_loader:
                warnings.warn("Module globals; __loader__ != __spec__.loader", DeprecationWarning, stacklevel=1)
        return real(*args, module_globals=module_globals, **kwargs)

    monkeypatch.setattr(warnings, "warn_explicit", as_312)
    path = tmp_path / "train.py"
    path.write_text(TRAIN_PY)
    main = {"__name__": "__main__", "__file__": str(path), "__spec__": None}
    main["__loader__"] = importlib.machinery.SourceFileLoader("__main__", str(path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("error", category=DeprecationWarning)
        exec(compile(TRAIN_PY, str(path), "exec"), main)  # as runpy runs `python train.py`
    [w] = [w for w in caught if issubclass(w.category, TorchDoctorWarning)]
    assert w.message.args[0].startswith("TD301 missing-zero-grad") and (w.filename, w.lineno) == (str(path), 10)


def test_a_warning_from_a_module_run_as_main_is_said_at_its_line(tmp_path, monkeypatch):
    """`torchdoctor run -m pkg.train` runs the module by runpy.run_module as `__main__`, with the loader of
    "pkg.train": handing warn_explicit those globals made it ask that loader for the source of "__main__"
    ("loader for pkg.train cannot handle __main__"), and the warning was only logged, on every Python."""
    import runpy

    (tmp_path / "watchedpkg").mkdir()
    (tmp_path / "watchedpkg" / "__init__.py").write_text("")
    path = tmp_path / "watchedpkg" / "train.py"
    path.write_text(TRAIN_PY)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            runpy.run_module("watchedpkg.train", run_name="__main__", alter_sys=True)
    finally:
        sys.modules.pop("watchedpkg", None)
    [w] = [w for w in caught if issubclass(w.category, TorchDoctorWarning)]
    assert w.message.args[0].startswith("TD301 missing-zero-grad") and (w.filename, w.lineno) == (str(path), 10)
