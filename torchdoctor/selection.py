"""Which checks a front door runs: the settings' `select`/`ignore` resolved against the registry.

Names and codes are resolved from the generated index of built-in checks (and the plug-ins), so selecting
imports only the modules of the checks selected. A name the registry does not know, or (from the caller) a check that
another front door runs, is a
`SelectionError`: one line with a did-you-mean, shown as a usage error. The project table and the
environment are shared by every door, so there a name of another door is skipped, and a `select` list
that names none of a door's checks leaves that door's selection as the earlier layers made it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Optional

from torchdoctor import registry
from torchdoctor.registry import Scope
from torchdoctor.settings import Layer, Settings

_CODE = re.compile(r"^[A-Za-z]+[0-9]+$")


@dataclass(frozen=True)
class Door:
    """A front door: what users call it, the scopes of the checks it runs, and the checks it always runs."""

    label: str
    scopes: tuple[Scope, ...]
    required: tuple[str, ...] = ()  # never deselected and never ignorable (see `why_required`)
    why_required: str = ""

    def runs(self, check: "Ref | registry.Pitfall") -> bool:
        """Whether this door has a detector for `check`."""
        return any(str(scope) in {str(s) for s in check.scopes} for scope in self.scopes)


ENV = Door("torchdoctor env", (Scope.ENV,))
CHECKPOINT = Door("torchdoctor check-ckpt", (Scope.CHECKPOINT,))
WATCH = Door("torchdoctor.watch()", (Scope.RUNTIME, Scope.DISTRIBUTED))
LINT = Door(
    "torchdoctor lint",
    (Scope.SOURCE,),
    required=("source-unreadable",),
    why_required="a file that cannot be read is never reported clean; exclude the file instead",
)
DOORS = (ENV, CHECKPOINT, WATCH, LINT)


@dataclass(frozen=True)
class Ref:
    """A check as selection sees it: its name, code and scopes, known without importing its module."""

    name: str
    code: str
    scopes: tuple[str, ...]


def _refs() -> list[Ref]:
    """Every check: the built-ins from the generated index, then the plug-ins (imported to be known) and any
    pitfall registered at run time."""
    refs = [Ref(name, row.code, row.scopes) for name, row in registry.index().items()]
    return refs + [Ref(p.name, p.code, tuple(str(s) for s in p.scopes)) for p in registry.unindexed()]


class SelectionError(ValueError):
    """A selection names no check, a check of another front door, or a check that cannot be ignored."""


def select_checks(door: Door, settings: Settings) -> list[registry.Pitfall]:
    """The checks `door` runs under `settings`, ordered by code; raises `SelectionError` (one line)."""
    chosen: Optional[set[str]] = None
    dropped: set[str] = set()
    for layer in settings.layers:
        names = _resolve(door, layer, "select", layer.select)
        if names:
            chosen = names
        ignored = _resolve(door, layer, "ignore", layer.ignore)
        blocked = sorted(ignored.intersection(door.required))
        if blocked:
            raise SelectionError(
                f"{blocked[0]} cannot be ignored in {door.label}{_in(layer, 'ignore')}: {door.why_required}"
            )
        dropped |= ignored
    if chosen is None:  # the whole door: every module of its scopes
        candidates = {c for scope in door.scopes for c in registry.all_checks(scope)}
    else:  # only the modules of the checks named (`env --select module-shadowing` imports one check)
        candidates = set(registry.load_names(sorted(chosen | set(door.required))))
    return [
        c
        for c in sorted(candidates, key=lambda c: c.code)
        if c.name in door.required or ((chosen is None or c.name in chosen) and c.name not in dropped)
    ]


def find(name_or_code: str, door: Optional[Door] = None, where: str = "") -> registry.Pitfall:
    """The check with this name or code (its module imported); else a `SelectionError` with a suggestion."""
    ref = resolve(name_or_code, door, where)
    return registry.load_names([ref.name])[0]


def resolve(name_or_code: str, door: Optional[Door] = None, where: str = "") -> Ref:
    """The check with this name or code, from the index; else a `SelectionError` with a suggestion."""
    refs = _refs()
    key = name_or_code.strip()
    for ref in refs:
        if key == ref.name or key.upper() == ref.code:
            return ref
    message = f"unknown check {name_or_code!r}{where}"
    guess = _closest(name_or_code, [c for c in refs if door is None or door.runs(c)])
    if guess is None and door is not None:
        guess = _closest(name_or_code, refs)
    if guess is not None:
        message += f"; did you mean {guess}?"
    raise SelectionError(f"{message} (see `torchdoctor checks`)")


def _resolve(door: Door, layer: Layer, key: str, names: Iterable[str]) -> set[str]:
    """The names of `door`'s checks among `names`; other doors' checks are skipped in shared layers only."""
    out = set()
    for raw in names:
        check = resolve(raw, door, _in(layer, key))
        if door.runs(check):
            out.add(check.name)
        elif not layer.shared:
            raise SelectionError(_other_door(check, door))
    return out


def _other_door(check: Ref, door: Door) -> str:
    """`env --select missing-zero-grad`: say which doors do run it, and what this door has that is close."""
    doors = " and ".join(d.label for d in DOORS if d.runs(check)) or "no front door"
    message = f"{check.name} ({check.code}) is not checked by {door.label}, only by {doors}"
    guess = _closest(check.name, [c for c in _refs() if door.runs(c)])
    return message + (f"; did you mean {guess}?" if guess else "")


def _closest(text: str, checks: list[Ref]) -> Optional[str]:
    """The check name (or, for something shaped like a code, the code and name) closest to `text`."""
    import difflib  # only a usage error needs it

    if _CODE.match(text.strip()):
        by_code = {c.code: c for c in checks}
        match = difflib.get_close_matches(text.strip().upper(), list(by_code), n=1)
        return f"{match[0]} ({by_code[match[0]].name})" if match else None
    match = difflib.get_close_matches(text.strip().lower(), [c.name for c in checks], n=1)
    return repr(match[0]) if match else None


def _in(layer: Layer, key: str) -> str:
    """` in TORCHDOCTOR_SELECT` for a shared layer; nothing for the caller's own options."""
    return f" in {layer.where(key)}" if layer.shared else ""
