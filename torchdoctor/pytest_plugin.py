"""The pytest plugin (entry point `pytest11`): training loops under watch fail the test that runs them.

- ``pytest --torchdoctor[=SEVERITY]`` (or ``torchdoctor = SEVERITY`` in pytest's ini settings) follows every
  `torchdoctor.watch` session a test starts, and fails the test with each finding at or above SEVERITY
  (error, warning or info; given without one, the `fail-on` of `[tool.torchdoctor]`/TORCHDOCTOR_FAIL_ON,
  default error). ``--torchdoctor=off`` turns an ini setting off for one run.
- The fixture ``torchdoctor_watch(model, optimizer, **watch_kwargs)`` starts a session that ends with the test
  (or use it as ``with torchdoctor_watch(model, opt):``); its findings fail the test the same way, switch or not.

`[tool.torchdoctor]` select/ignore apply, since the sessions read them. Inert unless used: loading the plugin
imports neither torch nor the watch session, and a test that starts no session is not touched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Generator

import pytest

from torchdoctor.settings import FAIL_ON

if TYPE_CHECKING:
    from torchdoctor.findings import Finding
    from torchdoctor.watch.session import WatchSession

OFF = "off"
_CHOICES = (*FAIL_ON[:3], OFF)  # error, warning, info; "never" is spelled "off" here
_DEFAULT = True  # --torchdoctor without a value: the session's own fail-on (not a string, so not a choice)
_SESSIONS = pytest.StashKey[list[tuple["WatchSession", bool]]]()  # a test's sessions; True: the fixture's
_UNSUBSCRIBE = pytest.StashKey[Callable[[], None]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("torchdoctor", "torchdoctor: fail tests whose training loops make a known PyTorch mistake")
    group.addoption(
        "--torchdoctor",
        nargs="?",
        const=_DEFAULT,
        default=None,
        choices=_CHOICES,
        metavar="SEVERITY",
        help="fail a test when a torchdoctor.watch session it starts finds a problem at or above "
        "SEVERITY (error, warning, info; default: [tool.torchdoctor] fail-on, else error); "
        "write --torchdoctor=SEVERITY, or put --torchdoctor after the test paths; 'off' disables",
    )
    parser.addini("torchdoctor", "like --torchdoctor=SEVERITY for every run (error, warning, info, off)", default="")


def _severity(config: pytest.Config) -> "str | bool | None":
    """The switch's value: a severity, `_DEFAULT`, or None when off (the command line beats the ini setting)."""
    value = config.getoption("torchdoctor")
    if value is None:
        value = str(config.getini("torchdoctor")).strip() or None
        if value is not None and value not in _CHOICES:
            raise pytest.UsageError(f"ini setting torchdoctor must be one of {', '.join(_CHOICES)}, not {value!r}")
    return None if value == OFF else value


def pytest_configure(config: pytest.Config) -> None:
    _severity(config)  # a bad ini value is a usage error before any test runs


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    """Under the switch, follow the sessions started from here (fixtures included) to the end of the call."""
    sessions = item.stash.setdefault(_SESSIONS, [])
    if _severity(item.config) is not None:
        from torchdoctor.watch import observers

        item.stash[_UNSUBSCRIBE] = observers.observe(lambda session: sessions.append((session, False)))
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """After the test body: end the fixture's sessions, and fail a passing test with what its sessions found."""
    try:
        result = yield
    except BaseException:
        _end(item)
        text = _problems_text(item)
        if text:  # the test failed on its own; say what torchdoctor saw as well
            item.add_report_section("call", "torchdoctor", text)
        raise
    _end(item)
    text = _problems_text(item)
    if text:
        pytest.fail(text, pytrace=False)
    return result


def pytest_runtest_teardown(item: pytest.Item) -> None:
    _end(item)  # the setup failed before the call: still remove every hook


def _end(item: pytest.Item) -> None:
    """Stop following new sessions, and stop the fixture's (a user's own session is the user's to stop)."""
    unsubscribe = item.stash.get(_UNSUBSCRIBE, None)
    if unsubscribe is not None:
        unsubscribe()
        del item.stash[_UNSUBSCRIBE]
    for session, owned in item.stash.get(_SESSIONS, []):
        if owned:
            session.stop()


def _problems_text(item: pytest.Item) -> str:
    """Every finding of the test's sessions at or above its threshold, as watch's warnings say them."""
    if not item.stash.get(_SESSIONS, []):  # no session, no torch: the plugin stays inert
        return ""
    from torchdoctor.findings import Severity
    from torchdoctor.watch.session import _describe

    switch = _severity(item.config)
    found: list[Finding] = []
    seen: set[int] = set()
    for session, _ in item.stash.get(_SESSIONS, []):
        if id(session) in seen:  # the fixture's session is also followed under the switch
            continue
        seen.add(id(session))
        threshold = switch if isinstance(switch, str) else session.fail_on
        if threshold == "never":
            continue
        found += [f for f in session.findings if (f.severity or Severity.INFO) >= Severity.parse(threshold)]
    if not found:
        return ""
    head = f"torchdoctor found {len(found)} problem{'s' if len(found) > 1 else ''} in this test's training loop:"
    return "\n".join([head, *(_describe(f) for f in found)])


@pytest.fixture
def torchdoctor_watch(request: pytest.FixtureRequest) -> Callable[..., "WatchSession"]:
    """``torchdoctor_watch(model, optimizer, **kwargs)``: a started `torchdoctor.watch` session that ends with the
    test, whose findings at or above the threshold fail it; also ``with torchdoctor_watch(model, opt): ...``.

    The keyword arguments are watch()'s; by default findings go to the ``torchdoctor`` logger (shown with a
    failure) and no report is printed, since the failure says it all.
    """
    sessions = request.node.stash.setdefault(_SESSIONS, [])

    def start(model: Any, optimizer: Any = None, **kwargs: Any) -> "WatchSession":
        from torchdoctor.watch.session import watch

        kwargs.setdefault("on_finding", "log")
        kwargs.setdefault("report", False)
        session = watch(model, optimizer, **kwargs)
        sessions.append((session, True))
        return session.start()

    return start
