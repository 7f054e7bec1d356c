"""Facts that need no torch: OS, CPU, memory, disks, /dev/shm, containers, environment variables."""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

import psutil

from torchdoctor.env.facts import SystemFacts

# Variables that change how torch, CUDA, NCCL and the thread pools behave.
ENV_PREFIXES = (
    "CUDA_",
    "NCCL_",
    "TORCH_",
    "PYTORCH_",
    "CUBLAS_",
    "CUDNN_",
    "NVIDIA_",
    "OMP_",
    "MKL_",
    "KMP_",
    "GOMP_",
    "TORCHELASTIC_",
    "HIP_",
    "ROCR_",
    "TRITON_",
)
ENV_NAMES = (
    "LOCAL_RANK",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OPENBLAS_NUM_THREADS",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "PYTHONPATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "XLA_FLAGS",
    "PYTHONHASHSEED",
    "PYTHONNOUSERSITE",
    "PYTHONUSERBASE",
    "CONDA_PREFIX",
    "TMPDIR",
    "XDG_CACHE_HOME",
)


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


UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a page-rounded 2**63-1


@dataclass
class CgroupLimits:
    """What a container's cgroup (v1 or v2) allows this process: psutil reports the host's totals."""

    cpus: Optional[float] = None
    memory_limit: Optional[int] = None
    memory_used: Optional[int] = None


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _chain(base: Path, rel: str) -> list[Path]:
    """The process's cgroup folder under `base` and every ancestor up to `base` (limits are hierarchical)."""
    parts = [p for p in rel.strip("/").split("/") if p]
    return [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def read_cgroup(root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Optional[str] = None) -> CgroupLimits:
    """CPU quota and memory limit/usage of this process's cgroup (`/proc/self/cgroup` says which), the
    tightest along its ancestors; v2 (`cpu.max`, `memory.max`) and v1 (`cpu.cfs_quota_us`,
    `memory.limit_in_bytes`)."""
    if proc_cgroup is None:
        proc_cgroup = _read(Path("/proc/self/cgroup")) or ""
    v1: dict[str, str] = {}
    v2 = "/"
    for line in proc_cgroup.splitlines():
        _, controllers, rel = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            v2 = rel
        for c in controllers.split(","):
            v1[c] = rel
    out = CgroupLimits()
    cpus: list[float] = []
    limits: list[int] = []
    for d in _chain(root, v2):
        cpu_max = (_read(d / "cpu.max") or "max").split()
        if cpu_max[0] != "max" and len(cpu_max) == 2 and cpu_max[0].isdigit() and cpu_max[1].isdigit():
            cpus.append(int(cpu_max[0]) / int(cpu_max[1]))
        mem = _read(d / "memory.max")
        if mem and mem.isdigit():
            limits.append(int(mem))
        if out.memory_used is None and (used := _read(d / "memory.current")) and used.isdigit():
            out.memory_used = int(used)
    for ctl in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        for d in _chain(root / ctl, v1.get("cpu", "/")):
            quota, period = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
            if quota and period and quota.isdigit() and period.isdigit() and int(period) > 0:
                cpus.append(int(quota) / int(period))
    for d in _chain(root / "memory", v1.get("memory", "/")):
        mem = _read(d / "memory.limit_in_bytes")
        if mem and mem.isdigit() and int(mem) < UNLIMITED:
            limits.append(int(mem))
        if out.memory_used is None and (used := _read(d / "memory.usage_in_bytes")) and used.isdigit():
            out.memory_used = int(used)
    out.cpus = min(cpus) if cpus else None
    out.memory_limit = min(limits) if limits else None
    if out.memory_limit is None:
        out.memory_used = None
    return out


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> Optional[float]:
    """CPUs a container quota allows (cgroup v2 cpu.max or v1 cfs quota), None when unlimited."""
    return read_cgroup(root, "").cpus


def open_files_limit() -> "tuple[Optional[int], Optional[int]]":
    """The soft and hard limit on open files (`ulimit -n`), None where unknown or unlimited."""
    try:
        import resource
    except ImportError:  # Windows
        return None, None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (None if soft == resource.RLIM_INFINITY else soft), (None if hard == resource.RLIM_INFINITY else hard)


def _existing(path: str) -> str:
    """`path`, or its nearest existing parent (a cache folder not created yet lands on that disk)."""
    p = Path(path).expanduser()
    while not p.exists() and p.parent != p:
        p = p.parent
    return str(p)


def cache_dirs(environ: Mapping[str, str]) -> dict[str, str]:
    """Where temporary files, torch hub/checkpoint downloads and Hugging Face downloads go."""
    import tempfile

    xdg = environ.get("XDG_CACHE_HOME") or "~/.cache"
    dirs = {
        "TMPDIR": tempfile.gettempdir(),
        "TORCH_HOME": environ.get("TORCH_HOME") or os.path.join(xdg, "torch"),
        "HF_HOME": environ.get("HF_HOME") or os.path.join(xdg, "huggingface"),
    }
    return {name: os.path.expanduser(path) for name, path in dirs.items()}


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
        container=container_kind(),
        disk_path=cwd,
    )
    cgroup = read_cgroup()
    facts.cgroup_cpu_limit, facts.cgroup_memory_limit = cgroup.cpus, cgroup.memory_limit
    facts.cgroup_memory_used = cgroup.memory_used
    facts.open_files_soft, facts.open_files_hard = open_files_limit()
    for name, path in cache_dirs(os.environ).items():
        try:
            facts.cache_free[name] = (path, psutil.disk_usage(_existing(path)).free)
        except OSError:
            pass
    if hasattr(os, "sched_getaffinity"):
        facts.cpu_affinity = len(os.sched_getaffinity(0))
    if hasattr(os, "getloadavg"):
        facts.load_average = os.getloadavg()[0]
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
            facts.shm_free = st.f_bavail * st.f_frsize
        except OSError:
            pass
    return facts
