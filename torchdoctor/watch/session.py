"""`watch()`: the session that runs the runtime checks around a training loop and reports on exit."""

from __future__ import annotations

import functools
import logging
import warnings
import weakref
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar, Union

import torch
from torch import nn

from torchdoctor import registry, selection
from torchdoctor.errors import TorchDoctorError, TorchDoctorWarning
from torchdoctor.findings import Finding, Location, Severity
from torchdoctor.notebook import cell_run
from torchdoctor.settings import load_settings
from torchdoctor.watch.context import WatchContext, WatchedModel, WatchedOptimizer
from torchdoctor.watch.contract import Event, RuntimeCheck
from torchdoctor.watch.coverage import not_run
from torchdoctor.watch.crash import explain_crash
from torchdoctor.watch.events import EventHub
from torchdoctor.watch.follow import Follower
from torchdoctor.watch.graphs import GraphTracker
from torchdoctor.watch.observers import session_started
from torchdoctor.watch.userframe import user_frame
from torchdoctor.wrappers import unwrap, unwrap_optimizer

if TYPE_CHECKING:
    from torchdoctor.report import Report

logger = logging.getLogger("torchdoctor")

OnFinding = Union[str, Callable[[Finding], Any]]
F = TypeVar("F", bound=Callable[..., Any])
_MODES = ("warn", "raise", "log")
_LOG_LEVEL = {Severity.INFO: logging.INFO, Severity.WARNING: logging.WARNING, Severity.ERROR: logging.ERROR}


def _as_list(value: Any, kind: type, what: str, allow_none: bool = False) -> list[Any]:
    """One object or a list of them, type-checked with a one-line error."""
    if value is None:
        if allow_none:
            return []
        raise TypeError(f"watch() needs a {what}")
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    for item in items:
        if isinstance(item, nn.DataParallel) and what == "optimizer":
            raise TypeError("watch(): the optimizer is wrapped in nn.DataParallel; wrap the model, not the optimizer")
        if what == "optimizer":  # accelerate's, Lightning's, DeepSpeed-style wrappers: the torch optimizer inside
            item = unwrap_optimizer(item)[0]
        if not isinstance(item, kind):  # the wrapper is kept: the session watches what is inside at start()
            raise TypeError(f"watch(): {what} must be a {kind.__name__} (or a list of them), got {type(item).__name__}")
    return items


def _labels(names: list[str]) -> list[str]:
    """Type names, numbered where two objects share one (GAN: ``Adam#1``, ``Adam#2``)."""
    return [f"{n}#{names[:i].count(n) + 1}" if names.count(n) > 1 else n for i, n in enumerate(names)]


