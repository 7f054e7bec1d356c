"""A diagnosis and its output: the JSON envelope (report.schema.json), the exit code, the rich console report."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from torchdoctor import __version__
from torchdoctor.findings import INTERNAL_ERROR, Finding, Severity
from torchdoctor.settings import DEFAULT_FAIL_ON

if TYPE_CHECKING:  # rich is imported when a console report is rendered, not on the way to the torch probe
    from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
    from rich.text import Text

SCHEMA_VERSION = 1  # of the JSON envelope; bumped when a key changes meaning or disappears

_STYLE = {
    Severity.ERROR: ("✗", "bold red", "error", "errors"),
    Severity.WARNING: ("!", "bold yellow", "warning", "warnings"),
    Severity.INFO: ("i", "bold cyan", "note", "notes"),
}


@dataclass
class Report:
    """Everything one front door found: the facts it looked at and the findings."""

    scope: str
    findings: list[Finding]
    facts: dict[str, Any] = field(default_factory=dict)
    subject: str = ""  # what was examined: "this machine", a checkpoint path, ...
    fail_on: str = DEFAULT_FAIL_ON  # the threshold of `exit_code()` (one of settings.FAIL_ON)

    def sorted_findings(self) -> list[Finding]:
        """Errors first, then warnings, then notes; the findings that explain a crash lead (runtime reports)."""
        crash = set(self.facts.get("crash_explained_by", ()))
        return sorted(self.findings, key=lambda f: (f.name not in crash, -int(f.severity or 0), f.code))

    def counts(self) -> dict[Severity, int]:
        out = {s: 0 for s in Severity}
        for f in self.findings:
            out[f.severity or Severity.INFO] += 1
        return out

    def exit_code(self) -> int:
        """The command's exit code for these findings under `fail_on`."""
        return exit_code(self.findings, self.fail_on)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        """Jupyter and IPython show a report as its console report: rich's notebook HTML, and plain text."""
        from rich.console import Console

        console = Console(
            record=True,
            file=io.StringIO(),
            width=_NOTEBOOK_WIDTH,
            force_terminal=True,
            force_jupyter=False,
            color_system="truecolor",
            highlight=False,
        )
        render_console(self, console, fail_on=self.fail_on, facts_view=_facts_view(self.scope))
        text = console.export_text(clear=False)
        return {"text/plain": text, "text/html": console.export_html(inline_styles=True, code_format=_NOTEBOOK_PRE)}

    def to_dict(self) -> dict[str, Any]:
        """The JSON envelope every command prints with `--format json` (torchdoctor/report.schema.json)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": "torchdoctor",
            "version": __version__,
            "scope": self.scope,
            "subject": self.subject,
            "counts": {str(severity): n for severity, n in sorted(self.counts().items(), reverse=True)},
            "exit_code": self.exit_code(),
            "facts": self.facts,
            "findings": [f.to_dict() for f in self.sorted_findings()],
        }


_NOTEBOOK_WIDTH = 115  # rich's width in a notebook
# the <pre> rich wraps its notebook output in (rich.jupyter), so a report looks as rich's own cell output does
_NOTEBOOK_PRE = (
    '<pre style="white-space:pre;overflow-x:auto;line-height:normal;'
    "font-family:Menlo,'DejaVu Sans Mono',consolas,'Courier New',monospace\">{code}</pre>"
)
_FACTS_VIEWS = {
    "env": "torchdoctor.env.view",
    "checkpoint": "torchdoctor.ckpt.view",
    "runtime": "torchdoctor.watch.view",
    "run": "torchdoctor.run.view",
}


def _facts_view(scope: str) -> Optional[Callable[[dict[str, Any]], "RenderableType"]]:
    """The front door's view of its facts, as its command prints them (lint prints none)."""
    if scope not in _FACTS_VIEWS:
        return None
    import importlib

    view: Callable[[dict[str, Any]], "RenderableType"] = importlib.import_module(_FACTS_VIEWS[scope]).facts_view
    return view


def exit_code(findings: list[Finding], fail_on: str = DEFAULT_FAIL_ON) -> int:
    """0 when no finding is at or above `fail_on`, else 1; 2 when a check crashed, whatever `fail_on` says (it
    left something unchecked: the run is no result), as for usage and input errors."""
    if any(f.key == INTERNAL_ERROR for f in findings):
        return 2
    if fail_on == "never":
        return 0
    threshold = Severity.parse(fail_on)
    return 1 if any((f.severity or Severity.INFO) >= threshold for f in findings) else 0


def to_json(report: Report) -> str:
    """The `--format json` document (DESIGN.md schema); non-JSON values are stringified."""
    return json.dumps(report.to_dict(), indent=2, default=str, ensure_ascii=False)


_SYMBOLS = "✓✗×·…"
_UNWRAPPED = 10_000  # the width of a console that is not a terminal: lines are never wrapped


