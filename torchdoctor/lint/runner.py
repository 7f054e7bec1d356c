"""Read, parse and check files: the engine behind `torchdoctor lint` (no pitfall-specific logic here)."""

from __future__ import annotations

import bisect
import gc
import io
import os
import re
import time
import tokenize
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Sequence

from torchdoctor import registry
from torchdoctor.findings import Finding, Location, fold
from torchdoctor.lint.cache import FileResult, LintCache, library_fingerprint
from torchdoctor.lint.files import Pattern, discover, display_path
from torchdoctor.lint.libraries import LibraryFacts
from torchdoctor.lint.source import ProjectFacts, ProjectView, SourceFile
from torchdoctor.pysource import parse_quietly, quiet_parsing

MAX_FILE_BYTES = 2_000_000  # a larger .py file is generated data, not a training script: skipped with a finding
_IGNORE = re.compile(r"#\s*torchdoctor:\s*ignore(?:\[([^\]]*)\])?")
# ruff's and flake8's: a bare noqa comment silences every finding of the line, one that lists codes only those.
NOQA = re.compile(r"#\s*noqa(?::[\s]?(?P<codes>[A-Za-z]+[0-9]+(?:[,\s]+[A-Za-z]+[0-9]+)*))?", re.IGNORECASE)
_ALL = "*"


@dataclass
class LintResult:
    """What one lint run read and found."""

    findings: list[Finding]
    files: list[str] = field(default_factory=list)
    seconds: float = 0.0
    checked: int = 0  # files checked in this run; the others' results came from the cache
    unreadable: list[str] = field(default_factory=list)  # files that could not be read or parsed

    def facts(self) -> dict:
        return {
            "files": len(self.files),
            "checked": self.checked,
            "unreadable": sorted(self.unreadable),
            "seconds": round(self.seconds, 3),
        }


def read_source(
    path: str, display: str, project: Optional[ProjectFacts] = None, abspath: Optional[str] = None
) -> SourceFile:
    """Read and parse one file; a file that cannot be read, decoded or parsed carries a `problem` instead of a tree.
    (`abspath`: the path made absolute, when the caller has it already.)"""
    view = ProjectView(project if project is not None else ProjectFacts(), display, abspath or os.path.abspath(path))
    program = view.facts.program
    known = program.parsed(view.abspath or "")
    data = program.take_read(view.abspath or "")  # read already to answer another file's question
    try:
        if data is None:
            with open(path, "rb") as fh:
                data = fh.read()
    except OSError as exc:
        return SourceFile(display, "", problem=f"could not be read: {exc.strerror or exc}", project=view)
    if len(data) > MAX_FILE_BYTES:
        return SourceFile(
            display,
            "",
            problem=f"larger than the lint limit ({len(data) / 1e6:.1f} MB > {MAX_FILE_BYTES / 1e6:.0f} MB); skipped",
            problem_line=1,
            project=view,
        )
    text, problem, line = _decode(data)
    if problem:
        return SourceFile(display, "", problem=problem, problem_line=line, project=view)
    if known is not None:  # parsed already to answer another file's question: same bytes, same tree
        src = SourceFile(display, text, known.tree, project=view)
        src.__dict__["index"] = view.index = known.index
        view.tree = known.tree
        return src
    try:
        tree = parse_quietly(text, display)
    except SyntaxError as exc:
        line = exc.lineno or 1
        return SourceFile(display, text, problem=f"not valid Python: {exc.msg}", problem_line=line, project=view)
    except (ValueError, RecursionError, MemoryError) as exc:
        return SourceFile(
            display, text, problem=f"cannot be parsed: {type(exc).__name__}: {exc}", problem_line=1, project=view
        )
    return SourceFile(display, text, tree, project=view)


def _decode(data: bytes) -> tuple[str, Optional[str], int]:
    """UTF-8 (Python's default), or the encoding a PEP 263 `coding:` line declares."""
    try:
        return data.decode("utf-8-sig"), None, 0
    except UnicodeDecodeError as exc:
        utf8_error = exc
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError:
        encoding = "utf-8"
    if encoding in ("utf-8", "utf-8-sig"):
        line = data[: utf8_error.start].count(b"\n") + 1
        return "", f"not UTF-8 and declares no other encoding (byte 0x{data[utf8_error.start]:02x})", line
    try:
        return data.decode(encoding), None, 0
    except (UnicodeDecodeError, LookupError) as exc:
        return "", f"not readable as its declared encoding {encoding}: {exc}", 1


