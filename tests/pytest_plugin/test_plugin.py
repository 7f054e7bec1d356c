"""The pytest plugin on real tiny training loops, run by an inner pytest in this process (pytester)."""

from __future__ import annotations

import textwrap

import pytest

import torchdoctor

pytest_plugins = ["pytester"]

LOOPS = """
import torch
from torch import nn

import torchdoctor


def make():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def train(model, opt, zero_grad=True, steps=3):
    for _ in range(steps):
        if zero_grad:
            opt.zero_grad()
        nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,))).backward()
        opt.step()


def validate(model):
    model.eval()
    return [nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,))) for _ in range(3)]
"""


@pytest.fixture(scope="module", autouse=True)
def _torch_warmed_up() -> None:
    """Run the loops under watch here first: pytester drops the modules an inner run imported when it ends, and
    torch's lazily imported modules must not be dropped (a re-import of torch internals crashes the process)."""
    namespace: dict = {}
    exec(LOOPS, namespace)
    model, opt = namespace["make"]()
    with torchdoctor.watch(model, opt, on_finding=lambda finding: None, report=False):
        namespace["train"](model, opt)
        namespace["validate"](model)


@pytest.fixture
def loops(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(loops=LOOPS)
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """An inner pytest run in this process, without the plugins these tests do not need."""
    return pytester.runpytest_inprocess(
        *args, "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:benchmark"
    )


def write_tests(pytester: pytest.Pytester, body: str) -> None:
    pytester.makepyfile(
        test_train="from loops import make, train, validate\nimport torchdoctor\n\n" + textwrap.dedent(body)
    )


USER_SESSIONS = """
def test_forgets_zero_grad():
    model, opt = make()
    with torchdoctor.watch(model, opt):
        train(model, opt, zero_grad=False)

def test_correct_loop():
    model, opt = make()
    with torchdoctor.watch(model, opt):
        train(model, opt)

def test_validation_keeps_graphs():
    model, opt = make()
    with torchdoctor.watch(model, opt):
        train(model, opt)
        kept = validate(model)
"""


def test_switch_fails_the_test_with_the_finding_and_passes_correct_code(loops: pytest.Pytester) -> None:
    write_tests(loops, USER_SESSIONS)
    result = run(loops, "--torchdoctor")
    result.assert_outcomes(failed=1, passed=2)  # the eval-without-no-grad warning is under the default, error
    out = result.stdout.str()
    assert "FAILED test_train.py::test_forgets_zero_grad" in out
    result.stdout.fnmatch_lines(
        [
            "*torchdoctor found 1 problem in this test's training loop:",
            "TD301 missing-zero-grad: *[[]param 2.bias, step 1[]]",  # the message and where
            "  fix: *",
            "    *optimizer.zero_grad(*",
        ]
    )


def test_without_the_switch_the_plugin_is_inert(loops: pytest.Pytester) -> None:
    write_tests(loops, USER_SESSIONS)
    run(loops, "-W", "ignore").assert_outcomes(passed=3)


def test_severity_from_the_switch_the_ini_and_tool_torchdoctor(loops: pytest.Pytester) -> None:
    write_tests(loops, USER_SESSIONS)
    result = run(loops, "--torchdoctor=warning")
    result.assert_outcomes(failed=2, passed=1)
    result.stdout.fnmatch_lines(["TD306 eval-without-no-grad: *"])
    loops.makeini("[pytest]\ntorchdoctor = warning\n")
    run(loops).assert_outcomes(failed=2, passed=1)
    run(loops, "--torchdoctor=off").assert_outcomes(passed=3)
    (loops.path / "tox.ini").unlink()
    loops.makepyprojecttoml('[tool.torchdoctor]\nfail-on = "warning"\nignore = ["missing-zero-grad"]\n')
    result = run(loops, "--torchdoctor")
    result.assert_outcomes(failed=1, passed=2)  # fail-on warning applies, and the ignored check is not run
    assert "FAILED test_train.py::test_validation_keeps_graphs" in result.stdout.str()


def test_a_bad_ini_value_is_a_usage_error(loops: pytest.Pytester) -> None:
    write_tests(loops, USER_SESSIONS)
    loops.makeini("[pytest]\ntorchdoctor = loud\n")
    result = run(loops)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini setting torchdoctor must be one of error, warning, info, off, not 'loud'"])


def test_fixture_called_or_as_context_manager_fails_without_the_switch(loops: pytest.Pytester) -> None:
    write_tests(
        loops,
        """
        SESSIONS = []

        def test_called(torchdoctor_watch):
            model, opt = make()
            SESSIONS.append(torchdoctor_watch(model, opt))
            train(model, opt, zero_grad=False)

        def test_context_manager(torchdoctor_watch):
            model, opt = make()
            with torchdoctor_watch(model, opt) as session:
                train(model, opt, zero_grad=False)
            assert not session.active

        def test_correct(torchdoctor_watch):
            model, opt = make()
            SESSIONS.append(torchdoctor_watch(model, opt, checks=["missing-zero-grad"]))
            train(model, opt)

        def test_sessions_ended_with_their_tests():
            assert len(SESSIONS) == 2 and not any(s.active for s in SESSIONS)
            assert SESSIONS[1].facts["checks"] == ["missing-zero-grad"]  # watch()'s keywords pass through
    """,
    )
    result = run(loops)
    result.assert_outcomes(failed=2, passed=2)
    failures = {report.head_line: str(report.longrepr) for report in result.reprec.getfailures()}
    assert sorted(failures) == ["test_called", "test_context_manager"]
    assert all(
        text.startswith("torchdoctor found 1 problem") and "\nTD301 missing-zero-grad: " in text
        for text in failures.values()
    )


def test_a_test_failing_on_its_own_shows_the_findings_as_a_section(loops: pytest.Pytester) -> None:
    write_tests(
        loops,
        """
        def test_fails(torchdoctor_watch):
            model, opt = make()
            torchdoctor_watch(model, opt)
            train(model, opt, zero_grad=False)
            assert False, "the test's own failure"
    """,
    )
    result = run(loops)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*the test's own failure*", "*Captured torchdoctor call*", "TD301 missing-zero-grad: *"]
    )


def test_loading_the_plugin_imports_no_torch(pytester: pytest.Pytester) -> None:
    """A real pytest process with the switch on, over a test that starts no session."""
    pytester.makeconftest(
        "import sys\n\ndef pytest_unconfigure(config):\n"
        "    open('torch_loaded.txt', 'w').write(str('torch' in sys.modules))\n"
    )
    pytester.makepyfile(test_plain="def test_plain():\n    assert 1 + 1 == 2\n")
    result = pytester.runpytest_subprocess("--torchdoctor", "-p", "no:cacheprovider", "-p", "no:hypothesispytest")
    result.assert_outcomes(passed=1)
    assert (pytester.path / "torch_loaded.txt").read_text() == "False"
