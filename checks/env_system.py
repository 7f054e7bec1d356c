"""Environment checks about the machine around torch: shadowing files, shared memory, threads,
OpenMP runtimes, free memory and disk, device-selection and determinism variables."""
from __future__ import annotations

import math
import os
import re
from typing import Iterator

from torchdoctor.env.facts import EnvFacts
from torchdoctor.env.shadowing import THIRD_PARTY
from torchdoctor.findings import Finding, Location, Severity
from torchdoctor.registry import Scope, check

from torchdoctor.units import byte_size

from ._envutil import GiB, has_nvidia

SHM_MIN = 1 * GiB
LOW_RAM = 1 * GiB
LOW_DISK = 2 * GiB
_VISIBLE_TOKEN = re.compile(r"^(\s*\d+\s*|GPU-[0-9a-fA-F-]+|MIG-[0-9a-zA-Z/-]+)$")  # CUDA skips blanks around indices only
_CUBLAS_OK = (":4096:8", ":16:8")


@check(code="TD108", name="module-shadowing", scope=Scope.ENV, severity="error",
       summary="A file or folder named like torch, numpy or a standard module hides the real one.")
def module_shadowing(facts: EnvFacts) -> Iterator[Finding]:
    for entry in facts.shadowing:
        what = ("the installed package" if entry.name in THIRD_PARTY
                else "the standard-library module that torch imports")
        kind = "folder" if os.path.basename(entry.path) == entry.name else "file"
        symptom = {
            "torch": "'ImportError: No module named torch._C' or "
                     "\"AttributeError: partially initialized module 'torch' has no attribute ...\"",
            "numpy": "\"AttributeError: module 'numpy' has no attribute ...\" and 'Failed to initialize NumPy'",
        }.get(entry.name, f"\"AttributeError: module '{entry.name}' has no attribute ...\" deep inside `import torch`")
        yield Finding(
            f"The {kind} {entry.path} shadows {what} `{entry.name}`: Python searches {entry.origin_dir} "
            f"({entry.via}) before site-packages, so `import {entry.name}` loads it instead, which shows up "
            f"as {symptom}.",
            fix=f"Rename {entry.path} (e.g. to my_{entry.name}{'.py' if kind == 'file' else ''}) and delete "
                f"{os.path.join(os.path.dirname(entry.path), '__pycache__')}"
                + (f", or take {entry.origin_dir} off PYTHONPATH." if entry.via == "PYTHONPATH" else "."),
            location=Location(file=entry.path),
        )


@check(code="TD109", name="cuda-visible-devices", scope=Scope.ENV, severity="warning",
       summary="CUDA_VISIBLE_DEVICES malformed or naming absent GPUs; GPU order differs from nvidia-smi's.")
def cuda_visible_devices(facts: EnvFacts) -> Iterator[Finding]:
    gpus = facts.nvidia.gpus
    value = facts.env_vars.get("CUDA_VISIBLE_DEVICES")
    if value is not None:
        tokens = value.split(",")
        if value.strip() in ("", "-1"):
            if gpus:
                yield Finding(
                    f"CUDA_VISIBLE_DEVICES={value!r} hides all {len(gpus)} GPU(s): torch.cuda.is_available() is False.",
                    fix="unset CUDA_VISIBLE_DEVICES (or list the GPUs to use, e.g. CUDA_VISIBLE_DEVICES=0,1)",
                    severity=Severity.INFO,
                )
        else:
            bad = next((t for t in tokens if not _VISIBLE_TOKEN.match(t)), None)
            stripped = [t.strip() for t in tokens]
            dupes = sorted({t for t in stripped if stripped.count(t) > 1})
            if bad is not None or dupes:
                reason = (f"CUDA stops reading at the invalid entry {bad!r}, so the GPUs after it are hidden"
                          if bad is not None else f"it lists {', '.join(dupes)} twice, which makes CUDA see no GPU at all")
                yield Finding(
                    f"CUDA_VISIBLE_DEVICES={value!r} is malformed: {reason}.",
                    fix="List GPU indices or full UUIDs (`nvidia-smi -L`), comma-separated, e.g. CUDA_VISIBLE_DEVICES=0,1",
                )
            elif gpus:
                uuids = {g.uuid for g in gpus if g.uuid}
                absent = [t for t in stripped if (t.isdigit() and int(t) >= len(gpus))
                          or (t.startswith("GPU-") and uuids and not any(u.startswith(t) for u in uuids))]
                if absent:
                    yield Finding(
                        f"CUDA_VISIBLE_DEVICES={value!r} names {', '.join(absent)}, but this machine has "
                        f"{len(gpus)} GPU(s) (0-{len(gpus) - 1}): CUDA stops at the first absent one.",
                        fix=f"Pick GPUs that exist: `nvidia-smi -L` lists them (indices 0-{len(gpus) - 1}).",
                    )
    models = {g.name for g in gpus}
    if len(models) > 1 and facts.env_vars.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        listing = ", ".join(f"{g.index}: {g.name}" for g in gpus)
        yield Finding(
            f"This machine mixes GPU models ({listing}) and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA numbers "
            "GPUs fastest-first, nvidia-smi by PCI bus, so cuda:0 and CUDA_VISIBLE_DEVICES=0 may not be "
            "nvidia-smi's GPU 0.",
            fix="export CUDA_DEVICE_ORDER=PCI_BUS_ID (before Python starts, or before CUDA is initialised)",
        )


