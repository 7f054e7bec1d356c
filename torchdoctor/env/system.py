"""Facts that need no torch: OS, CPU, memory, disks, /dev/shm, containers, environment variables."""
from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Mapping, Optional

import psutil

from torchdoctor.env.facts import SystemFacts

# Variables that change how torch, CUDA, NCCL and the thread pools behave.
ENV_PREFIXES = ("CUDA_", "NCCL_", "TORCH_", "PYTORCH_", "CUBLAS_", "CUDNN_", "NVIDIA_", "OMP_", "MKL_",
                "KMP_", "GOMP_", "TORCHELASTIC_", "HIP_", "ROCR_", "TRITON_")
ENV_NAMES = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "OPENBLAS_NUM_THREADS", "LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH", "CUDA_HOME",
             "CUDA_PATH", "XLA_FLAGS", "PYTHONHASHSEED")


def relevant_env(environ: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """The environment variables that matter to PyTorch, sorted by name."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in sorted(environ) if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}


def _cpu_model() -> Optional[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> Optional[float]:
    """CPUs a container quota allows (cgroup v2 cpu.max or v1 cfs quota), None when unlimited."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):
        return None


def container_kind() -> Optional[str]:
    """Whether we run in a container, which changes the advice (shm size, PID namespaces)."""
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return "kubernetes"
    if os.path.exists("/.dockerenv"):
        return "docker"
    try:
        cgroup = Path("/proc/1/cgroup").read_text(errors="replace")
    except OSError:
        return None
    if "docker" in cgroup or "containerd" in cgroup:
        return "docker"
    if "kubepods" in cgroup:
        return "kubernetes"
    return None


def collect_system(cwd: str) -> SystemFacts:
    """Python, platform, CPU, memory, disk at `cwd`, and /dev/shm."""
    facts = SystemFacts(
        python=platform.python_version(),
        python_executable=sys.executable,
        platform=platform.platform(),
        machine=platform.machine(),
        cpu_model=_cpu_model(),
        cpu_logical=psutil.cpu_count(logical=True),
        cpu_physical=psutil.cpu_count(logical=False),
        cgroup_cpu_limit=cgroup_cpu_limit(),
        container=container_kind(),
        disk_path=cwd,
    )
    if hasattr(os, "sched_getaffinity"):
        facts.cpu_affinity = len(os.sched_getaffinity(0))
    mem = psutil.virtual_memory()
    facts.memory_total, facts.memory_available = mem.total, mem.available
    try:
        disk = psutil.disk_usage(cwd)
        facts.disk_total, facts.disk_free = disk.total, disk.free
    except OSError:
        pass
    if os.path.isdir("/dev/shm"):
        try:
            st = os.statvfs("/dev/shm")
            facts.shm_total = st.f_blocks * st.f_frsize
        except OSError:
            pass
    return facts
