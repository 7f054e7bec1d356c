"""`torchdoctor env`: gather the facts (torch probed in a subprocess meanwhile) and run the env checks."""

from __future__ import annotations

import ast
import os
import platform
import subprocess
import sys
import threading
from typing import Any, Callable, Optional, Sequence

from torchdoctor import registry
from torchdoctor.env.facts import EnvFacts, NvidiaFacts
from torchdoctor.env.probe import RunningProbe, adopt_early
from torchdoctor.report import Report
from torchdoctor.settings import DEFAULT_FAIL_ON, load_settings

# The collectors (psutil, packaging, NVML bindings) are imported after the probe has been started: the
# probe's `import torch` is the critical path of `torchdoctor env`.

NVML_TIMEOUT_S = 15.0


def _nvidia_with_timeout(timeout: float) -> NvidiaFacts:
    """NVML in a daemon thread: a wedged driver must not hang the doctor."""
    box: list[NvidiaFacts] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            from torchdoctor.env.nvidia import collect_nvidia

            box.append(collect_nvidia())
        except Exception as exc:  # NVML bindings raising something unexpected
            errors.append(exc)

    thread = threading.Thread(target=run, name="torchdoctor-nvml", daemon=True)
    thread.start()
    thread.join(timeout)
    if box:
        return box[0]
    if errors:
        return NvidiaFacts(unavailable_reason=f"NVML failed: {type(errors[0]).__name__}: {errors[0]}")
    return NvidiaFacts(unavailable_reason=f"NVML did not answer within {timeout:g} s (is the driver wedged?)")


class FactCollection:
    """Collects the env facts: the torch probe subprocess and NVML start at construction and run while
    the torch-free facts are gathered in `finish()`. As a context manager it kills a probe left running
    when the body fails (e.g. a bad --select)."""

    def __init__(
        self,
        probe_timeout: float = 60.0,
        cwd: Optional[str] = None,
        exchange_timeout: Optional[float] = None,
        python: Optional[str] = None,
        environ: Optional[dict[str, str]] = None,
    ) -> None:
        self.cwd = os.path.abspath(cwd or os.getcwd())
        self.exchange_timeout = exchange_timeout
        self.python, self.environ = python, environ  # another interpreter or environment than this process's
        self.probe = (
            None if python or environ is not None else adopt_early(probe_timeout, self.cwd, exchange_timeout)
        ) or RunningProbe(probe_timeout, cwd=self.cwd, exchange_timeout=exchange_timeout, python=python, env=environ)
        self._nvidia: list[NvidiaFacts] = []
        self._nvml = threading.Thread(
            target=lambda: self._nvidia.append(_nvidia_with_timeout(NVML_TIMEOUT_S)),
            name="torchdoctor-nvml-wait",
            daemon=True,
        )
        self._nvml.start()

    def __enter__(self) -> "FactCollection":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.probe.proc.poll() is None:
            self.probe.proc.kill()
            self.probe.proc.wait()

    def finish(self, progress: Callable[[str], None] = lambda step: None) -> EnvFacts:
        """Gather the torch-free facts, then wait for NVML and the probe; `progress` hears each step."""
        from torchdoctor.env.libraries import damaged_torch_files, library_copies
        from torchdoctor.env.packages import collect_packages
        from torchdoctor.env.shadowing import find_shadowing, installed_modules, search_dirs
        from torchdoctor.env.system import collect_system, relevant_env
        from torchdoctor.env.toolkit import collect_toolkit

        environ = dict(os.environ) if self.environ is None else self.environ
        progress("reading installed packages (metadata, requirements)")
        packages = collect_packages(self._search_path() if self.python or self.environ is not None else None)
        progress("reading the OS, CPU, memory, disks, /dev/shm, container limits")
        facts = EnvFacts(
            cwd=self.cwd,
            system=collect_system(self.cwd),
            env_vars=relevant_env(environ),
            packages=packages.versions,
            torch_requirements=packages.torch_requirements,
            numpy_requirements=packages.numpy_requirements,
            unmet_requirements=packages.unmet,
            torch_dist_version=packages.versions.get("torch"),
            torch_dist_location=packages.torch_location,
            torch_dist_cuda=packages.torch_cuda,
            torch_dist_editable=packages.torch_editable,
            torch_dist_files_missing=packages.torch_files_missing,
            torch_dist_requirements=packages.torch_requires,
            libraries=library_copies(environ, packages.torch_location),
            torch_damaged_files=damaged_torch_files(packages.torch_location),
            toolkit=collect_toolkit(),
            shadowing=find_shadowing(search_dirs(self.cwd, environ), installed_modules(packages.torch_location)),
        )
        if self.python:
            facts.system.python_executable = self.python
        progress("asking the NVIDIA driver (NVML) about GPUs")
        self._nvml.join(NVML_TIMEOUT_S + 1)
        facts.nvidia = self._nvidia[0] if self._nvidia else NvidiaFacts(unavailable_reason="NVML did not answer")
        progress("importing torch in a subprocess (as your scripts would)")
        facts.torch = self.probe.result()
        if not facts.torch.ok and not facts.torch.limits:  # it died before saying: it had this process's limits
            from torchdoctor.env.torch_probe import limits

            facts.torch.limits = limits()
        return facts

    def _search_path(self) -> list[str]:
        """The sys.path of the interpreter and environment examined (where its packages' metadata lives)."""
        out = subprocess.run(
            [self.python or sys.executable, "-c", "import sys; print(repr(sys.path))"],
            capture_output=True,
            text=True,
            env=self.environ,
            cwd=self.cwd,
            timeout=60,
        )
        return [p for p in ast.literal_eval(out.stdout.strip() or "[]") if p]

    def exchange(self, payload: dict[str, Any]) -> Optional[dict[str, Any]]:
        """Under torchrun: send this rank's summary; rank 0 gets every rank's (see `RunningProbe.exchange`)."""
        assert self.exchange_timeout is not None, "FactCollection was not started for an exchange"
        return self.probe.exchange(payload, self.exchange_timeout)


def collect_facts(probe_timeout: float = 60.0, cwd: Optional[str] = None) -> EnvFacts:
    """All env facts (see `FactCollection`)."""
    with FactCollection(probe_timeout, cwd) as collection:
        return collection.finish()


def diagnose_env(
    checks: Optional[Sequence[registry.Pitfall]] = None,
    probe_timeout: float = 60.0,
    cwd: Optional[str] = None,
    facts: Optional[EnvFacts] = None,
) -> Report:
    """Examine this machine and return the report (facts and findings); `facts` skips collection.

    Without `checks`, the project's settings choose them and the report's fail-on (`[tool.torchdoctor]`
    found from `cwd`, and the TORCHDOCTOR_* variables; see `torchdoctor.settings`).
    """
    fail_on = DEFAULT_FAIL_ON
    if checks is None:
        from torchdoctor.selection import ENV, select_checks

        settings = load_settings(cwd)
        checks, fail_on = select_checks(ENV, settings), settings.fail_on
    facts = facts if facts is not None else collect_facts(probe_timeout, cwd)
    findings = registry.run_fact_checks(checks, registry.Scope.ENV, facts)
    return Report(
        scope="env",
        findings=findings,
        facts=facts.to_dict(),
        subject=platform.node() or "this machine",
        fail_on=fail_on,
    )
