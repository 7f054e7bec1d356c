"""`torchdoctor check-ckpt FILE...`: explain checkpoints without executing them."""

from __future__ import annotations

from typing import Any, Optional

import click

from torchdoctor import selection
from torchdoctor.cli.options import InputError, checks_for, emit, report_options, settings_for
from torchdoctor.report import Report


@click.command("check-ckpt")
@report_options
@click.argument("files", nargs=-1, required=True, metavar="PATH [PATH...]")
@click.option(
    "--model",
    "model_spec",
    metavar="SPEC",
    default=None,
    help="Compare with a model: path/to/file.py:factory or package.module:factory (imports torch).",
)
@click.option(
    "--fix",
    "fix_out",
    metavar="OUT",
    default=None,
    help="Write a weights-only, CPU, prefix-free copy to OUT: a training checkpoint keeps its other "
    "entries, otherwise the state dict is extracted (imports torch; unsafe files refused).",
)
@click.option("--scan-values", is_flag=True, help="Stream the tensor bytes to look for NaN/Inf (bounded memory).")
@click.option(
    "-q",
    "--quiet",
    is_flag=True,
    help="Console report without the structure of each file: only the findings and the summary.",
)
def check_ckpt(
    fmt: str,
    select: tuple[str, ...],
    ignore: tuple[str, ...],
    fail_on: Optional[str],
    files: tuple[str, ...],
    model_spec: Optional[str],
    fix_out: Optional[str],
    scan_values: bool,
    quiet: bool,
) -> None:
    """Explain checkpoints without executing them: structure, safety, keys, devices, size.

    Each PATH is a checkpoint file or a folder, searched recursively for checkpoint files (*.pt, *.pth,
    *.bin, *.ckpt, *.safetensors, *.pkl, *.pickle, *.pth.tar). A file that cannot be read is reported
    (checkpoint-unreadable) and the others are still checked.
    """
    from torchdoctor.ckpt.api import diagnose_checkpoints

    settings = settings_for(files, select, ignore, fail_on)
    checks = checks_for(selection.CHECKPOINT, settings)
    try:
        report = diagnose_checkpoints(files, checks, model=model_spec, fix=fix_out, scan_values=scan_values)
    except ValueError as exc:  # CheckpointError, a bad --model spec, a refused --fix, --fix with 2 FILEs
        raise InputError(str(exc)) from None
    emit(report, fmt, settings.fail_on, None if quiet else _facts_view, lambda r, f: _plain(r, f, quiet))


def _facts_view(facts: dict[str, Any]) -> Any:
    """The console structure view (rich is imported only when the console report is printed)."""
    from torchdoctor.ckpt.view import facts_view

    return facts_view(facts)


def _plain(report: Report, fail_on: str, quiet: bool) -> Optional[list[str]]:
    """The console report's lines off a terminal, without rich (None: rich prints it)."""
    from torchdoctor.ckpt.view import plain_lines
    from torchdoctor.plainreport import report_lines

    facts = None if quiet else plain_lines(report.facts)
    if facts is None and not quiet:
        return None
    return report_lines(report, fail_on, facts)