class WatchSession:
    """Runs the enabled runtime checks while active: a context manager, a decorator, or start()/stop()."""

    def __init__(
        self,
        model: Any,
        optimizer: Any = None,
        *,
        loader: Any = None,
        checks: Any = None,
        ignore: Any = None,
        every: int = 10,
        on_finding: OnFinding = "warn",
        deterministic: bool = False,
        report: bool = True,
    ) -> None:
        from torch.utils.data import DataLoader

        self._targets: Union[tuple[list[Any], ...], tuple[list[weakref.ref], ...]] = (
            _as_list(model, nn.Module, "model"),
            _as_list(optimizer, torch.optim.Optimizer, "optimizer", allow_none=True),
            _as_list(loader, DataLoader, "loader", allow_none=True),
        )
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"watch(): every must be a positive number of steps, got {every!r}")
        if not callable(on_finding) and on_finding not in _MODES:
            raise ValueError(
                f"watch(): on_finding must be one of {', '.join(_MODES)} or a callable, got {on_finding!r}"
            )
        settings = load_settings(select=checks, ignore=ignore)  # one name or several, names or codes
        infos = selection.select_checks(selection.WATCH, settings)  # a bad name or setting: ValueError, before any hook
        self._infos = [i for i in infos if registry.Scope.RUNTIME in i.scopes]
        self._ddp_infos = [i for i in infos if registry.Scope.RUNTIME not in i.scopes]  # run under torch.distributed
        self.fail_on = settings.fail_on
        self.every = every
        self.on_finding = on_finding
        self.deterministic = deterministic
        self.print_report = report
        self._found: dict[tuple, Finding] = {}
        self._said_in: dict[tuple, Optional[int]] = {}  # the notebook cell run each finding was last said in
        self._info_of: dict[int, registry.Pitfall] = {}
        self._ctx: Optional[WatchContext] = None
        self._hub: Optional[EventHub] = None
        self._quiet_raise = False
        self.facts: dict[str, Any] = {}
        self._enabled: list[str] = []
        self._checks: dict[str, RuntimeCheck] = {}
        self.hook_errors: list[str] = []  # the hooks that could not be installed, and the checks that are off
        self.rank_findings: Optional[list[Finding]] = None  # under torch.distributed, on rank 0: every rank's
        self.discover_models = False  # `torchdoctor run`: adopt every optimizer, and find its models
        self._follower: Optional[Follower] = None
        self.crash_explained_by: list[str] = []  # the pitfalls whose findings explain the exception that ended it

    # -- public API --------------------------------------------------------------------------------

    @property
    def findings(self) -> list[Finding]:
        """What the session found so far; repeats are folded into one finding with a count."""
        return list(self._found.values())

    @property
    def active(self) -> bool:
        return self._hub is not None

    def start(self) -> "WatchSession":
        """Install the hooks the enabled checks need (a no-op when already started)."""
        if self._hub is not None:
            return self
        models, optimizers, loaders = self._take_targets()
        model_labels = _labels([type(unwrap(m)[0]).__name__ for m in models])
        optimizer_labels = _labels([type(unwrap_optimizer(o)[0]).__name__ for o in optimizers])
        ctx = WatchContext(
            models=[WatchedModel(m, label) for m, label in zip(models, model_labels)],
            optimizers=[WatchedOptimizer(o, label) for o, label in zip(optimizers, optimizer_labels)],
            loaders=loaders,
            every=self.every,
            deterministic=self.deterministic,
            graphs=GraphTracker(),
            emit=self._sink,
            fault=self._fault,
        )
        infos = list(self._infos)
        self._info_of = {}
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            ctx.rank, ctx.world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
            infos += [
                i
                for i in self._ddp_infos
                if isinstance(i.impl(registry.Scope.DISTRIBUTED), type)
                and issubclass(i.impl(registry.Scope.DISTRIBUTED), RuntimeCheck)
            ]
        self._ctx = ctx
        checks: list[RuntimeCheck] = []
        for info in infos:
            impl = info.detectors.get(registry.Scope.RUNTIME) or info.detectors[registry.Scope.DISTRIBUTED]
            chk = self._build(info, impl, ctx)
            if chk is not None:
                checks.append(chk)
        self._enabled = sorted(self._info_of[id(c)].name for c in checks)
        self._checks = {self._info_of[id(c)].name: c for c in checks}
        if any(type(c).uses_clock for c in checks):
            from torchdoctor.watch.timing import StepClock

            ctx.clock = StepClock(ctx.optimizers[0] if ctx.optimizers else None)
        self._hub = EventHub(ctx, checks, self._sink, self._fault)
        self.hook_errors = []
        for what, error, off in self._hub.install():  # never break training: watch the rest and say what is off
            names = sorted(self._info_of[id(c)].name for c in off)
            self.hook_errors.append(
                f"could not watch {what} ({type(error).__name__}: {error}); "
                f"checks that go without it: {', '.join(names) or 'none'}"
            )
            _warn_at_user_line(TorchDoctorWarning(f"torchdoctor.watch {self.hook_errors[-1]}"))
        try:  # optimizers built (or rebuilt) later are adopted as they step: torchdoctor.watch.follow
            self._follower = ctx.hooks.add(Follower(self, discover=self.discover_models).install())
        except Exception as exc:
            self.hook_errors.append(f"could not follow new optimizers ({type(exc).__name__}: {exc})")
        self._hub.dispatch(Event.START)
        session_started(self)  # e.g. the pytest plugin, which follows a test's sessions
        return self

    def enable_distributed(self) -> bool:
        """Add the cross-rank checks to a running session once torch.distributed is up (`torchdoctor run`
        starts before the script's ``init_process_group``). Called where every rank of the same program
        gets to at the same step (the adoption of its first DDP model), so that their exchanges pair up;
        each exchange has a timeout, so ranks that disagree stop comparing instead of hanging. Returns
        whether checks were added."""
        ctx, hub = self._ctx, self._hub
        if ctx is None or hub is None or ctx.world_size > 1:
            return False
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return False
        ctx.rank, ctx.world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        if ctx.world_size < 2:
            return False
        checks: list[RuntimeCheck] = []
        for info in self._ddp_infos:
            impl = info.detectors.get(registry.Scope.DISTRIBUTED)
            if not (isinstance(impl, type) and issubclass(impl, RuntimeCheck)) or info.name in self._checks:
                continue
            chk = self._build(info, impl, ctx)
            if chk is not None:
                self._checks[info.name] = chk
                checks.append(chk)
        self._enabled = sorted(self._checks)
        hub.add_checks(checks)
        return bool(checks)

    def stop(self, exc: Optional[BaseException] = None) -> None:
        """Run the end-of-session checks, remove every hook, and print the report."""
        hub, ctx = self._hub, self._ctx
        if hub is None or ctx is None:
            return
        self._quiet_raise = exc is not None  # the user's exception must propagate unchanged
        ctx.exception = exc
        try:
            if exc is not None and not isinstance(exc, TorchDoctorError):
                self.crash_explained_by = explain_crash(self, hub, exc)
                ctx.crash_explained_by = tuple(self.crash_explained_by)
            hub.dispatch(Event.STOP)
        finally:
            self._hub = None
            ctx.hooks.remove_all()
            ctx.graphs.stop()
            self.facts = self._facts(ctx)
            try:
                unseen = not_run(ctx, self._checks, hub.seen, hub.under_functorch, {f.name for f in self.findings})
            except Exception as error:  # the report goes on without it
                logger.warning("torchdoctor: could not tell which checks ran: %s: %s", type(error).__name__, error)
                unseen = []
            if unseen:
                self.facts["not_run"] = unseen
            self._checks = {}
            if ctx.world_size > 1 and self.discover_models:  # `torchdoctor run` folds the ranks' reports itself
                from torchdoctor.watch.distributed import close_exchange

                close_exchange(ctx)
            elif ctx.world_size > 1:  # every rank's findings go to rank 0's report (torchdoctor.watch.distributed)
                from torchdoctor.watch.distributed import gather_report

                self.rank_findings, self.facts["ranks"] = gather_report(ctx, self.findings, failed=exc is not None)
            ctx.release()
            self._targets = tuple([weakref.ref(t) for t in group] for group in self._targets)
            self._quiet_raise = False
            if self.print_report and ctx.rank == 0:
                self._print_report()

    def _take_targets(self) -> tuple[list[Any], list[Any], list[Any]]:
        """The models, optimizers and loaders to watch: held while the session runs, and only weakly once
        it stopped (a finished session keeps nothing alive; started again, it watches what is still alive)."""
        groups = tuple([t() if isinstance(t, weakref.ref) else t for t in group] for group in self._targets)
        if any(t is None for group in groups for t in group):
            raise RuntimeError("watch(): a model, optimizer or loader of this session was freed since it stopped")
        self._targets = groups
        return groups[0], groups[1], groups[2]

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        """A session as a notebook cell's result: its report so far."""
        return self.report()._repr_mimebundle_(include, exclude)

    def report(self) -> "Report":
        """The session's findings and facts (after the session ended) as a `torchdoctor.report.Report`."""
        from torchdoctor.report import Report

        subject = ", ".join(m.get("label", "") for m in self.facts.get("models", []))
        findings = self.findings if self.rank_findings is None else self.rank_findings
        return Report(scope="runtime", findings=findings, facts=self.facts, subject=subject, fail_on=self.fail_on)

    def __enter__(self) -> "WatchSession":
        return self.start()

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        self.stop(exc)

    def __call__(self, fn: F) -> F:
        """Use the session as a decorator: every call of `fn` runs inside it."""

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    # -- internals ---------------------------------------------------------------------------------

    def _sink(self, chk: RuntimeCheck, finding: Finding) -> None:
        info = self._info_of.get(id(chk))
        if info is None:
            return
        finding = info.complete(finding)
        if self._ctx is not None and (finding.location is None or finding.location.step is None):
            finding = replace(finding, location=replace(finding.location or Location(), step=self._ctx.step))
        self._record(finding)

    def _build(self, info: registry.Pitfall, impl: Any, ctx: WatchContext) -> Optional[RuntimeCheck]:
        """`info`'s check for this session; None (an internal-error finding recorded) when building it failed."""
        try:
            chk: RuntimeCheck = impl(ctx)
        except Exception as exc:
            self._record(registry.internal_error(info, exc))
            return None
        self._info_of[id(chk)] = info
        return chk

    def _record(self, finding: Finding) -> None:
        key = finding.fold_key()
        cell = cell_run()  # in IPython/Jupyter: a problem is said once per cell run, not once per session
        if key in self._found:
            self._found[key].count += finding.count
            if cell is None or self._said_in.get(key) == cell:
                return
        else:
            self._found[key] = finding
        self._said_in[key] = cell
        self._notify(finding)

    def _fault(self, chk: RuntimeCheck, exc: BaseException) -> None:
        info = self._info_of.get(id(chk))
        if info is not None:
            self._record(registry.internal_error(info, exc))

    def _notify(self, finding: Finding) -> None:
        severity = finding.severity or Severity.INFO
        mode = self.on_finding
        if callable(mode):
            mode(finding)
        elif mode == "log":
            logger.log(_LOG_LEVEL[severity], _describe(finding))
        elif mode == "raise" and severity >= Severity.ERROR and not self._quiet_raise:
            raise TorchDoctorError(_describe(finding), finding)
        elif severity >= Severity.WARNING:
            loc = finding.location
            at = (loc.file, loc.line) if loc is not None and loc.file and loc.line else None
            try:
                _warn_at_user_line(TorchDoctorWarning(_describe(finding)), at)
            except TorchDoctorWarning:  # the user's filters made this warning an error (`-W error`): theirs to have
                raise
            except Exception as exc:  # never break the user's training over a warning
                logger.warning("torchdoctor could not warn: %s: %s\n%s", type(exc).__name__, exc, _describe(finding))

    def _facts(self, ctx: WatchContext) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "models": [
                {
                    "label": wm.label,
                    "wrappers": wm.wrappers,
                    "parameters": sum(p.numel() for p in wm.inner.parameters()),
                    **({"forward_seen_through": wm.entry} if wm.entry else {}),
                }
                for wm in ctx.models
            ],
            "optimizers": [
                {"label": wo.label, "steps": wo.steps, **({"wrappers": wo.wrappers} if wo.wrappers else {})}
                for wo in ctx.optimizers
            ],
            "checks": self._enabled,
        }
        if self._follower is not None:
            facts.update(self._follower.facts())
        if self.crash_explained_by:
            facts["crash_explained_by"] = list(self.crash_explained_by)
        breakdown = ctx.clock.summary() if ctx.clock is not None else None
        if breakdown is not None:
            facts["step_time"] = breakdown
        if self.hook_errors:
            facts["hooks_failed"] = list(self.hook_errors)
        return facts

    def _print_report(self) -> None:
        from torchdoctor.report import make_console, render_console
        from torchdoctor.watch.view import facts_view

        try:
            render_console(self.report(), make_console(stderr=True), fail_on="never", facts_view=facts_view)
        except Exception as exc:  # printing must not break the user's program
            logger.warning("torchdoctor could not print its report: %s: %s", type(exc).__name__, exc)


