"""What a check reports: `Severity`, `Location`, `Fix` and `Finding`, shared by every front door."""

from __future__ import annotations

import ast
import enum
import sys
import textwrap
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import Any, Collection, Optional, Union

from torchdoctor.pysource import parse_quietly


class Severity(enum.IntEnum):
    """How bad a finding is; ordered so that `--fail-on` can compare them."""

    INFO = 10
    WARNING = 20
    ERROR = 30

    def __str__(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: "str | Severity") -> "Severity":
        """Accept `error`/`warning`/`info` in any case (or a Severity)."""
        if isinstance(text, Severity):
            return text
        try:
            return cls[str(text).strip().upper()]
        except KeyError:
            raise ValueError(f"unknown severity {text!r} (expected one of: info, warning, error)") from None


@dataclass(frozen=True)
class Location:
    """Where a finding applies; only the fields that make sense for it are set."""

    file: Optional[str] = None
    line: Optional[int] = None
    column: Optional[int] = None
    module: Optional[str] = None
    param: Optional[str] = None
    key: Optional[str] = None
    step: Optional[int] = None
    device: Optional[str] = None
    rank: Optional[int] = None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def __str__(self) -> str:
        parts = []
        if self.file:
            pos = self.file
            if self.line is not None:
                pos += f":{self.line}"
                if self.column is not None:
                    pos += f":{self.column}"
            parts.append(pos)
        for name in ("module", "param", "key", "device"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name} {value}")
        if self.step is not None:
            parts.append(f"step {self.step}")
        if self.rank is not None:
            parts.append(f"rank {self.rank}")
        return ", ".join(parts)


_LEAD_IN_ENDS = (":", "e.g.")
INTERNAL_ERROR = "internal-error"  # the `key` of the finding that stands for a check which crashed


@dataclass(frozen=True)
class Fix:
    """What to do about a finding: a `title` in prose and, where there is one, a `code` snippet to paste as is."""

    title: str = ""
    code: str = ""

    @classmethod
    def parse(cls, text: str) -> Optional["Fix"]:
        """The fix that free text describes (None for no text): its lead-in prose is the title, the rest the code.

        The lead-in ends before the first line of Python or after the first line ending in ":" or "e.g.";
        failing both, it is the first line. One line of prose is all title, one line of Python all code.
        """
        if not text.strip():
            return None
        lines = text.strip("\n").splitlines()
        end = 1
        for i, line in enumerate(lines):
            if _is_code(line) or line.rstrip().endswith(_LEAD_IN_ENDS):
                end = i if _is_code(line) else i + 1
                break
        return cls(" ".join(line.strip() for line in lines[:end]), _snippet(lines[end:]))

    @classmethod
    def from_json(cls, value: Union[str, dict[str, str], None]) -> Optional["Fix"]:
        """The inverse of `to_dict`; also reads the free text that older versions wrote (cached lint results)."""
        if isinstance(value, dict):
            return cls(value.get("title", ""), value.get("code", ""))
        return cls.parse(value or "")

    def to_dict(self) -> dict[str, str]:
        return {"title": self.title, "code": self.code}


def _snippet(lines: list[str]) -> str:
    """The code lines of a free-text fix, dedented; prose after the Python (an alternative such as "or write a
    copy: ...") becomes a comment, so that the whole snippet pastes."""
    for end in range(len(lines), 0, -1):
        head = textwrap.dedent("\n".join(lines[:end])).rstrip()
        if _parses(head) and not any(_is_code(line) for line in lines[end:]):
            return "\n".join([head, *(f"# {line.strip()}" for line in lines[end:])])
    return textwrap.dedent("\n".join(lines)).rstrip()


@lru_cache(maxsize=1024)  # checks build many findings with the same fix text: parse each line once
def _parses(source: str) -> bool:
    try:
        parse_quietly(source)
    except (SyntaxError, ValueError):
        return False
    return True


@lru_cache(maxsize=1024)
def _is_code(line: str) -> bool:
    """Whether a line of a free-text fix is Python (a statement, a block header, or a comment), not prose."""
    text = line.strip()
    if text.startswith("#"):
        return True
    for source in (text, text + " pass"):  # a block header such as `for x in y:` parses with a body
        try:
            body = parse_quietly(source).body
        except (SyntaxError, ValueError):
            continue
        bare_name = len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Name)
        return bool(body) and not bare_name  # a lone word is prose
    return False


