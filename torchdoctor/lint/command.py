"""The lint front door below its command line: which files, a cached run, the safe rewrites, the report."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Optional, Sequence

from torchdoctor import registry
from torchdoctor.findings import Finding
from torchdoctor.lint.cache import LintCache
from torchdoctor.lint.files import Pattern, compile_pattern
from torchdoctor.lint.fixes import apply_edits, file_edits
from torchdoctor.lint.runner import LintResult, lint_paths, read_source
from torchdoctor.report import Report
from torchdoctor.settings import Settings, cache_dir

if TYPE_CHECKING:
    from rich.text import Text

Rewrites = dict[str, tuple[str, str, int]]  # display path -> (text before, text after, findings fixed)


class Linter:
    """Lints `paths` (default: the working directory) with the settings' exclude patterns and the results cache."""

    def __init__(
        self, paths: Sequence[str], settings: Settings, checks: Sequence[registry.Pitfall], use_cache: bool = True
    ) -> None:
        self.paths = list(paths) or ["."]
        self.checks = list(checks)
        # The table's patterns are relative to its pyproject.toml; the caller's to the working directory.
        self.excludes: list[str | Pattern] = []
        for pattern, base in settings.exclude:
            compiled = compile_pattern(pattern, base) if base is not None else pattern
            if compiled is not None:
                self.excludes.append(compiled)
        self.cache = LintCache(cache_dir(), settings.root or os.getcwd(), self.checks) if use_cache else None
        self.per_file_ignores = per_file_ignores(settings)
        self.root = settings.root  # the folder of the pyproject.toml whose table was read

    def run(self, cached: bool = True, show_progress: bool = False) -> LintResult:
        """Lint every file (raises FileNotFoundError for a path that does not exist); `cached=False` checks
        every file afresh (cached results carry no rewrites, so --fix and --diff need that). With
        `show_progress`, a long run draws a progress bar on stderr when that is a terminal. Findings the
        project's per-file-ignores name for their file are dropped."""
        with _ProgressBar(show_progress) as bar:
            result = lint_paths(
                self.paths, self.checks, self.excludes, cache=self.cache if cached else None, progress=bar.update
            )
        if self.per_file_ignores:
            result.findings = [f for f in result.findings if not _ignored_here(f, self.per_file_ignores)]
        return result

    def report(self, result: LintResult, fixed: int = 0) -> Report:
        """The report of a run; `fixed` findings were rewritten before it."""
        facts: dict[str, Any] = result.facts()
        if fixed:
            facts["fixed"] = fixed
        return Report(scope="source", findings=result.findings, facts=facts, subject=", ".join(self.paths))


def per_file_ignores(settings: Settings) -> list[tuple[Pattern, frozenset[str]]]:
    """The project's `per-file-ignores`, compiled (patterns relative to its pyproject.toml, as `exclude`'s) with
    the names of the checks they silence; an unknown name, or source-unreadable, is a `SelectionError`."""
    from torchdoctor import selection

    out = []
    for pattern, names, where in settings.per_file_ignores:
        checks = {selection.find(name, selection.LINT, f" in {where}") for name in names}
        required = sorted(c.name for c in checks if c.name in selection.LINT.required)
        if required:
            raise selection.SelectionError(f"{required[0]} cannot be ignored in {where}: {selection.LINT.why_required}")
        compiled = compile_pattern(pattern, settings.root or os.getcwd())
        if compiled is not None:
            out.append((compiled, frozenset(c.name for c in checks)))
    return out


def _ignored_here(f: Finding, ignores: list[tuple[Pattern, frozenset[str]]]) -> bool:
    """Whether a per-file-ignores pattern matching the finding's file (or a folder above it) names its check."""
    if f.location is None or not f.location.file:
        return False
    path = os.path.abspath(f.location.file)
    for pattern, names in ignores:
        if f.name not in names:
            continue
        rel = os.path.relpath(path, pattern.base).replace(os.sep, "/")
        if rel.startswith("../"):
            continue
        parts = rel.split("/")
        matched = any(pattern.matches("/".join(parts[:i]), i < len(parts)) for i in range(1, len(parts) + 1))
        if matched != pattern.negated:  # `!pattern`: every file but those
            return True
    return False


PROGRESS_MIN_FILES = 300  # fewer files to check finish before a bar would help


