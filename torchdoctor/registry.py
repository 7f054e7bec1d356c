"""The registry of checks: metadata, registration, and discovery of built-in and plug-in checks.

Built-in checks live in `torchdoctor.checks.*` (the top-level `checks/` folder); third-party
packages add theirs through the entry-point group ``torchdoctor.checks``. A check module must not
import torch at import time: listing checks and `torchdoctor env` stay torch-free.
"""
from __future__ import annotations

import contextlib
import enum
import importlib
import pkgutil
import re
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator, Optional, TypeVar

from torchdoctor.findings import Finding, Severity

ENTRY_POINT_GROUP = "torchdoctor.checks"
BUILTIN_ORIGIN = "built-in"
_NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_CODE_RE = re.compile(r"^[A-Z]+[0-9]+$")


class Scope(str, enum.Enum):
    """Where a check looks; one front door per scope."""

    ENV = "env"
    CHECKPOINT = "checkpoint"
    RUNTIME = "runtime"
    DISTRIBUTED = "distributed"
    SOURCE = "source"

    def __str__(self) -> str:
        return self.value


class RegistryError(ValueError):
    """A check was registered with bad or conflicting metadata, or a selection names no check."""


@dataclass
class CheckInfo:
    """Metadata of one check plus its implementation for each scope it runs in.

    One pitfall (one public name) may be detected in several scopes, e.g. `missing-zero-grad` at run
    time and in source; each scope registers its own implementation under the same name and code.
    """

    code: str
    name: str
    severity: Severity
    summary: str
    impls: dict[Scope, Any] = field(default_factory=dict)
    origin: str = BUILTIN_ORIGIN
    docs: Optional[str] = None  # inline docs for plug-ins; built-ins use docs/checks/<name>.md

    @property
    def scopes(self) -> list[Scope]:
        return sorted(self.impls, key=lambda s: list(Scope).index(s))

    def impl(self, scope: Scope) -> Any:
        return self.impls[scope]

    def complete(self, finding: Finding) -> Finding:
        """Fill in code, name and (unless the check chose one) the default severity."""
        return replace(
            finding,
            code=self.code,
            name=self.name,
            severity=finding.severity if finding.severity is not None else self.severity,
        )

    def docs_page(self) -> str:
        """The check's docs page as Markdown (why it matters, how to fix, bad/good example)."""
        if self.docs is not None:
            return self.docs
        from importlib import resources

        page = resources.files("torchdoctor.docs").joinpath("checks", f"{self.name}.md")
        try:
            return page.read_text(encoding="utf-8")
        except FileNotFoundError:
            return f"# {self.name} ({self.code})\n\n{self.summary}\n\n(No docs page was shipped for this check.)\n"


_CHECKS: dict[str, CheckInfo] = {}
_BY_CODE: dict[str, str] = {}
_loaded = False
_origin_stack: list[str] = []
_load_errors: list[str] = []

T = TypeVar("T")


def register(
    impl: Any,
    *,
    code: str,
    name: str,
    scope: "Scope | str",
    severity: "Severity | str",
    summary: str,
    docs: Optional[str] = None,
) -> CheckInfo:
    """Register `impl` as the `scope` implementation of the check `name`/`code`."""
    scope = Scope(scope)
    severity = Severity.parse(severity)
    if not _NAME_RE.match(name):
        raise RegistryError(f"check name {name!r} must be kebab-case")
    if not _CODE_RE.match(code):
        raise RegistryError(f"check code {code!r} must look like TD101")
    origin = _origin_stack[-1] if _origin_stack else BUILTIN_ORIGIN
    info = _CHECKS.get(name)
    if info is None:
        if code in _BY_CODE:
            raise RegistryError(f"code {code} of {name!r} is already used by {_BY_CODE[code]!r}")
        info = CheckInfo(code=code, name=name, severity=severity, summary=summary, origin=origin, docs=docs)
        _CHECKS[name] = info
        _BY_CODE[code] = name
    elif info.code != code:
        raise RegistryError(f"check {name!r} is registered as {info.code}, not {code}")
    elif scope in info.impls and info.impls[scope] is not impl:
        raise RegistryError(f"check {name!r} already has a {scope} implementation")
    info.impls[scope] = impl
    return info