def _describe(finding: Finding) -> str:
    """A finding as a warning, log record or error says it: the problem and where, the fix (its title and its
    code, to paste as is), and how to silence this one check."""
    lines = [f"{finding.code} {finding.name}: {finding.message}"]
    if finding.location is not None and str(finding.location):
        lines[0] += f" [{finding.location}]"
    if finding.fix is not None:
        lines.append(f"  fix:{' ' if finding.fix.title else ''}{finding.fix.title}")
        lines += [f"    {line}" if line else "" for line in finding.fix.code.splitlines()]
    try:
        lines.append("  " + registry.get(finding.name).silence_advice(registry.Scope.RUNTIME))
    except registry.RegistryError:  # a finding of no registered pitfall (a test's, or a removed plug-in's)
        pass
    return "\n".join(lines)


def _warn_at_user_line(warning: TorchDoctorWarning, at: Optional[tuple[str, int]] = None) -> None:
    """Warn as if from the user's line that led here (the call of step(), of the model, of zero_grad(), the
    loop over the loader): the innermost frame outside torchdoctor, torch, the training frameworks and the
    installed libraries (else the outermost one), or the line `at` that the finding names (the call of
    ``scheduler.step()``). Warning filters and the once-per-line registry apply to that line, as for
    `warnings.warn`."""
    frame = user_frame(1)
    module_globals = frame.f_globals
    file, line = at or (frame.f_code.co_filename, frame.f_lineno)
    # a notebook's cells share one module: its once-per-line registry would hide a later cell's warning
    registry = module_globals.setdefault("__warningregistry__", {}) if cell_run() is None else {}
    # module_globals lets linecache read a zip-imported or notebook source (see _loader_globals)
    same_file = at is None or at[0] == frame.f_code.co_filename
    warnings.warn_explicit(
        warning,
        TorchDoctorWarning,
        file,
        line,
        module=module_globals.get("__name__", "<string>"),
        registry=registry,
        module_globals=_loader_globals(module_globals) if same_file else None,
    )


