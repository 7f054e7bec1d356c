"""The checkpoint front door shared by the CLI and the Python API: read, compare, scan, check, fix."""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence, Union

from torchdoctor import registry
from torchdoctor.ckpt.errors import CheckpointError
from torchdoctor.ckpt.info import CheckpointInfo, ModelKeys
from torchdoctor.findings import Finding, fold
from torchdoctor.report import Report

PathLike = Union[str, "os.PathLike[str]"]


@dataclass
class CheckpointReport(Report):
    """A `Report` whose facts are `{"checkpoints": [structure, ...]}`; `infos` keeps the parsed files."""

    infos: list[CheckpointInfo] = field(default_factory=list)

    @property
    def structure(self) -> dict[str, Any]:
        """The structure report of the first (usually only) checkpoint."""
        return self.facts["checkpoints"][0]


def diagnose_checkpoints(
    paths: Sequence[PathLike],
    checks: Iterable[registry.Pitfall],
    *,
    model_keys: Optional[ModelKeys] = None,
    scan_values: bool = False,
) -> CheckpointReport:
    """Read every file (raising `CheckpointError` for one that is not a checkpoint) and run the checks."""
    from torchdoctor.ckpt import read_checkpoint

    checks = list(checks)
    infos: list[CheckpointInfo] = []
    findings: list[Finding] = []
    for path in paths:
        info = read_checkpoint(os.fspath(path))
        info.model = model_keys
        if scan_values:
            from torchdoctor.ckpt.values import scan_values as scan

            scan(info)
        infos.append(info)
        findings.extend(registry.run_fact_checks(checks, registry.Scope.CHECKPOINT, info))
    subject = os.fspath(paths[0]) if len(paths) == 1 else f"{len(paths)} checkpoints"
    return CheckpointReport(scope=str(registry.Scope.CHECKPOINT), findings=fold(findings),
                            facts={"checkpoints": [i.facts() for i in infos]}, subject=subject, infos=infos)


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
    writes a weights-only, CPU, prefix-free copy there (refused for unsafe files). Raises
    `CheckpointError` when the file is not a checkpoint and `ValueError` for a bad model spec or fix.
    """
    from torchdoctor.ckpt.model import load_model, model_keys

    if isinstance(model, str):
        model = load_model(model)
    keys = model_keys(model) if model is not None else None
    checks = registry.select(registry.Scope.CHECKPOINT, select, ignore)
    report = diagnose_checkpoints([path], checks, model_keys=keys, scan_values=scan_values)
    if fix is not None:
        from torchdoctor.ckpt.fix import write_fixed

        actions = write_fixed(report.infos[0], os.fspath(fix), copy.deepcopy(model) if model is not None else None)
        report.facts["checkpoints"][0]["fix"] = actions
    return report


__all__ = ["CheckpointError", "CheckpointReport", "check_checkpoint", "diagnose_checkpoints"]