def suppressed_lines(src: SourceFile) -> dict[int, set[str]]:
    """line -> names/codes silenced there by `# torchdoctor: ignore[name, ...]` or `# noqa: CODE, ...` (`*` for a
    bare ignore or a bare `# noqa`)."""
    if "torchdoctor:" not in src.text and "noqa" not in src.text.lower():
        return {}
    out: dict[int, set[str]] = {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(src.text).readline))
    except (tokenize.TokenError, SyntaxError):
        return out
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            m = _IGNORE.search(tok.string)
            if m:
                names = {n.strip() for n in (m.group(1) or _ALL).split(",") if n.strip()}
                out.setdefault(tok.start[0], set()).update(names or {_ALL})
            noqa = NOQA.search(tok.string)
            if noqa:
                codes = noqa.group("codes")
                out.setdefault(tok.start[0], set()).update(re.split(r"[,\s]+", codes.upper()) if codes else {_ALL})
    return out


def _is_silenced(f: Finding, silenced: dict[int, set[str]]) -> bool:
    names = silenced.get(f.location.line if f.location and f.location.line else -1)
    if not names:
        return False
    return _ALL in names or f.name in names or f.code in names or f.code.lower() in names


def check_source(src: SourceFile, checks: Sequence[registry.Pitfall]) -> list[Finding]:
    """Run the source checks on one file; a crashing check becomes one internal-error finding for this file."""
    return _check(src, _detectors(checks)).findings


Detectors = list[tuple[registry.Pitfall, Callable[[SourceFile], Iterable[Finding]]]]


def _detectors(checks: Sequence[registry.Pitfall]) -> Detectors:
    """Each check with its source detector, looked up once per run rather than once per file."""
    return [(info, info.impl(registry.Scope.SOURCE)) for info in checks]


def _check(src: SourceFile, detectors: Detectors) -> FileResult:
    findings: list[Finding] = []
    crashed = False
    for info, detect in detectors:
        try:
            for found in detect(src):
                findings.append(info.complete(found))
        except Exception as exc:
            failed = registry.internal_error(info, exc)
            failed.location = Location(file=src.path)
            findings.append(failed)
            crashed = True
    # The comments of a file that could not be parsed are not trusted to silence anything (so its
    # source-unreadable finding always shows).
    silenced = suppressed_lines(src) if findings and src.tree is not None else {}
    kept = sorted(fold([f for f in findings if not _is_silenced(f, silenced)]), key=location_order)
    return FileResult(kept, src.project.asked, cacheable=not crashed, problem=src.problem)


def lint_paths(
    paths: Iterable[str],
    checks: Sequence[registry.Pitfall],
    exclude: Iterable["str | Pattern"] = (),
    cwd: Optional[str] = None,
    jobs: Optional[int] = None,
    cache: Optional[LintCache] = None,
    progress: Optional[Callable[[int, int], None]] = None,
) -> LintResult:
    """Lint every Python file under `paths`; raises FileNotFoundError for a path that does not exist.

    Large runs are spread over `jobs` forked worker processes (default: the usable CPUs). With a `cache`,
    files whose cached result is still valid are not checked again, and the new results are saved to it.
    `progress(done, total)` is told how many of the files to check are done, as they complete.
    """
    collecting = gc.isenabled()
    gc.disable()  # a run builds many syntax trees and no reference cycles: the collector would only walk them
    try:
        return _lint_paths(paths, checks, exclude, cwd, jobs, cache, progress)
    finally:
        if collecting:
            gc.enable()


def _lint_paths(
    paths: Iterable[str],
    checks: Sequence[registry.Pitfall],
    exclude: Iterable["str | Pattern"],
    cwd: Optional[str],
    jobs: Optional[int],
    cache: Optional[LintCache],
    progress: Optional[Callable[[int, int], None]],
) -> LintResult:
    started = time.perf_counter()
    cwd = cwd or os.getcwd()
    files = [(path, display_path(path, cwd)) for path in discover(paths, exclude, cwd)]
    project = ProjectFacts()
    digests: dict[str, str] = {}
    if cache is not None:  # installed libraries' facts are kept next to the results, per distribution version
        program = project.program
        program.libraries = LibraryFacts(
            os.path.join(os.path.dirname(cache.path), "libraries"), library_fingerprint, program.library_folders()
        )
    if cache is not None:  # a run without a cache has no use for digests
        for path, _ in files:
            data_digest = cache.file_digest(path)
            if data_digest is not None:
                digests[path] = data_digest
    findings: list[Finding] = []
    unreadable: list[str] = []
    todo: list[tuple[str, str]] = []
    for path, display in files:
        cached = cache.lookup(path, digests[path], display, project) if cache and path in digests else None
        if cached is None:
            todo.append((path, display))
        else:
            findings.extend(cached.findings)
            if cached.problem is not None:
                unreadable.append(display)
    jobs = jobs or usable_cpus()
    if jobs > 1 and len(todo) >= _POOL_MIN_FILES and _can_fork():
        results = _lint_in_workers(todo, checks, project, jobs, progress)
    else:
        results = _lint_files(todo, checks, project, progress)
    for (path, display), result in zip(todo, results):
        findings.extend(result.findings)
        if result.problem is not None:
            unreadable.append(display)
        if cache and path in digests:
            cache.store(path, digests[path], result)
    if cache:
        cache.save()
    if project.program.libraries is not None:
        project.program.libraries.save()
    findings.sort(key=location_order)
    return LintResult(
        findings,
        [display for _, display in files],
        time.perf_counter() - started,
        checked=len(todo),
        unreadable=unreadable,
    )