class _ProgressBar:
    """A rich progress bar on stderr for runs that check many files, only when stderr is a terminal."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.bar: Any = None
        self.task: Any = None

    def update(self, done: int, total: int) -> None:
        if not self.enabled or total < PROGRESS_MIN_FILES:
            return
        if self.bar is None:
            from rich.progress import Progress

            from torchdoctor.report import make_console

            self.bar = Progress(console=make_console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task("Linting", total=total)
        self.bar.update(self.task, completed=done)

    def __enter__(self) -> "_ProgressBar":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def is_fixable(f: Finding) -> bool:
    """Whether `--fix` can rewrite this finding."""
    return bool(getattr(f, "edits", ()))


def statistics(findings: Sequence[Finding]) -> list[str]:
    """`--statistics`: one line per check, most findings first (`count  code  name  [*] fixable`)."""
    rows: dict[tuple[str, str], list[Finding]] = {}
    for f in findings:
        rows.setdefault((f.code, f.name), []).append(f)
    out = []
    for (code, name), group in sorted(rows.items(), key=lambda item: (-len(item[1]), item[0])):
        fixable = sum(1 for f in group if is_fixable(f))
        out.append(f"{len(group):5d}  {code}  {name}" + (f"  [*] {fixable} fixable" if fixable else ""))
    return out


def render_console(report: Report, fail_on: str) -> None:
    """The console report of a lint run in file order (as ruff prints), fixable findings marked [*]."""
    from rich.text import Text

    from torchdoctor.report import make_console, render_finding, summary_line

    console = make_console()
    console.print(Text(f"torchdoctor {report.scope} · {report.subject}", style="bold"))
    console.print(facts_view(report.facts))
    for f in report.findings:
        console.print()
        console.print(render_finding(f), crop=False)
        if is_fixable(f):
            console.print(Text("     [*] fixable with --fix", style="green"))
    console.print()
    if not report.facts.get("files"):
        console.print(Text(f"No Python files found under {report.subject}: nothing was checked.", style="yellow"))
        return
    summary = summary_line(report, fail_on)
    fixable = sum(1 for f in report.findings if is_fixable(f))
    if fixable:
        summary.append(f" [*] {fixable} fixable with --fix.", style="green")
    console.print(summary)


def rewrites(result: LintResult) -> Rewrites:
    """The safe rewrites of every file with applicable edits, keyed by display path."""
    changes = {}
    for path, edits in file_edits(result.findings).items():
        if _encoding(path) is None:
            continue  # unreadable now: nothing to rewrite
        src = read_source(os.path.abspath(path), path)
        after = apply_edits(src.text, edits) if src.tree is not None else None
        if after is not None and after != src.text:
            count = sum(
                1
                for f in result.findings
                if getattr(f, "edits", ()) and f.location is not None and f.location.file == path
            )
            changes[path] = (src.text, after, count)
    return changes


def apply_rewrites(changes: Rewrites) -> int:
    """Write the rewritten files in the encoding they had (a UTF-8 BOM or a declared `coding:` is kept, and so
    are their line endings); returns how many findings that fixed."""
    for path, (_, after, _) in changes.items():
        encoding = _encoding(path)
        if encoding is None:
            continue
        with open(path, "w", encoding=encoding, newline="") as fh:
            fh.write(after)
    return sum(count for path, (_, _, count) in changes.items())


def add_noqa_comments(result: LintResult) -> tuple[int, int, list[str]]:
    """`--add-noqa`: a `# noqa: CODE` comment on every line with a finding (merged into a `# noqa: ...` already
    there), each file written back in its own encoding and line endings. Returns (comments added, files
    changed, `path:line` of the findings no comment can silence)."""
    from torchdoctor.lint.noqa import add_noqa, codes_by_line

    added, files, refused = 0, 0, []
    for path in sorted({f.location.file for f in result.findings if f.location is not None and f.location.file}):
        encoding = _encoding(path)
        codes = codes_by_line(result.findings, path)
        if encoding is None or not codes:
            continue
        with open(path, encoding=encoding, newline="") as fh:
            before = fh.read()
        after, count, skipped = add_noqa(before, codes)
        refused += [f"{path}:{line}" for line in skipped]
        if after is not None and after != before:
            with open(path, "w", encoding=encoding, newline="") as fh:
                fh.write(after)
            added, files = added + count, files + 1
    return added, files, refused


def facts_view(facts: dict[str, Any]) -> "Text":
    """The one-line structure view of a lint run for the console report."""
    from rich.text import Text  # console output only: text, json and sarif runs skip importing rich

    files = facts.get("files", 0)
    text = Text(f"Checked {counted(files, 'Python file')} in {facts.get('seconds', 0):.2f} s", style="dim")
    reused = files - facts.get("checked", files)
    if reused:
        text.append(f" ({reused} unchanged, results from the cache)", style="dim")
    if facts.get("unreadable"):
        text.append(f"; {len(facts['unreadable'])} could not be read", style="dim")
    if facts.get("fixed"):
        text.append(f"; fixed {counted(facts['fixed'], 'finding')}", style="dim")
    return text


def counted(n: int, noun: str) -> str:
    """`1 file`, `2 files`."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _encoding(path: str) -> Optional[str]:
    """The codec that reads and writes the file back byte for byte (`utf-8-sig` keeps a BOM); None if unreadable."""
    import io
    import tokenize

    try:
        with open(path, "rb") as fh:
            data = fh.read()
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        data.decode(encoding)
    except (OSError, SyntaxError, UnicodeDecodeError, LookupError):
        return None
    return encoding
