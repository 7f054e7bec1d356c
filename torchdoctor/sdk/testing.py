"""Run a pitfall's Bad/Good examples through its own detectors — the contract every pitfall keeps.

``run_example(pitfall, pitfall.bad, "source")`` returns that detector's findings for the example: the
contract test asserts the Bad example fires and the Good one stays quiet in every door that can see it
(`Example.runnable`). Plug-in authors can call it from their own tests the same way.

Checkpoint files are checked as ``check-ckpt --scan-values`` does, and compared with the example's `model`
when it binds an ``nn.Module`` (as ``check-ckpt --model`` does).
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

from torchdoctor.findings import Finding
from torchdoctor.pitfall import Example, Pitfall, PitfallError, Scope

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar", ".safetensors", ".pkl")


def run_example(pitfall: Pitfall, example: Example, scope: "Scope | str") -> list[Finding]:
    """The findings of `pitfall`'s `scope` detector on `example` (only this pitfall's, folded)."""
    scope = Scope(scope)
    if scope not in pitfall.detectors:
        raise PitfallError(f"pitfall {pitfall.name} has no {scope} detector")
    if not example.runnable(scope):
        raise PitfallError(f"pitfall {pitfall.name}: this example is not runnable in {scope}")
    runner = {Scope.SOURCE: _lint, Scope.RUNTIME: _watch, Scope.CHECKPOINT: _check_files}.get(scope)
    if runner is None:
        raise PitfallError(f"pitfall {pitfall.name}: {scope} examples can't run in one process; "
                           f"give Example(unseen={{'{scope}': why}})")
    return [f for f in runner(pitfall, example) if f.name == pitfall.name]


def _lint(pitfall: Pitfall, example: Example) -> list[Finding]:
    from torchdoctor.lint.runner import check_source, read_source

    setup, code = example.setup, example.code  # flush left already (Example cleans them)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "example.py"
        path.write_text(setup + "\n" + code, encoding="utf-8")
        return check_source(read_source(str(path), "example.py"), [pitfall])


def _watch(pitfall: Pitfall, example: Example) -> list[Finding]:
    from torchdoctor.watch.session import watch

    setup, code = example.setup, example.code  # flush left already (Example cleans them)
    namespace: dict[str, Any] = {"__name__": "__example__"}
    with _in_empty_folder(), _torch_switches_kept():
        exec(compile(setup, "<example setup>", "exec"), namespace)
        if "model" not in namespace:
            raise PitfallError(f"pitfall {pitfall.name}: a runtime example's setup must bind `model`")
        session = watch(namespace["model"], namespace.get("optimizer"), checks=[pitfall.name],
                        on_finding=lambda finding: None, report=False)
        with session:
            exec(compile(code, "<example>", "exec"), namespace)
    return session.findings


def _check_files(pitfall: Pitfall, example: Example) -> list[Finding]:
    from torchdoctor.ckpt.api import check_checkpoint

    setup, code = example.setup, example.code  # flush left already (Example cleans them)
    findings: list[Finding] = []
    namespace: dict[str, Any] = {"__name__": "__example__"}
    with _in_empty_folder() as folder:
        exec(compile(setup + "\n" + code, "<example>", "exec"), namespace)
        written = sorted(p for p in folder.rglob("*") if p.suffix in CHECKPOINT_SUFFIXES)
        if not written:
            raise PitfallError(f"pitfall {pitfall.name}: the checkpoint example wrote no checkpoint file")
        model = namespace.get("model")
        for path in written:
            findings += check_checkpoint(path, model if _is_module(model) else None, select=[pitfall.name],
                                         scan_values=True).findings
    return findings


def _is_module(value: Any) -> bool:
    """An `nn.Module` (what ``check-ckpt --model`` compares a checkpoint with)."""
    import torch

    return isinstance(value, torch.nn.Module)


@contextlib.contextmanager
def _in_empty_folder() -> Iterator[Path]:
    """Run an example in a fresh working folder, so files it writes go nowhere else."""
    old = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(old)


@contextlib.contextmanager
def _torch_switches_kept() -> Iterator[None]:
    """Undo the process-wide torch switches an example may flip (cuDNN modes, deterministic algorithms, the
    number of threads), so one example never changes how the next one, or the caller's own tests, run."""
    import torch

    cudnn = torch.backends.cudnn
    saved = (cudnn.benchmark, cudnn.deterministic, torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled())
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        cudnn.benchmark, cudnn.deterministic = saved[0], saved[1]
        torch.use_deterministic_algorithms(saved[2], warn_only=saved[3])
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
