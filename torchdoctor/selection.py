"""Which checks a front door runs: the settings' `select`/`ignore` resolved against the registry.

A name the registry does not know, or (from the caller) a check that another front door runs, is a
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

    def runs(self, check: registry.Pitfall) -> bool:
        """Whether this door has a detector for `check`."""
        return any(scope in check.scopes for scope in self.scopes)


ENV = Door("torchdoctor env", (Scope.ENV,))
CHECKPOINT = Door("torchdoctor check-ckpt", (Scope.CHECKPOINT,))
WATCH = Door("torchdoctor.watch()", (Scope.RUNTIME, Scope.DISTRIBUTED))
LINT = Door("torchdoctor lint", (Scope.SOURCE,), required=("source-unreadable",),
            why_required="a file that cannot be read is never reported clean; exclude the file instead")
DOORS = (ENV, CHECKPOINT, WATCH, LINT)


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
            raise SelectionError(f"{blocked[0]} cannot be ignored in {door.label}{_in(layer, 'ignore')}: "
                                 f"{door.why_required}")
        dropped |= ignored
    candidates = sorted({c for scope in door.scopes for c in registry.all_checks(scope)}, key=lambda c: c.code)
    return [c for c in candidates if
            c.name in door.required or ((chosen is None or c.name in chosen) and c.name not in dropped)]


def find(name_or_code: str, door: Optional[Door] = None, where: str = "") -> registry.Pitfall:
    """The check with this name or code; else a `SelectionError` that suggests the closest one."""
    try:
        return registry.get(name_or_code)
    except registry.RegistryError:
        pass
    message = f"unknown check {name_or_code!r}{where}"
    guess = _closest(name_or_code, [c for c in registry.all_checks() if door is None or door.runs(c)])
    if guess is None and door is not None:
        guess = _closest(name_or_code, registry.all_checks())
    if guess is not None:
        message += f"; did you mean {guess}?"
    raise SelectionError(f"{message} (see `torchdoctor checks`)")


def _resolve(door: Door, layer: Layer, key: str, names: Iterable[str]) -> set[str]:
    """The names of `door`'s checks among `names`; other doors' checks are skipped in shared layers only."""
    out = set()
    for raw in names:
        check = find(raw, door, _in(layer, key))
        if door.runs(check):
            out.add(check.name)
        elif not layer.shared:
            raise SelectionError(_other_door(check, door))
    return out


def _other_door(check: registry.Pitfall, door: Door) -> str:
    """`env --select missing-zero-grad`: say which doors do run it, and what this door has that is close."""
    doors = " and ".join(d.label for d in DOORS if d.runs(check)) or "no front door"
    message = f"{check.name} ({check.code}) is not checked by {door.label}, only by {doors}"
    guess = _closest(check.name, [c for c in registry.all_checks() if door.runs(c)])
    return message + (f"; did you mean {guess}?" if guess else "")


def _closest(text: str, checks: list[registry.Pitfall]) -> Optional[str]:
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
