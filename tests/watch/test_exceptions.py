"""Crash explanations inside watch: known PyTorch errors propagate unchanged and the report's findings explain
them from what the session saw (the CRASH event; tests/pitfalls/test_crash_explanations.py has each pitfall)."""

from __future__ import annotations

import pytest
import torch
from conftest import batches, mlp, session, train_step
from torch import nn


def _raises_through(model, opt, body):
    s = session(model, opt)
    with pytest.raises(Exception) as info:
        with s:
            body()
    return s, info.value


def test_dtype_mismatch_is_explained_by_the_pitfall_and_the_exception_is_the_same_object():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = batches(1)[0]
    raised = []

    def body():
        train_step(model, opt, x, y)
        try:
            model(x.double())
        except RuntimeError as exc:
            raised.append(exc)
            raise

    s, exc = _raises_through(model, opt, body)
    assert exc is raised[0]  # the very same exception object
    (finding,) = s.findings
    assert finding.name == "dtype-mismatch" and finding.location.step == 1 and finding.location.module == "0"
    assert "Linear `0` holds float32 parameters (weight, bias); it was handed `input` as float64" in finding.message


def test_backward_twice_and_the_live_graph_count():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batches(1)[0]

    def body():
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        loss.backward()

    s, exc = _raises_through(model, opt, body)
    assert "a second time" in str(exc)
    (finding,) = s.findings
    assert finding.name == "backward-through-freed-graph" and ".detach()" in finding.fix.code


def test_inplace_modification_advises_anomaly_mode():
    model = nn.Sequential(nn.Linear(8, 8), nn.Sigmoid())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def body():
        out = model(torch.randn(4, 8))
        out.mul_(2)  # sigmoid saved its output
        out.sum().backward()

    s, _ = _raises_through(model, opt, body)
    (finding,) = s.findings
    assert finding.name == "inplace-modified-for-backward" and "an activation was modified" in finding.message
    assert "set_detect_anomaly" in finding.fix.code


def test_backward_of_a_loss_computed_under_no_grad():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batches(1)[0]

    def body():
        with torch.no_grad():
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()

    s, _ = _raises_through(model, opt, body)
    (finding,) = s.findings
    assert finding.name == "backward-without-graph" and "the forward ran without gradients" in finding.message
    assert "the last forward of Sequential ran with torch.no_grad()" in finding.message
    assert "Sequential has 4 of 4 parameter tensors with requires_grad=True" in finding.message


def test_load_state_dict_with_a_wrapper_prefix_is_explained_by_the_pitfall():
    model = mlp()
    wrapped = {f"module.{k}": v for k, v in model.state_dict().items()}

    def body():
        model.load_state_dict(wrapped)

    s, _ = _raises_through(model, None, body)
    (finding,) = s.findings
    assert finding.name == "state-dict-mismatch" and "prefix 'module.'" in finding.message
    assert s.facts["crash_explained_by"] == ["state-dict-mismatch"]


def test_the_printed_report_leads_with_the_explanation_and_keeps_earlier_findings(capsys):
    import torchdoctor

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batches(1)[0]
    with pytest.raises(RuntimeError):
        with torchdoctor.watch(model, opt, on_finding=lambda f: None) as s:
            for _ in range(2):
                train_step(model, opt, x, y, zero=False)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            loss.backward()
    assert sorted(f.name for f in s.findings) == ["backward-through-freed-graph", "missing-zero-grad"]
    assert s.facts["crash_explained_by"] == ["backward-through-freed-graph"]
    err = capsys.readouterr().err
    assert "TD338 backward-through-freed-graph" in err and "TD301 missing-zero-grad" in err


def test_raise_mode_never_replaces_the_users_exception(monkeypatch):
    from torchdoctor.checks.graph_retention_leak import GraphRetentionLeak

    import torchdoctor
    from torchdoctor.findings import Finding

    monkeypatch.setattr(GraphRetentionLeak, "on_stop", lambda self: iter([Finding("an error found at exit")]))
    model = mlp()
    with pytest.raises(RuntimeError) as info, pytest.warns(torchdoctor.TorchDoctorWarning, match="at exit"):
        with torchdoctor.watch(model, on_finding="raise", report=False) as s:  # the finding is warned instead
            model(torch.zeros(2, 8, dtype=torch.float64))
    assert type(info.value) is RuntimeError and "dtype" in str(info.value)
    assert [f.name for f in s.findings] == ["dtype-mismatch", "graph-retention-leak"]  # the crash explained, quietly
    with pytest.raises(torchdoctor.TorchDoctorError, match="an error found at exit"):
        with torchdoctor.watch(model, on_finding="raise", report=False):
            pass  # without a user exception, "raise" applies at exit too


def test_unknown_errors_are_not_explained():
    s, _ = _raises_through(mlp(), None, lambda: (_ for _ in ()).throw(KeyError("x")))
    assert s.findings == [] and "crash_explained_by" not in s.facts


def test_device_mismatch_is_explained_by_the_pitfall():
    model = mlp()
    s, exc = _raises_through(model, None, lambda: model(torch.randn(2, 8, device="meta")))
    assert "expected device" in str(exc)
    (finding,) = s.findings
    assert finding.name == "device-mismatch" and "`input` on meta" in finding.message
    assert finding.location.module == "0"


def test_out_of_memory_is_explained_with_the_live_graphs(monkeypatch):
    from torchdoctor.watch import evidence

    monkeypatch.setattr(evidence, "oom_device", lambda exc: torch.device("cpu") if "CUDA" in str(exc) else None)
    model = mlp()
    kept = []

    def body():
        for x, y in batches(3):
            kept.append(nn.functional.cross_entropy(model(x), y))  # validation without no_grad, kept
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")  # as the next one would

    s, exc = _raises_through(model, None, body)
    assert isinstance(exc, torch.cuda.OutOfMemoryError)
    (finding,) = s.findings
    assert (
        finding.name == "out-of-memory" and "3 autograd graphs of watched forwards were still alive" in finding.message
    )


def test_a_nan_that_makes_the_loss_raise_is_diagnosed_with_the_state_of_the_weights():
    model = nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 1), nn.Sigmoid())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, _ = batches(1)[0]
    y = torch.rand(16, 1)

    def body():
        for step in range(3):
            opt.zero_grad()
            inputs = x / 0 * 0 if step == 2 else x  # a NaN batch
            nn.functional.binary_cross_entropy(model(inputs), y).backward()
            opt.step()

    s, exc = _raises_through(model, opt, body)
    assert "between 0 and 1" in str(exc)
    (finding,) = s.findings
    assert finding.name == "nan-in-loss-input" and finding.location.step == 2
    assert (
        "the input holds 16 NaN value(s) while the weights are finite: the NaN came from this batch" in finding.message
    )


def test_the_explanation_is_the_reports_first_finding():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batches(1)[0]

    def body():
        for _ in range(2):
            train_step(model, opt, x, y, zero=False)  # TD301, an error with a lower code than the crash's
        model(x.double())

    s, _ = _raises_through(model, opt, body)
    assert [f.name for f in s.report().sorted_findings()] == ["dtype-mismatch", "missing-zero-grad"]