def check(
    *,
    code: str,
    name: str,
    scope: "Scope | str",
    severity: "Severity | str",
    summary: str,
    docs: Optional[str] = None,
) -> Callable[[T], T]:
    """Decorator form of `register`; returns the function or class unchanged.

    Environment and checkpoint checks are functions ``facts -> Iterable[Finding]``; runtime checks
    are classes (see `torchdoctor.watch`).
    """

    def decorate(impl: T) -> T:
        register(impl, code=code, name=name, scope=scope, severity=severity, summary=summary, docs=docs)
        return impl

    return decorate


@contextlib.contextmanager
def _origin(name: str) -> Iterator[None]:
    _origin_stack.append(name)
    try:
        yield
    finally:
        _origin_stack.pop()


def _load_builtins() -> None:
    import torchdoctor.checks as package

    for mod in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{mod.name}")


def _load_plugins() -> None:
    from importlib import metadata

    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        origin = dist.name if dist is not None else ep.value.split(":")[0]
        try:
            with _origin(origin):
                obj = ep.load()
                if callable(obj) and not isinstance(obj, type):
                    obj()  # a plug-in may expose a `register()` function instead of decorated modules
        except Exception as exc:  # a broken plug-in must not take the doctor down
            _load_errors.append(f"plug-in {ep.name!r} ({origin}) failed to load: {type(exc).__name__}: {exc}")


def load() -> None:
    """Import built-in checks and plug-ins once."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    _load_builtins()
    _load_plugins()


def load_errors() -> list[str]:
    """Plug-ins that failed to load, as one-line messages."""
    load()
    return list(_load_errors)


def all_checks(scope: "Scope | str | None" = None) -> list[CheckInfo]:
    """Every registered check (of `scope`, if given), ordered by code."""
    load()
    checks = sorted(_CHECKS.values(), key=lambda c: c.code)
    if scope is None:
        return checks
    scope = Scope(scope)
    return [c for c in checks if scope in c.impls]


def get(name_or_code: str) -> CheckInfo:
    """Look a check up by public name or code (case-insensitive code)."""
    load()
    key = name_or_code.strip()
    if key in _CHECKS:
        return _CHECKS[key]
    code = key.upper()
    if code in _BY_CODE:
        return _CHECKS[_BY_CODE[code]]
    raise RegistryError(f"unknown check {name_or_code!r} (see `torchdoctor checks`)")


def run_fact_checks(checks: Iterable[CheckInfo], scope: "Scope | str", facts: Any) -> list[Finding]:
    """Run pure `facts -> findings` checks; a check that raises becomes one `internal-error` finding."""
    scope = Scope(scope)
    findings: list[Finding] = []
    for info in checks:
        try:
            findings.extend(info.complete(f) for f in info.impl(scope)(facts))
        except Exception as exc:
            findings.append(internal_error(info, exc))
    return findings


def internal_error(info: CheckInfo, exc: BaseException) -> Finding:
    """The finding that stands for a check which crashed (the check is then skipped, never fatal)."""
    where = ""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None:
        where = f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
    return Finding(
        code=info.code,
        name=info.name,
        severity=Severity.INFO,
        message=f"torchdoctor's check {info.name} failed internally and was skipped: "
        f"{type(exc).__name__}: {exc}{where}",
        fix="This is a torchdoctor bug, not a problem with your setup; please report it.",
    )


def _reset_for_tests() -> None:
    """Forget everything (tests of discovery use this, then `load()` again)."""
    global _loaded
    _CHECKS.clear()
    _BY_CODE.clear()
    _load_errors.clear()
    _loaded = False
    for name in [m for m in sys.modules if m.startswith("torchdoctor.checks.")]:
        del sys.modules[name]