def _loader_globals(module_globals: dict[str, Any]) -> Optional[dict[str, Any]]:
    """What `warnings.warn_explicit` may be given as module_globals: the module's spec, its loader, and the name
    that loader serves; None when the spec has no loader. Python 3.12 raises ValueError for globals without
    any loader (a script run by runpy.run_path) and warns DeprecationWarning, an error under `-W error`, without
    `__spec__.loader` (`python train.py`'s `__main__`) or when `__loader__` is another; and every Python asks
    the loader for the source of `__name__`, which fails for a module run as `__main__` (`run -m pkg.train`)."""
    spec = module_globals.get("__spec__")
    loader = getattr(spec, "loader", None)
    if spec is None or loader is None or module_globals.get("__loader__") not in (None, loader):
        return None
    return {"__name__": spec.name, "__spec__": spec, "__loader__": loader}


def watch(
    model: Any,
    optimizer: Any = None,
    *,
    loader: Any = None,
    checks: Any = None,
    ignore: Any = None,
    every: int = 10,
    on_finding: OnFinding = "warn",
    deterministic: bool = False,
    report: bool = True,
) -> WatchSession:
    """Watch a training loop for the runtime pitfalls: ``with torchdoctor.watch(model, optimizer): ...``.

    `model`/`optimizer`/`loader` may each be one object or a list; wrappers (DataParallel, DDP,
    torch.compile; accelerate's, Lightning's and DeepSpeed-style optimizer wrappers) are seen through, and a
    finished session holds them only weakly. `checks`/`ignore` select checks by name or code, over the
    `[tool.torchdoctor]` table found from the working directory and the TORCHDOCTOR_* variables (see
    `torchdoctor.settings`; their fail-on sets `report().exit_code()`); an unknown name, or a check that
    only another front door runs, raises `ValueError`. Expensive checks run every `every` steps.
    `on_finding`: "warn" (a `TorchDoctorWarning` per new warning/error, said at the user's line that led
    to it, e.g. the call of ``optimizer.step()``),
    "raise" (a `TorchDoctorError` at the first error), "log" (the ``torchdoctor`` logger, every finding)
    or a callable given every new finding. `deterministic=True` says the run must be reproducible.
    `report=False` skips the report printed (to stderr) when the session ends.
    """
    return WatchSession(
        model,
        optimizer,
        loader=loader,
        checks=checks,
        ignore=ignore,
        every=every,
        on_finding=on_finding,
        deterministic=deterministic,
        report=report,
    )