def make_console(stderr: bool = False) -> "Console":
    """The console a report is printed on: colours as the terminal and NO_COLOR say; off a terminal, lines are
    neither wrapped nor padded (so that code pastes); symbols the stream can't encode get ASCII stand-ins."""
    from rich.console import Console

    from torchdoctor.pasteable import PasteableStream, can_encode

    console = Console(stderr=stderr, highlight=False, soft_wrap=False)
    terminal = console.is_terminal
    if terminal and can_encode(console.file, _SYMBOLS):
        return console
    # rich only writes to and flushes its file, and asks its isatty() and encoding: a PasteableStream will do
    return Console(
        file=PasteableStream(console.file),  # type: ignore[arg-type]
        width=None if terminal else _UNWRAPPED,
        highlight=False,
        soft_wrap=not terminal,
    )


class _Indented:
    """Text indented under a finding's head: prose wraps to a terminal's width; code (`wrap=False`) never does."""

    def __init__(self, text: "Text", indent: int, wrap: bool = True) -> None:
        self.text, self.indent, self.wrap = text, indent, wrap

    def __rich_console__(self, console: "Console", options: "ConsoleOptions") -> "RenderResult":
        from rich.segment import Segment

        if self.wrap and not options.no_wrap:
            lines = self.text.wrap(console, max(options.max_width - self.indent, 20))
        else:
            lines = self.text.split("\n", allow_blank=True)
        for line in lines:
            line.rstrip()
            yield Segment(" " * self.indent)
            yield from line.render(console)
            yield Segment.line()


def render_finding(f: Finding) -> "RenderableType":
    """One finding: marker, code and name, the message, where, and the fix (its title, then its code as is).

    Print it with ``crop=False``, so that a code line wider than the terminal is not cut either.
    """
    from rich.console import Group
    from rich.text import Text

    mark, style, _, _ = _STYLE[f.severity or Severity.INFO]
    head = Text.assemble((f" {mark} ", style), (f"{f.code} ", "dim"), (f.name, "bold"))
    if f.count > 1:
        head.append(f"  (×{f.count})", style="dim")
    parts: list["RenderableType"] = [head, _Indented(Text(f.message), 5)]
    if f.location is not None and str(f.location):
        parts.append(_Indented(Text.assemble(("where: ", "dim"), str(f.location)), 5))
    if f.fix is not None:
        parts.append(_Indented(Text.assemble(("fix:", "green"), f" {f.fix.title}" if f.fix.title else ""), 5))
        if f.fix.code:
            parts.append(_Indented(Text(f.fix.code, style="cyan"), 9, wrap=False))
    return Group(*parts)


def summary_line(report: Report, fail_on: str) -> "Text":
    from rich.text import Text

    counts = report.counts()
    if not report.findings:
        unseen = sum(len(g.get("checks", [])) for g in report.facts.get("not_run", []) if g.get("applies", True))
        if unseen:  # a watch session whose checks saw nothing to judge: not a clean bill of health
            return Text(
                f"No problems found by the checks that ran; {unseen} could not run (see above).", style="bold yellow"
            )
        return Text("✓ No problems found.", style="bold green")
    bits = []
    for sev in (Severity.ERROR, Severity.WARNING, Severity.INFO):
        n = counts[sev]
        if n:
            _, style, one, many = _STYLE[sev]
            bits.append((f"{n} {one if n == 1 else many}", style))
    text = Text("Found ")
    for i, (label, style) in enumerate(bits):
        if i:
            text.append(", ")
        text.append(label, style=style)
    text.append(".")
    code = exit_code(report.findings, fail_on)
    if code == 2:
        text.append(" Exit 2: a check failed internally, so this is not a complete result.", style="dim")
    elif code:
        text.append(f" Exit 1: --fail-on {fail_on}.", style="dim")
    return text


def render_console(
    report: Report,
    console: "Console",
    *,
    fail_on: str = "error",
    facts_view: Optional[Callable[[dict[str, Any]], "RenderableType"]] = None,
) -> None:
    """Print the doctor's report: facts (if a view is given), findings by severity, a summary."""
    from rich.text import Text

    title = f"torchdoctor {report.scope}"
    if report.subject:
        title += f" · {report.subject}"  # a Text is printed verbatim: no markup to escape
    console.print(Text(title, style="bold"), Text(f"(torchdoctor {__version__})", style="dim"))
    if facts_view is not None:
        console.print(facts_view(report.facts))
    for sev in (Severity.ERROR, Severity.WARNING, Severity.INFO):
        group = [f for f in report.sorted_findings() if (f.severity or Severity.INFO) == sev]
        if not group:
            continue
        _, style, one, many = _STYLE[sev]
        console.print()
        console.print(Text(f"{len(group)} {one if len(group) == 1 else many}", style=style))
        for f in group:
            console.print(render_finding(f), crop=False)
    console.print()
    console.print(summary_line(report, fail_on))
