"""The console report as plain lines, printed without importing rich when the output is not a terminal.

Off a terminal rich prints a report uncoloured, unwrapped and without trailing spaces (`report.make_console`);
for a front door whose facts view can say the same lines itself (`torchdoctor.ckpt.view.plain_lines`), those
lines and the findings are written here instead, which spares the command rich's import (a third of
`check-ckpt`'s start-up). Anything rich would treat specially — a control character or tab, a very long line,
a forced terminal (FORCE_COLOR, TTY_COMPATIBLE) — leaves the report to rich. Tests print reports both ways and
require the same text.
"""

from __future__ import annotations

import os
import sys
from typing import IO, Optional

from torchdoctor import __version__
from torchdoctor.findings import Finding, Severity
from torchdoctor.report import Report, exit_code

_MARKS = {Severity.ERROR: ("✗", "error", "errors"), Severity.WARNING: ("!", "warning", "warnings")}
_MARKS[Severity.INFO] = ("i", "note", "notes")
_LONGEST = 4000  # a longer line might be folded by rich: rich prints it


def off_terminal(stream: IO[str]) -> bool:
    """Whether rich would print to `stream` as to a file (no terminal), as `rich.console.Console.is_terminal`
    decides it for a command-line process."""
    if getattr(sys.stdin, "__module__", "").startswith("idlelib"):
        return False
    tty = os.environ.get("TTY_COMPATIBLE", "")
    if tty in ("0", "1"):
        return tty == "0"
    force = os.environ.get("FORCE_COLOR")
    if force is not None:
        return force == ""
    try:
        return not stream.isatty()
    except (AttributeError, ValueError):
        return False


def _plain(text: str) -> bool:
    """Text rich prints unchanged, line by line: no control character but newlines, no tab, no very long line."""
    return all(len(line) < _LONGEST for line in text.split("\n")) and not any(
        (c < " " and c != "\n") or c == "\x7f" for c in text
    )


def _finding_lines(f: Finding) -> list[str]:
    mark = _MARKS[f.severity or Severity.INFO][0]
    lines = [f" {mark} {f.code} {f.name}" + (f"  (×{f.count})" if f.count > 1 else "")]
    lines += ["     " + line.rstrip() for line in f.message.split("\n")]
    if f.location is not None and str(f.location):
        lines += ["     " + line.rstrip() for line in f"where: {f.location}".split("\n")]
    if f.fix is not None:
        lines += ["     " + line.rstrip() for line in ("fix:" + (f" {f.fix.title}" if f.fix.title else "")).split("\n")]
        if f.fix.code:
            lines += ["         " + line.rstrip() for line in f.fix.code.split("\n")]
    return lines


def _summary(report: Report, fail_on: str) -> str:
    counts = report.counts()
    if not report.findings:
        unseen = sum(len(g.get("checks", [])) for g in report.facts.get("not_run", []) if g.get("applies", True))
        if unseen:
            return f"No problems found by the checks that ran; {unseen} could not run (see above)."
        return "✓ No problems found."
    bits = []
    for sev in (Severity.ERROR, Severity.WARNING, Severity.INFO):
        n = counts[sev]
        if n:
            _, one, many = _MARKS[sev]
            bits.append(f"{n} {one if n == 1 else many}")
    text = "Found " + ", ".join(bits) + "."
    code = exit_code(report.findings, fail_on)
    if code == 2:
        text += " Exit 2: a check failed internally, so this is not a complete result."
    elif code:
        text += f" Exit 1: --fail-on {fail_on}."
    return text


def report_lines(report: Report, fail_on: str, facts: Optional[list[str]]) -> Optional[list[str]]:
    """The lines `report.render_console` prints off a terminal (`facts`: the facts view's lines, None for none),
    or None when rich must print this report."""
    title = f"torchdoctor {report.scope}" + (f" · {report.subject}" if report.subject else "")
    lines = [f"{title} (torchdoctor {__version__})", *(facts or [])]
    for sev in (Severity.ERROR, Severity.WARNING, Severity.INFO):
        group = [f for f in report.sorted_findings() if (f.severity or Severity.INFO) == sev]
        if group:
            _, one, many = _MARKS[sev]
            lines += ["", f"{len(group)} {one if len(group) == 1 else many}"]
            for f in group:
                lines += _finding_lines(f)
    lines += ["", _summary(report, fail_on)]
    return lines if all(_plain(line) for line in lines) else None
