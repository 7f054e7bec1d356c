"""The registry of pitfalls: discovery of built-in and plug-in `Pitfall` definitions, lookup, selection.

Built-in pitfalls live in `torchdoctor.checks.*` (the top-level `checks/` folder): the registry imports
each module and collects the `Pitfall` objects it defines. Third-party packages add theirs through the
entry-point group ``torchdoctor.checks``; an entry point names a module (its pitfalls are collected), a
`Pitfall`, or a list of them. A checks module must not import torch at import time: listing checks and
`torchdoctor env` stay torch-free.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from types import ModuleType
from typing import Any, Iterable, NamedTuple, Optional

from torchdoctor.findings import INTERNAL_ERROR, Finding, Fix, Severity
from torchdoctor.pitfall import Pitfall, Scope
from torchdoctor.plugins import GROUP as ENTRY_POINT_GROUP

__all__ = [
    "Pitfall",
    "Scope",
    "RegistryError",
    "Indexed",
    "all_checks",
    "get",
    "index",
    "load",
    "load_errors",
    "load_names",
    "unindexed",
    "run_fact_checks",
    "internal_error",
    "BUILTIN_ORIGIN",
    "ENTRY_POINT_GROUP",
]

BUILTIN_ORIGIN = "built-in"


class RegistryError(ValueError):
    """Two pitfalls collide (name or code), or a selection names no pitfall."""


_CHECKS: dict[str, Pitfall] = {}
_BY_CODE: dict[str, str] = {}
_loaded = False
_loaded_scopes: set[Scope] = set()
_plugins_loaded = False
_load_errors: list[str] = []


def add(pitfall: Pitfall, origin: str = BUILTIN_ORIGIN) -> Pitfall:
    """Register one pitfall under its name and code; both must be new."""
    known = _CHECKS.get(pitfall.name)
    if known is pitfall:
        return pitfall
    if known is not None:
        raise RegistryError(f"pitfall name {pitfall.name!r} ({pitfall.code}) is already defined as {known.code}")
    if pitfall.code in _BY_CODE:
        raise RegistryError(f"code {pitfall.code} of {pitfall.name!r} is already used by {_BY_CODE[pitfall.code]!r}")
    if origin != BUILTIN_ORIGIN:  # built-ins of other scopes may not be loaded yet: their names and codes are indexed
        builtin = index()
        if pitfall.name in builtin:
            raise RegistryError(
                f"pitfall name {pitfall.name!r} ({pitfall.code}) is already defined as {builtin[pitfall.name].code}"
            )
        taken = {entry.code: name for name, entry in builtin.items()}
        if pitfall.code in taken:
            raise RegistryError(f"code {pitfall.code} of {pitfall.name!r} is already used by {taken[pitfall.code]!r}")
    if not pitfall.detectors:
        raise RegistryError(f"pitfall {pitfall.name!r} has no detector in any front door")
    pitfall.origin = origin
    _CHECKS[pitfall.name] = pitfall
    _BY_CODE[pitfall.code] = pitfall.name
    return pitfall


def _collect(obj: Any, origin: str) -> None:
    """Register the pitfalls `obj` holds: a module's, a list's, or `obj` itself."""
    if isinstance(obj, Pitfall):
        add(obj, origin)
    elif isinstance(obj, ModuleType):
        for value in vars(obj).values():
            if isinstance(value, Pitfall):
                add(value, origin)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _collect(item, origin)
    else:
        raise RegistryError(f"expected a module, a Pitfall or a list of Pitfalls, got {obj!r}")


class Indexed(NamedTuple):
    """A built-in pitfall as the generated index knows it, before (or without) importing its module."""

    code: str
    module: str
    scopes: tuple[str, ...]


def index() -> dict[str, Indexed]:
    """Every built-in pitfall's code, module and scopes by name, from the generated `checks/_scopes.py`."""
    from torchdoctor.checks._scopes import CHECKS

    return {name: Indexed(*row) for name, row in CHECKS.items()}


def unindexed() -> list[Pitfall]:
    """The registered pitfalls the generated index does not list: the plug-ins' (loaded by this call, which
    imports no built-in check module) and any added at run time with `add`."""
    _ensure_plugins()
    builtin = index()
    return [p for p in _CHECKS.values() if p.name not in builtin]


def load_names(names: Iterable[str]) -> list[Pitfall]:
    """The registered pitfalls called `names`, importing only the built-in modules that define them."""
    builtin = index()
    for module in sorted({builtin[n].module for n in names if n in builtin and n not in _CHECKS}):
        _collect(importlib.import_module(f"torchdoctor.checks.{module}"), BUILTIN_ORIGIN)
    _ensure_plugins()
    return [_CHECKS[n] for n in names if n in _CHECKS]


