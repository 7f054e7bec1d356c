"""The logic behind `torchdoctor check-ckpt`: only `--model` and `--fix` import torch."""
from __future__ import annotations

from typing import Any, Optional, Sequence

from torchdoctor import registry
from torchdoctor.ckpt.api import CheckpointReport, diagnose_checkpoints


def facts_view(facts: dict[str, Any]) -> Any:
    """The console structure view, imported only when the console report is printed."""
    from torchdoctor.ckpt.view import facts_view as view

    return view(facts)


def run_check_ckpt(
    files: Sequence[str],
    checks: list[registry.Pitfall],
    *,
    model_spec: Optional[str] = None,
    fix_out: Optional[str] = None,
    scan_values: bool = False,
) -> CheckpointReport:
    """Build the report for FILEs; raises ValueError subclasses (one-line messages) for bad input."""
    model = keys = None
    if fix_out is not None and len(files) != 1:
        raise ValueError("--fix takes exactly one FILE")
    if model_spec is not None:
        from torchdoctor.ckpt.model import load_model, model_keys

        model = load_model(model_spec)
        keys = model_keys(model, model_spec)
    report = diagnose_checkpoints(files, checks, model_keys=keys, scan_values=scan_values)
    if fix_out is not None:
        from torchdoctor.ckpt.fix import write_fixed

        report.facts["checkpoints"][0]["fix"] = write_fixed(report.infos[0], fix_out, model)
    return report