class _FixField:
    """`Finding.fix`: set from a `Fix` (built-in checks always pass one) or from free text (`Fix.parse`: plug-ins
    may pass text), read as a `Fix`."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._attr = f"_{name}"

    def __get__(self, obj: object, owner: Any = None) -> Optional[Fix]:
        return None if obj is None else obj.__dict__.get(self._attr)  # on the class: the field's default

    def __set__(self, obj: object, value: Union[Fix, str, None]) -> None:
        obj.__dict__[self._attr] = value if value is None or isinstance(value, Fix) else _parsed_fix(value)


@lru_cache(maxsize=512)
def _parsed_fix(text: str) -> Optional[Fix]:
    """`Fix.parse`, once per text: a check gives the same fix text to each of its findings (a `Fix` is frozen)."""
    return Fix.parse(text)


@dataclass
class Finding:
    """One diagnosed problem: what and where (`message`, `location`), and what to do (`fix`).

    A check usually builds it with just `message`, `fix` (a `Fix`; a plug-in may give text) and `location`;
    the engine fills in `code`, `name` and the check's default `severity` (see `Pitfall.complete`). `key` tells one
    problem from others of the same check at the same place when the wording of the message does not
    (see `fold_key`).
    """

    message: str
    fix: _FixField = _FixField()
    location: Optional[Location] = None
    severity: Optional[Severity] = None
    code: str = ""
    name: str = ""
    count: int = 1
    key: str = ""

    def __post_init__(self) -> None:
        if not self.key:
            self.key = _built_at()

    def copy(self) -> "Finding":
        """A shallow copy, of a subclass too: the fields as they are, without `dataclasses.replace`'s generic pass
        over them and a new `__init__` (lint copies every finding of every file)."""
        done = object.__new__(type(self))
        done.__dict__.update(self.__dict__)
        return done

    def fold_key(self) -> tuple:
        """Identity of the problem, to fold its repeats (other steps, other ranks) into one finding with a count.

        It is the check, the place whatever the step or rank, and `key` — by default where the detector built
        the finding (`module:line`): the message's wording never splits one problem, so a count or a step
        number in it may differ between repeats and ranks. A detector that reports several problems from one
        line at one place tells them apart with `key` (or a more precise location).
        """
        where = self.location
        if where is not None and (where.step is not None or where.rank is not None):
            where = replace(where, step=None, rank=None)
        return (self.code, where, self.key)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Finding":
        """The inverse of `to_dict` (findings travel between ranks as JSON)."""
        loc = d.get("location")
        return cls(
            message=d["message"],
            fix=Fix.from_json(d.get("fix")),
            code=d.get("code", ""),
            name=d.get("name", ""),
            severity=Severity.parse(d["severity"]) if d.get("severity") else None,
            count=d.get("count", 1),
            location=Location(**loc) if loc else None,
            key=d.get("key", ""),
        )

    def to_dict(self) -> dict[str, Any]:
        out = {
            "code": self.code,
            "name": self.name,
            "severity": str(self.severity) if self.severity is not None else None,
            "message": self.message,
            "fix": self.fix.to_dict() if self.fix is not None else None,
            "location": self.location.to_dict() if self.location else None,
            "count": self.count,
        }
        out["key"] = self.key
        return out


def _built_at() -> str:
    """`module:line` of the code that built a finding (past the dataclass constructors), as its default key."""
    frame = sys._getframe(2)
    while frame.f_back is not None and frame.f_code.co_name in ("__init__", "__post_init__"):
        frame = frame.f_back
    return f"{frame.f_globals.get('__name__', '?')}:{frame.f_lineno}"


def fold(findings: "list[Finding]") -> "list[Finding]":
    """Merge the repeats of one problem (same `fold_key`), summing their counts.

    The first occurrence is kept, so a runtime finding keeps its first step and the numbers of its message.
    """
    merged: dict[tuple, Finding] = {}
    for f in findings:
        k = f.fold_key()
        if k in merged:
            merged[k].count += f.count
        else:
            merged[k] = f.copy()
    return list(merged.values())


def merge_ranks(received: "dict[int, list[Finding]]", cross_rank: Collection[str] = ()) -> "list[Finding]":
    """One finding per problem (same `fold_key`, whatever numbers the ranks' messages hold) across the ranks
    of a job, saying which ranks saw it: ``[rank 1] ...``,
    ``[ranks 1, 3] ...``, ``[all 4 ranks] ...``. Findings of `cross_rank` checks already compare ranks and
    are kept as they are when every rank made them, or only rank 0 (the one that compares) did."""
    groups: dict[tuple, tuple[Finding, list[int]]] = {}
    for rank in sorted(received):
        for f in received[rank]:
            key = f.fold_key()
            if key not in groups:
                groups[key] = (f, [rank])
            elif rank not in groups[key][1]:
                groups[key][1].append(rank)
    reporting = len(received)
    merged = []
    for f, seen in groups.values():
        if reporting < 2 or (f.name in cross_rank and (len(seen) == reporting or seen == [0])):
            merged.append(f)
            continue
        ranks = ", ".join(map(str, seen))
        where = f"all {reporting} ranks" if len(seen) == reporting else f"rank{'s' if len(seen) > 1 else ''} {ranks}"
        loc = f.location or Location()
        if len(seen) == 1:
            loc = replace(loc, rank=seen[0])
        merged.append(replace(f, message=f"[{where}] {f.message}", location=loc if str(loc) else None))
    return merged