@check(code="TD111", name="shm-too-small", scope=Scope.ENV, severity="warning",
       summary="/dev/shm is too small for DataLoader workers (Docker's default is 64 MiB).")
def shm_too_small(facts: EnvFacts) -> Iterator[Finding]:
    shm = facts.system.shm_total
    if shm is None or shm >= SHM_MIN:
        return
    yield Finding(
        f"/dev/shm is only {byte_size(shm)}: DataLoader workers pass batches through it and die with "
        "'RuntimeError: DataLoader worker (pid N) is killed by signal: Bus error', and NCCL fails with "
        "'No space left on device'.",
        fix="Give the container more shared memory: `docker run --shm-size=8g ...` (or `--ipc=host`); on "
            "Kubernetes mount an emptyDir with medium: Memory at /dev/shm. As a stop-gap: DataLoader(num_workers=0).",
        location=Location(file="/dev/shm"),
    )


def _usable_cpus(facts: EnvFacts) -> int | None:
    s = facts.system
    counts = [c for c in (s.cpu_logical, s.cpu_affinity) if c]
    if s.cgroup_cpu_limit:
        counts.append(max(1, math.ceil(s.cgroup_cpu_limit)))
    return min(counts) if counts else None


@check(code="TD112", name="thread-oversubscription", scope=Scope.ENV, severity="warning",
       summary="More compute threads than usable cores (threads x local processes), or OMP threads unset under torchrun.")