_POOL_MIN_FILES = 200
_WORKER_STATE: dict = {}


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _can_fork() -> bool:
    import multiprocessing  # here, not at the top: a re-run served from the cache never needs it

    return "fork" in multiprocessing.get_all_start_methods()


def _lint_files(
    files: Sequence[tuple[str, str]],
    checks: Sequence[registry.Pitfall],
    project: ProjectFacts,
    progress: Optional[Callable[[int, int], None]] = None,
    root: Optional[str] = None,
) -> list[FileResult]:
    """Lint `files` in order; `root` is the project the caller's previous files were in (released once these
    leave it)."""
    results = []
    program = project.program
    detectors = _detectors(checks)
    try:
        with quiet_parsing():
            for path, display in files:
                abspath = os.path.abspath(path)
                here = program.root_of(abspath)
                if here != root:
                    if root is not None and not _nested(here, root) and not _nested(root, here):
                        program.release(root)  # files come folder by folder: the run has left that project for good
                    root = here
                program.checking(abspath)
                results.append(_check(read_source(path, display, project, abspath), detectors))
                if progress is not None:
                    progress(len(results), len(files))
    finally:
        program.checking(None)
    return results


def _nested(inner: str, outer: str) -> bool:
    """Whether folder `inner` lies inside folder `outer`."""
    return inner.startswith(os.path.join(outer, ""))


def _worker_lint(files: Sequence[tuple[str, str]]) -> list[FileResult]:
    project = _WORKER_STATE["project"]
    # A worker's slices come in file order: the project its previous slice ended in is released once this one
    # starts elsewhere, as a serial run does (else the last project of every slice stays in memory to the end).
    results = _lint_files(files, _WORKER_STATE["checks"], project, root=_WORKER_STATE.get("root"))
    if files:
        _WORKER_STATE["root"] = project.program.root_of(os.path.abspath(files[-1][0]))
    if project.program.libraries is not None:  # a worker's program is its own: it writes what it learnt
        project.program.libraries.save()
    return results


def _lint_in_workers(
    files: Sequence[tuple[str, str]],
    checks: Sequence[registry.Pitfall],
    project: ProjectFacts,
    jobs: int,
    progress: Optional[Callable[[int, int], None]] = None,
) -> list[FileResult]:
    """Forked workers inherit the checks and project facts; each lints a slice of the files (results in order)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    _WORKER_STATE.update(checks=list(checks), project=project)
    chunks = _chunks(files, project, max(16, len(files) // (jobs * 4)))
    try:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            results: list[FileResult] = []
            for part in pool.map(_worker_lint, chunks):
                results.extend(part)
                if progress is not None:
                    progress(len(results), len(files))
            return results
    finally:
        _WORKER_STATE.clear()


def _chunks(files: Sequence[tuple[str, str]], project: ProjectFacts, size: int) -> list[Sequence[tuple[str, str]]]:
    """Consecutive slices of about `size` files for the workers, cut where the files' project root changes when
    such a place lies between half and twice `size` from the slice's start: a worker parses whatever its files'
    cross-file questions need, so a project split between two workers is parsed by both."""
    roots = [project.program.root_of(os.path.abspath(path)) for path, _ in files]
    changes = [i for i in range(1, len(files)) if roots[i] != roots[i - 1]]  # where a project starts
    chunks, start = [], 0
    while len(files) - start > size:
        target = start + size
        at = bisect.bisect_left(changes, target)  # the project starts nearest `target`, before and from it
        near = [c for c in changes[max(at - 1, 0) : at + 1] if start + size // 2 < c <= start + 2 * size]
        end = min(near, key=lambda c: (abs(c - target), c)) if near else target
        chunks.append(files[start:end])
        start = end
    chunks.append(files[start:])
    return chunks


def location_order(f: Finding) -> tuple:
    loc = f.location or Location()
    return (loc.file or "", loc.line or 0, loc.column or 0, f.code)
