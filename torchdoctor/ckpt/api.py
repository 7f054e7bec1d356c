"""The checkpoint front door shared by the CLI and the Python API: read, compare, scan, check, fix."""

from __future__ import annotations

import contextlib
import copy
import gc
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

from torchdoctor import registry, selection
from torchdoctor.ckpt.errors import CheckpointError
from torchdoctor.ckpt.info import UNREADABLE, CheckpointInfo, ModelKeys
from torchdoctor.findings import Finding, Location, fold
from torchdoctor.report import Report
from torchdoctor.settings import load_settings

PathLike = Union[str, "os.PathLike[str]"]
UNREADABLE_CODE = "TD210"  # checkpoint-unreadable: the one check that looks at a file that could not be read


@dataclass
class CheckpointReport(Report):
    """A `Report` whose facts are `{"checkpoints": [structure, ...]}`; `infos` keeps the parsed files."""

    infos: list[CheckpointInfo] = field(default_factory=list)

    @property
    def structure(self) -> dict[str, Any]:
        """The structure report of the first (usually only) checkpoint."""
        return self.facts["checkpoints"][0]


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while reading: a file of 10^5 tensors allocates millions of acyclic
    placeholders, and the collector's repeated passes over them cost more than the reading itself.

    On the way out the survivors are frozen before the collector is back on and then handed to the oldest
    generation, so its first pass does not walk them all again (they hold no cycles worth finding).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.freeze()
            gc.enable()
            gc.unfreeze()


def diagnose_checkpoints(
    paths: Sequence[PathLike],
    checks: Iterable[registry.Pitfall],
    *,
    model: Any = None,
    scan_values: bool = False,
    fix: Optional[PathLike] = None,
) -> CheckpointReport:
    """Read every file (folders: the checkpoint files under them) and run the checks.

    A file that cannot be read as a checkpoint (truncated, corrupt, not a checkpoint at all) is reported as
    checkpoint-unreadable and never hides the others; `CheckpointError` is raised only for a path that does
    not exist or a folder without checkpoint files. `model` is an `nn.Module` or a spec such as "train.py:Net" (built
    here; then compared with the files);
    `fix` writes a weights-only, CPU, prefix-free copy of the one file there. Raises `ValueError` for a bad
    model spec, a refused fix, or `fix` with several files.
    """
    from torchdoctor.ckpt.paths import checkpoint_files

    files = checkpoint_files(paths)
    if fix is not None and len(files) != 1:
        raise ValueError(f"a fixed copy is written for exactly one checkpoint, not {len(files)}")
    keys: Optional[ModelKeys] = None
    spec = model if isinstance(model, str) else ""
    if model is not None:
        from torchdoctor.ckpt.model import load_model, model_keys

        model = load_model(spec) if spec else model
        keys = model_keys(model, spec)
    checks = list(checks)
    infos: list[CheckpointInfo] = []
    findings: list[Finding] = []
    with _gc_paused():
        for path, problem in files:
            try:
                info = _read(path, problem)
            except Exception as exc:  # a torchdoctor bug on this file: said (exit 2), and the others still checked
                if os.environ.get("TORCHDOCTOR_DEBUG"):
                    raise
                infos.append(_stand_in(path, f"torchdoctor failed to read it: {type(exc).__name__}: {exc}"))
                failed = registry.internal_error(registry.get(UNREADABLE_CODE), exc)
                failed.location = Location(file=path)
                findings.append(failed)
                continue
            if info.format == UNREADABLE:  # nothing else to look at: only checkpoint-unreadable says so
                infos.append(info)
                findings.extend(
                    registry.run_fact_checks(
                        [c for c in checks if c.code == UNREADABLE_CODE], registry.Scope.CHECKPOINT, info
                    )
                )
                continue
            info.model = keys
            if scan_values:
                from torchdoctor.ckpt.values import scan_values as scan

                scan(info)
            infos.append(info)
            findings.extend(registry.run_fact_checks(checks, registry.Scope.CHECKPOINT, info))
        facts = {"checkpoints": [i.facts() for i in infos]}
    subject = files[0][0] if len(files) == 1 else f"{len(files)} checkpoints"
    report = CheckpointReport(
        scope=str(registry.Scope.CHECKPOINT), findings=fold(findings), facts=facts, subject=subject, infos=infos
    )
    if fix is not None:
        from torchdoctor.ckpt.fix import write_fixed

        if infos[0].format == UNREADABLE:
            raise ValueError(f"refusing to --fix {infos[0].path}: {infos[0].problems[0]}")
        target = copy.deepcopy(model) if model is not None and not spec else model  # never load into the caller's
        report.facts["checkpoints"][0]["fix"] = write_fixed(infos[0], os.fspath(fix), target)
    return report


def _read(path: str, problem: Optional[str]) -> CheckpointInfo:
    """The file read without executing it, or a stand-in of format UNREADABLE that says why it can't be."""
    from torchdoctor.ckpt import read_checkpoint

    if problem is None:
        try:
            return read_checkpoint(path)
        except CheckpointError as exc:
            problem = str(exc).removeprefix(f"{path}: ")
    return _stand_in(path, problem)


def _stand_in(path: str, problem: str) -> CheckpointInfo:
    """What is known of a file that could not be read: its path, size, and why."""
    from torchdoctor.ckpt.reader import Archive
    from torchdoctor.ckpt.structure import analyze

    try:
        size = os.path.getsize(path)
    except OSError:
        size = 0
    return analyze(Archive(path, UNREADABLE, size, problems=[problem]))


def check_checkpoint(
    path: PathLike,
    model: Any = None,
    *,
    select: Optional[Iterable[str]] = None,
    ignore: Optional[Iterable[str]] = None,
    scan_values: bool = False,
    fix: Optional[PathLike] = None,
) -> CheckpointReport:
    """Diagnose one checkpoint without executing it; returns the findings and the structure (`.structure`).

    `model` is an `nn.Module` or a spec such as "train.py:Net" (then compared with the file); `fix`
    writes a weights-only, CPU, prefix-free copy there (refused for unsafe files). `select`/`ignore` name
    checks (names or codes) on top of `[tool.torchdoctor]` found from the file's folder and the
    TORCHDOCTOR_* variables (see `torchdoctor.settings`); the report's exit code follows their fail-on.
    A file that is not a readable checkpoint gets a checkpoint-unreadable finding. Raises `CheckpointError`
    when the path does not exist (or is a folder without checkpoint files), `SettingsError`/`SelectionError` for a bad
    setting or check name, and `ValueError` for a bad model spec or fix.
    """
    settings = load_settings(path, select=select, ignore=ignore)
    checks = selection.select_checks(selection.CHECKPOINT, settings)
    report = diagnose_checkpoints([path], checks, model=model, scan_values=scan_values, fix=fix)
    report.fail_on = settings.fail_on
    return report


__all__ = ["CheckpointError", "CheckpointReport", "check_checkpoint", "diagnose_checkpoints"]
