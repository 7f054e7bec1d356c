"""The NVML collector on a fake `pynvml` (two GPUs, a live and a dead process), and for real with -m gpu."""

import os
import types

import pytest

from torchdoctor.env import nvidia

GiB = 1024**3


class NVMLError(Exception):
    pass


def fake_pynvml(dead_pid: int) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.NVMLError_LibraryNotFound = type("NVMLError_LibraryNotFound", (NVMLError,), {})
    m.NVMLError_DriverNotLoaded = type("NVMLError_DriverNotLoaded", (NVMLError,), {})
    m.NVML_TEMPERATURE_GPU = 0
    m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    m.NVML_VOLATILE_ECC = 0
    m.nvmlClocksThrottleReasonHwSlowdown = 0x8
    m.nvmlClocksThrottleReasonHwThermalSlowdown = 0x40
    m.nvmlClocksThrottleReasonHwPowerBrakeSlowdown = 0x80
    m.nvmlClocksThrottleReasonSwThermalSlowdown = 0x20
    m.nvmlClocksThrottleReasonSwPowerCap = 0x4
    m.nvmlInit = lambda: None
    m.nvmlShutdown = lambda: None
    m.nvmlSystemGetDriverVersion = lambda: b"550.54.15"
    m.nvmlSystemGetCudaDriverVersion_v2 = lambda: 12040
    m.nvmlDeviceGetCount = lambda: 2
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: ["NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 3090"][h]
    m.nvmlDeviceGetUUID = lambda h: f"GPU-{h:08d}-aaaa"
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=f"00000000:0{h}:00.0".encode())
    m.nvmlDeviceGetCudaComputeCapability = lambda h: [(8, 0), (8, 6)][h]
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=80 * GiB, used=5 * GiB)
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=97 if h else 0)
    m.nvmlDeviceGetTemperature = lambda h, sensor: 84 if h else 40

    def power(h):
        if h:
            raise NVMLError("Not Supported")  # a consumer card without power readings
        return 250_000

    m.nvmlDeviceGetPowerUsage = power
    m.nvmlDeviceGetEnforcedPowerLimit = lambda h: 400_000
    m.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x40 | 0x4 if h else 0x1
    m.nvmlDeviceGetEccMode = lambda h: (0, 0) if h else (1, 1)
    m.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: 2
    m.nvmlDeviceGetPersistenceMode = lambda h: 0 if h else 1
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: (
        [
            types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=GiB),
            types.SimpleNamespace(pid=dead_pid, usedGpuMemory=3 * GiB),
        ]
        if h == 0
        else []
    )
    m.nvmlDeviceGetGraphicsRunningProcesses = lambda h: []
    return m


def test_collect_nvidia_reads_every_fact(monkeypatch):
    dead = 2**22 + 4321
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake_pynvml(dead))
    monkeypatch.setattr(nvidia, "same_pid_namespace", lambda: True)
    facts = nvidia.collect_nvidia()
    assert (facts.driver_version, facts.driver_cuda) == ("550.54.15", "12.4")
    a100, rtx = facts.gpus
    assert a100.capability == (8, 0) and a100.memory_total == 80 * GiB and a100.power_watts == 250.0
    assert a100.ecc_enabled and a100.ecc_uncorrected == 2 and a100.persistence_mode and a100.throttle_reasons == []
    assert a100.pci_bus_id == "00000000:00:00.0" and a100.uuid == "GPU-00000000-aaaa"
    me, gone = a100.processes
    assert me.alive and me.used_bytes == GiB and me.user
    assert gone.pid == dead and gone.alive is False
    assert rtx.power_watts is None and rtx.utilization == 97 and rtx.persistence_mode is False
    assert rtx.throttle_reasons == ["hardware thermal slowdown"]  # the power cap alone is normal under load
    assert rtx.ecc_enabled is False and rtx.ecc_uncorrected is None


def test_nvml_init_failure_is_explained(monkeypatch):
    m = fake_pynvml(1)

    def fail():
        raise m.NVMLError_DriverNotLoaded("Driver Not Loaded")

    m.nvmlInit = fail
    monkeypatch.setitem(__import__("sys").modules, "pynvml", m)
    facts = nvidia.collect_nvidia()
    assert facts.gpus == [] and facts.unavailable_reason == "the NVIDIA kernel driver is not loaded"


@pytest.mark.gpu
def test_real_gpu_facts_and_probe():
    from torchdoctor.env.doctor import collect_facts

    facts = collect_facts()
    assert facts.nvidia.gpus and facts.nvidia.driver_version and facts.nvidia.gpus[0].capability
    assert facts.torch.ok and facts.torch.cuda_available and facts.torch.cuda_error is None
    assert facts.torch.cuda_devices[0]["capability"] == tuple(facts.nvidia.gpus[0].capability)