def _builtin_modules() -> list[str]:
    import torchdoctor.checks as package

    return sorted(m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_"))


def _load_builtins(scope: Optional[Scope] = None) -> None:
    """Import the built-in check modules (only those with a detector in `scope`, by the generated index)."""
    from torchdoctor.checks._scopes import SCOPES as index  # generated: one small dict

    for name in _builtin_modules():
        if scope is None or str(scope) in index.get(name, (str(scope),)):  # a module missing from the index loads
            _collect(importlib.import_module(f"torchdoctor.checks.{name}"), BUILTIN_ORIGIN)


def _ensure_plugins() -> None:
    global _plugins_loaded
    if not _plugins_loaded:
        _plugins_loaded = True
        _load_plugins()


def _load_plugins() -> None:
    from torchdoctor.plugins import plugins

    for ep in plugins():
        origin = ep.dist or ep.value.split(":")[0]
        try:
            _collect(ep.load(), origin)
        except Exception as exc:  # a broken plug-in must not take the doctor down
            _load_errors.append(f"plug-in {ep.name!r} ({origin}) failed to load: {type(exc).__name__}: {exc}")


def load(scope: "Scope | str | None" = None) -> None:
    """Import built-in checks (all, or those of one scope) and plug-ins once."""
    global _loaded
    if _loaded or (scope is not None and Scope(scope) in _loaded_scopes):
        return
    if scope is None:
        _loaded = True
        _load_builtins()
    else:
        _loaded_scopes.add(Scope(scope))
        _load_builtins(Scope(scope))
    _ensure_plugins()


def scope_index() -> str:
    """The source of `checks/_scopes.py`: which scopes each built-in check module has detectors for, and the
    built-in names and codes (which plug-ins cannot take, even before the modules defining them are loaded)."""
    load()
    rows, checks = [], []
    for name in _builtin_modules():
        module = sys.modules[f"torchdoctor.checks.{name}"]
        pitfalls = [value for value in vars(module).values() if isinstance(value, Pitfall)]
        rows.append(f'    "{name}": {_tuple(str(scope) for p in pitfalls for scope in p.scopes)},\n')
        checks += [f'    "{p.name}": ("{p.code}", "{name}", {_tuple(str(s) for s in p.scopes)}),\n' for p in pitfalls]
    return (
        '"""Which scopes each built-in check module has detectors for (a front door imports only its own), and\n'
        "each built-in pitfall's code, module and scopes (selection resolves names without importing checks).\n\n"
        'Generated by `python scripts/pitfalls.py docs`; a test keeps it in step with the modules.\n"""\n'
        "SCOPES: dict[str, tuple[str, ...]] = {\n" + "".join(rows) + "}\n"
        "CHECKS: dict[str, tuple[str, str, tuple[str, ...]]] = {\n" + "".join(sorted(checks)) + "}\n"
    )


def _tuple(items: Iterable[str]) -> str:
    """`("a", "b")` or `("a",)`: sorted, distinct, as Python source."""
    listed = sorted(set(items))
    return "(" + ", ".join(f'"{s}"' for s in listed) + ("," if len(listed) == 1 else "") + ")"


def load_errors() -> list[str]:
    """Plug-ins that failed to load, as one-line messages."""
    _ensure_plugins()
    return list(_load_errors)


def all_checks(scope: "Scope | str | None" = None) -> list[Pitfall]:
    """Every registered pitfall (with a detector in `scope`, if given), ordered by code."""
    load(scope)
    checks = sorted(_CHECKS.values(), key=lambda c: c.code)
    if scope is None:
        return checks
    scope = Scope(scope)
    return [c for c in checks if scope in c.detectors]


def get(name_or_code: str) -> Pitfall:
    """Look a pitfall up by public name or code (case-insensitive code)."""
    load()
    key = name_or_code.strip()
    if key in _CHECKS:
        return _CHECKS[key]
    code = key.upper()
    if code in _BY_CODE:
        return _CHECKS[_BY_CODE[code]]
    raise RegistryError(f"unknown check {name_or_code!r} (see `torchdoctor checks`)")


def run_fact_checks(checks: Iterable[Pitfall], scope: "Scope | str", facts: Any) -> list[Finding]:
    """Run pure `facts -> findings` checks; a check that raises becomes one `internal-error` finding."""
    scope = Scope(scope)
    findings: list[Finding] = []
    for info in checks:
        try:
            findings.extend(info.complete(f) for f in info.impl(scope)(facts))
        except Exception as exc:
            findings.append(internal_error(info, exc))
    return findings


def internal_error(info: Pitfall, exc: BaseException) -> Finding:
    """The finding that stands for a check which crashed (the check is then skipped, never fatal; the
    command's exit code is then 2, whatever --fail-on says: something was left unchecked)."""
    where = ""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None:
        where = f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
    return Finding(
        key=INTERNAL_ERROR,
        code=info.code,
        name=info.name,
        severity=Severity.INFO,
        message=f"torchdoctor's check {info.name} failed internally and was skipped: "
        f"{type(exc).__name__}: {exc}{where}",
        fix=Fix(
            title="This is a torchdoctor bug, not a problem with your setup; please report it."
            if info.origin == BUILTIN_ORIGIN
            else f"This is a bug in the plug-in {info.origin}, not in your setup: report it to its authors, "
            f"and skip the check until then. {info.silence_advice(next(iter(info.scopes), Scope.ENV))}"
        ),
    )


def _reset_for_tests() -> None:
    """Forget everything (tests of discovery use this, then `load()` again)."""
    global _loaded, _plugins_loaded
    _CHECKS.clear()
    _BY_CODE.clear()
    _load_errors.clear()
    _loaded = _plugins_loaded = False
    _loaded_scopes.clear()
    for name in [m for m in sys.modules if m.startswith("torchdoctor.checks.")]:
        del sys.modules[name]