def thread_oversubscription(facts: EnvFacts) -> Iterator[Finding]:
    cpus = _usable_cpus(facts)
    env = facts.env_vars
    try:
        procs = max(1, int(env.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        procs = 1
    threads = facts.torch.num_threads
    if threads is None:
        try:
            threads = int(env["OMP_NUM_THREADS"])
        except (KeyError, ValueError):
            threads = None
    if cpus and threads and threads * procs > cpus:
        limit = f" (a container quota of {facts.system.cgroup_cpu_limit:g} CPUs)" if facts.system.cgroup_cpu_limit else ""
        per = max(1, cpus // procs)
        yield Finding(
            f"torch will run {threads} threads × {procs} local process(es) = {threads * procs} threads on "
            f"{cpus} usable CPU(s){limit}: threads fight for cores and CPU ops get slower, not faster.",
            fix=f"export OMP_NUM_THREADS={per} MKL_NUM_THREADS={per} (or torch.set_num_threads({per}) in each process)",
        )
    elif procs > 1 and "OMP_NUM_THREADS" not in env:
        yield Finding(
            f"{procs} local processes (LOCAL_WORLD_SIZE) and OMP_NUM_THREADS is unset: each process sizes its "
            "thread pool for the whole machine.",
            fix=f"export OMP_NUM_THREADS={max(1, (cpus or procs) // procs)} before launching",
        )


@check(code="TD113", name="duplicate-openmp", scope=Scope.ENV, severity="warning",
       summary="More than one OpenMP runtime is loaded ('OMP: Error #15').")
def duplicate_openmp(facts: EnvFacts) -> Iterator[Finding]:
    libs = facts.torch.openmp_runtimes
    families: dict[str, list[str]] = {}
    for path in libs:
        base = os.path.basename(path)
        family = "Intel libiomp5" if base.startswith("libiomp5") else "GNU libgomp" if base.startswith("libgomp") else "LLVM libomp"
        families.setdefault(family, []).append(path)
    if len(families) < 2 and len(families.get("Intel libiomp5", [])) < 2:
        return
    ok_var = " KMP_DUPLICATE_LIB_OK is set, which only hides the crash." if "KMP_DUPLICATE_LIB_OK" in facts.env_vars else ""
    yield Finding(
        f"`import torch` + `import numpy` load several OpenMP runtimes: {'; '.join(libs)}. Two runtimes "
        "oversubscribe threads, and two libiomp5 copies abort with 'OMP: Error #15: Initializing "
        f"libiomp5.so, but found libiomp5.so already initialized'.{ok_var}",
        fix="Install torch and numpy from one source (all pip, or all conda from one channel; conda: "
            "`conda install nomkl` for numpy) so that one OpenMP runtime is used.",
    )


@check(code="TD115", name="low-resources", scope=Scope.ENV, severity="warning",
       summary="Little free RAM, or little free disk where you run.")
def low_resources(facts: EnvFacts) -> Iterator[Finding]:
    s = facts.system
    if s.memory_available is not None and s.memory_total and (
            s.memory_available < LOW_RAM or s.memory_available < 0.05 * s.memory_total):
        yield Finding(
            f"Only {byte_size(s.memory_available)} of {byte_size(s.memory_total)} RAM is available: DataLoader workers and "
            "torch.load will be OOM-killed ('DataLoader worker ... is killed by signal: Killed').",
            fix="Stop other jobs (`ps aux --sort=-rss | head`), lower num_workers, or load checkpoints with mmap=True.",
        )
    if s.disk_free is not None and s.disk_total and (s.disk_free < LOW_DISK or s.disk_free < 0.02 * s.disk_total):
        yield Finding(
            f"Only {byte_size(s.disk_free)} free on the disk holding {s.disk_path}: torch.save of a checkpoint can fail "
            "half-way and leave a truncated file ('PytorchStreamReader failed reading zip archive').",
            fix="Free space (old checkpoints, ~/.cache/torch, ~/.cache/huggingface) or save checkpoints elsewhere.",
            location=Location(file=s.disk_path),
        )


@check(code="TD116", name="determinism-settings", scope=Scope.ENV, severity="info",
       summary="Settings that make GPU runs non-reproducible (CUBLAS_WORKSPACE_CONFIG and friends).")
def determinism_settings(facts: EnvFacts) -> Iterator[Finding]:
    value = facts.env_vars.get("CUBLAS_WORKSPACE_CONFIG")
    if value is not None and value not in _CUBLAS_OK:
        yield Finding(
            f"CUBLAS_WORKSPACE_CONFIG={value!r} is not one of {' or '.join(_CUBLAS_OK)}: with "
            "torch.use_deterministic_algorithms(True) every cuBLAS call raises 'Deterministic behavior was "
            "enabled ... you must set an environment variable ... CUBLAS_WORKSPACE_CONFIG=:4096:8'.",
            fix="export CUBLAS_WORKSPACE_CONFIG=:4096:8 (before the first matrix multiply)",
            severity=Severity.WARNING,
        )
    elif value is None and "PYTHONHASHSEED" in facts.env_vars and has_nvidia(facts) and facts.torch_cuda:
        yield Finding(
            "PYTHONHASHSEED is pinned, so you want reproducible runs, but CUBLAS_WORKSPACE_CONFIG is unset: "
            "cuBLAS results can differ run to run, and torch.use_deterministic_algorithms(True) raises on "
            "the first matrix multiply.",
            fix="export CUBLAS_WORKSPACE_CONFIG=:4096:8; then in Python: torch.manual_seed(s); "
                "torch.backends.cudnn.benchmark = False; torch.use_deterministic_algorithms(True)",
        )
