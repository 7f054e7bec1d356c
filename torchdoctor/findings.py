"""What a check reports: `Severity`, `Location` and `Finding`, shared by every front door."""
from __future__ import annotations

import enum
from dataclasses import dataclass, fields, replace
from typing import Any, Collection, Optional


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
            raise ValueError(
                f"unknown severity {text!r} (expected one of: info, warning, error)"
            ) from None


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


@dataclass
class Finding:
    """One diagnosed problem: what and where (`message`, `location`), and what to do (`fix`).

    A check usually builds it with just `message`, `fix` and `location`; the engine fills in
    `code`, `name` and the check's default `severity` (see `Pitfall.complete`).
    """

    message: str
    fix: str = ""
    location: Optional[Location] = None
    severity: Optional[Severity] = None
    code: str = ""
    name: str = ""
    count: int = 1

    def key(self) -> tuple:
        """Identity used to fold repeats of the same finding into one with a count."""
        return (self.code, self.message, self.location)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Finding":
        """The inverse of `to_dict` (findings travel between ranks as JSON)."""
        loc = d.get("location")
        return cls(message=d["message"], fix=d.get("fix", ""), code=d.get("code", ""), name=d.get("name", ""),
                   severity=Severity.parse(d["severity"]) if d.get("severity") else None,
                   count=d.get("count", 1), location=Location(**loc) if loc else None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "name": self.name,
            "severity": str(self.severity) if self.severity is not None else None,
            "message": self.message,
            "fix": self.fix,
            "location": self.location.to_dict() if self.location else None,
            "count": self.count,
        }


def fold(findings: "list[Finding]") -> "list[Finding]":
    """Merge identical findings (same code, message and location), summing their counts.

    The location of the first occurrence is kept, so a runtime finding keeps its first step.
    """
    merged: dict[tuple, Finding] = {}
    for f in findings:
        k = f.key()
        if k in merged:
            merged[k].count += f.count
        else:
            merged[k] = replace(f)
    return list(merged.values())


def merge_ranks(received: "dict[int, list[Finding]]", cross_rank: Collection[str] = ()) -> "list[Finding]":
    """One finding per problem across the ranks of a job, saying which ranks saw it: ``[rank 1] ...``,
    ``[ranks 1, 3] ...``, ``[all 4 ranks] ...``. Findings of `cross_rank` checks already compare ranks and
    are kept as they are when every rank made them, or only rank 0 (the one that compares) did."""
    groups: dict[tuple, tuple[Finding, list[int]]] = {}
    for rank in sorted(received):
        for f in received[rank]:
            loc = replace(f.location, step=None, rank=None) if f.location else None
            key = (f.code, f.message, loc)
            if key in groups:
                groups[key][1].append(rank)
            else:
                groups[key] = (f, [rank])
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
