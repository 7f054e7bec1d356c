"""`torchdoctor env`: gather the facts (torch probed in a subprocess meanwhile) and run the env checks."""
from __future__ import annotations

import os
import platform
import threading
from typing import Optional, Sequence

from torchdoctor import registry
from torchdoctor.env.facts import EnvFacts, NvidiaFacts
from torchdoctor.env.nvidia import collect_nvidia
from torchdoctor.env.packages import collect_packages
from torchdoctor.env.probe import RunningProbe
from torchdoctor.env.shadowing import find_shadowing, installed_modules, search_dirs
from torchdoctor.env.system import collect_system, relevant_env
from torchdoctor.env.toolkit import collect_toolkit
from torchdoctor.report import Report

NVML_TIMEOUT_S = 15.0


def _nvidia_with_timeout(timeout: float) -> NvidiaFacts:
    """NVML in a daemon thread: a wedged driver must not hang the doctor."""
    box: list[NvidiaFacts] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
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


def collect_facts(probe_timeout: float = 60.0, cwd: Optional[str] = None) -> EnvFacts:
    """All env facts; the torch probe subprocess runs while the torch-free facts are gathered."""
    cwd = os.path.abspath(cwd or os.getcwd())
    probe = RunningProbe(probe_timeout, cwd=cwd)
    nvidia_box: list[NvidiaFacts] = []
    nvml = threading.Thread(target=lambda: nvidia_box.append(_nvidia_with_timeout(NVML_TIMEOUT_S)), daemon=True)
    nvml.start()
    packages = collect_packages()
    facts = EnvFacts(
        cwd=cwd,
        system=collect_system(cwd),
        env_vars=relevant_env(),
        packages=packages.versions,
        torch_requirements=packages.torch_requirements,
        numpy1_only=packages.numpy1_only,
        torch_dist_version=packages.versions.get("torch"),
        torch_dist_location=packages.torch_location,
        torch_dist_cuda=packages.torch_cuda,
        toolkit=collect_toolkit(),
    )
    facts.shadowing = find_shadowing(search_dirs(cwd), installed_modules(packages.torch_location))
    nvml.join(NVML_TIMEOUT_S + 1)
    facts.nvidia = nvidia_box[0] if nvidia_box else NvidiaFacts(unavailable_reason="NVML did not answer")
    facts.torch = probe.result()
    return facts


def diagnose_env(
    checks: Optional[Sequence[registry.CheckInfo]] = None,
    probe_timeout: float = 60.0,
    cwd: Optional[str] = None,
    facts: Optional[EnvFacts] = None,
) -> Report:
    """Examine this machine and return the report (facts and findings); `facts` skips collection."""
    facts = facts if facts is not None else collect_facts(probe_timeout, cwd)
    checks = registry.all_checks(registry.Scope.ENV) if checks is None else checks
    findings = registry.run_fact_checks(checks, registry.Scope.ENV, facts)
    return Report(scope="env", findings=findings, facts=facts.to_dict(), subject=platform.node() or "this machine")
