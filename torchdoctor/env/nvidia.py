"""NVIDIA driver and GPU facts from NVML (`nvidia-ml-py`), without initialising CUDA.

Every NVML query is optional: a GPU that does not support one leaves that fact as None. Without NVML
(no driver, a CPU machine, macOS) `unavailable_reason` says why and nothing else is filled in.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Optional, TypeVar

import psutil

from torchdoctor.env.facts import GpuFacts, GpuProcess, NvidiaFacts
from torchdoctor.env.system import container_kind

T = TypeVar("T")

# Clock-event reasons that mean the GPU is slowed down against the user's will (idle and
# application-clock settings are normal).
_SLOWDOWNS = {
    "nvmlClocksThrottleReasonHwSlowdown": "hardware slowdown",
    "nvmlClocksThrottleReasonHwThermalSlowdown": "hardware thermal slowdown",
    "nvmlClocksThrottleReasonHwPowerBrakeSlowdown": "power brake slowdown (external power supply)",
    "nvmlClocksThrottleReasonSwThermalSlowdown": "software thermal slowdown",
}  # the software power cap is left out: a GPU under full load normally runs at its power limit


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _try(fn: Callable[[], T]) -> Optional[T]:
    import pynvml

    try:
        return fn()
    except (pynvml.NVMLError, AttributeError, TypeError, ValueError):
        return None


def describe_process(pid: int, used_bytes: Optional[int], same_pid_namespace: bool) -> GpuProcess:
    """What the OS knows about a PID that NVML reports (alive, zombie, user, command, parent)."""
    proc = GpuProcess(pid=pid, used_bytes=used_bytes)
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            proc.status = p.status()
            proc.alive = proc.status != psutil.STATUS_ZOMBIE
            proc.parent_pid = p.ppid()
            proc.orphaned = _orphaned(pid)
            proc.user = _try_psutil(p.username)
            cmd = _try_psutil(p.cmdline)
            proc.command = " ".join(cmd) if cmd else _try_psutil(p.name)
    except psutil.NoSuchProcess:
        # In a container without --pid=host NVML reports host PIDs we cannot see: don't call them dead.
        proc.alive = False if same_pid_namespace else None
    except psutil.AccessDenied:
        proc.alive = True
    return proc


def _orphaned(pid: int) -> bool:
    """The leader of its process group is gone: a DataLoader worker or DDP rank whose main process or
    launcher died (it was re-parented to init or a subreaper). A `nohup` job leads its own group."""
    try:
        group = os.getpgid(pid)
    except OSError:
        return False
    return group != pid and not psutil.pid_exists(group)


def _try_psutil(fn: Callable[[], T]) -> Optional[T]:
    try:
        return fn()
    except (psutil.AccessDenied, psutil.ZombieProcess, psutil.NoSuchProcess):
        return None


def same_pid_namespace() -> bool:
    """True when our PIDs are the host's, so an NVML PID missing from /proc really is gone."""
    if container_kind() is None:
        return True
    try:  # a container started with --pid=host sees the host's init as PID 1
        return open("/proc/1/comm").read().strip() in ("systemd", "init")
    except OSError:
        return False


def _gpu(pynvml: Any, index: int, host_pids: bool) -> GpuFacts:
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    gpu = GpuFacts(index=index, name=_text(_try(lambda: pynvml.nvmlDeviceGetName(h)) or ""))
    gpu.uuid = _try(lambda: _text(pynvml.nvmlDeviceGetUUID(h)))
    gpu.pci_bus_id = _try(lambda: _text(pynvml.nvmlDeviceGetPciInfo(h).busId))
    cc = _try(lambda: pynvml.nvmlDeviceGetCudaComputeCapability(h))
    gpu.capability = (int(cc[0]), int(cc[1])) if cc else None
    # v2 counts the driver's reserved memory apart from "used", as nvidia-smi does (v1: 480 MiB "used" on an idle H100)
    mem = _try(lambda: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)) or _try(
        lambda: pynvml.nvmlDeviceGetMemoryInfo(h)
    )
    if mem is not None:
        gpu.memory_total, gpu.memory_used = int(mem.total), int(mem.used)
    util = _try(lambda: pynvml.nvmlDeviceGetUtilizationRates(h))
    gpu.utilization = int(util.gpu) if util is not None else None
    gpu.temperature = _try(lambda: int(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)))
    power = _try(lambda: pynvml.nvmlDeviceGetPowerUsage(h))
    gpu.power_watts = power / 1000 if power is not None else None
    limit = _try(lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h))
    gpu.power_limit_watts = limit / 1000 if limit is not None else None
    reasons = _try(lambda: pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))
    if reasons:
        gpu.throttle_reasons = [label for attr, label in _SLOWDOWNS.items() if reasons & getattr(pynvml, attr, 0)]
    ecc = _try(lambda: pynvml.nvmlDeviceGetEccMode(h))
    gpu.ecc_enabled = bool(ecc[0]) if ecc else None
    if gpu.ecc_enabled:
        gpu.ecc_uncorrected = _try(
            lambda: int(
                pynvml.nvmlDeviceGetTotalEccErrors(
                    h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
                )
            )
        )
    persistence = _try(lambda: pynvml.nvmlDeviceGetPersistenceMode(h))
    gpu.persistence_mode = bool(persistence) if persistence is not None else None
    procs: dict[int, Optional[int]] = {}
    for query in (pynvml.nvmlDeviceGetComputeRunningProcesses, pynvml.nvmlDeviceGetGraphicsRunningProcesses):
        for p in _try(functools.partial(query, h)) or []:
            used = getattr(p, "usedGpuMemory", None)
            procs[int(p.pid)] = int(used) if isinstance(used, int) else procs.get(int(p.pid))
    gpu.processes = [describe_process(pid, used, host_pids) for pid, used in sorted(procs.items())]
    return gpu


def collect_nvidia() -> NvidiaFacts:
    """Driver version, the driver's CUDA version, and every GPU NVML can see."""
    facts = NvidiaFacts(proc_driver=os.path.exists("/proc/driver/nvidia/version"))
    try:
        import pynvml
    except ImportError:
        facts.unavailable_reason = "the nvidia-ml-py package (module pynvml) is not installed"
        return facts
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        if isinstance(exc, pynvml.NVMLError_LibraryNotFound) and not facts.proc_driver:
            facts.unavailable_reason = "no NVIDIA driver is installed (NVML library libnvidia-ml.so.1 not found)"
        elif isinstance(exc, pynvml.NVMLError_DriverNotLoaded):
            facts.unavailable_reason = "the NVIDIA kernel driver is not loaded"
        else:
            facts.unavailable_reason = f"NVML could not start: {exc}"
        return facts
    try:
        facts.driver_version = _try(lambda: _text(pynvml.nvmlSystemGetDriverVersion()))
        cuda = _try(pynvml.nvmlSystemGetCudaDriverVersion_v2) or _try(pynvml.nvmlSystemGetCudaDriverVersion)
        if cuda:
            facts.driver_cuda = f"{cuda // 1000}.{cuda % 1000 // 10}"
        count = _try(pynvml.nvmlDeviceGetCount) or 0
        host_pids = same_pid_namespace()
        facts.gpus = [_gpu(pynvml, i, host_pids) for i in range(count)]
        if not facts.gpus:
            facts.unavailable_reason = "the NVIDIA driver is loaded but reports no GPU"
    finally:
        _try(pynvml.nvmlShutdown)
    return facts
