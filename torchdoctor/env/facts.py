"""The facts `torchdoctor env` collects, as plain dataclasses.

Environment checks are pure functions of `EnvFacts`, so tests build synthetic facts (a GPU of compute
capability 12.0, a 470 driver, a 64 MiB /dev/shm) without the hardware. Every field has a neutral default:
`None` means "not known", never "absent".
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class TorchProbe:
    """What a subprocess that imported torch saw (`ok` is False when the import failed or hung)."""

    ok: bool = False
    timed_out: bool = False
    seconds: Optional[float] = None  # wall time of `import torch`
    cpu_seconds: Optional[float] = None  # CPU time the import used
    cpu_wait_seconds: Optional[float] = None  # time it was ready to run but waited for a CPU (a loaded machine)
    blocked_seconds: Optional[float] = None  # the rest: waiting for files (a slow file system), locks, the network
    exit_signal: Optional[int] = None  # the signal that ended a probe that died (7: SIGBUS, 9: SIGKILL, ...)
    crash_stack: list[str] = field(default_factory=list)  # where a crashed probe was, innermost frame first
    error_type: Optional[str] = None
    error: Optional[str] = None  # the exception text, or the last lines of stderr
    error_errno: Optional[int] = None  # an OSError's errno (13: EACCES, 28: ENOSPC, 30: EROFS, ...)
    error_filename: Optional[str] = None  # an OSError's file name
    error_module: Optional[str] = None  # the module an ImportError names
    limits: dict[str, list[Any]] = field(default_factory=dict)  # /proc/self/limits: name -> [soft, hard]
    traceback_tail: list[str] = field(default_factory=list)
    stderr_tail: list[str] = field(default_factory=list)  # warnings printed while importing torch
    torch_file: Optional[str] = None  # the torch/__init__.py that was imported (or attempted)
    version: Optional[str] = None
    cuda: Optional[str] = None  # torch.version.cuda
    hip: Optional[str] = None
    debug: Optional[bool] = None
    cudnn: Optional[int] = None
    nccl: Optional[str] = None
    arch_list: list[str] = field(default_factory=list)
    blas: Optional[str] = None
    openmp: Optional[str] = None
    cpu_capability: Optional[str] = None
    num_threads: Optional[int] = None
    interop_threads: Optional[int] = None
    cuda_available: Optional[bool] = None
    cuda_device_count: Optional[int] = None
    cuda_devices: list[dict[str, Any]] = field(default_factory=list)  # name, capability per ordinal
    cuda_error: Optional[str] = None  # text of the error a tiny CUDA op raised
    openmp_runtimes: list[str] = field(default_factory=list)  # distinct OpenMP libraries mapped
    numpy_version: Optional[str] = None
    numpy_error: Optional[str] = None  # the torch<->numpy bridge failing, with its message
    git_version: Optional[str] = None  # the commit torch was built from
    xpu_available: Optional[bool] = None
    xnnpack: Optional[bool] = None
    hang_stack: list[str] = field(default_factory=list)  # where a hanging probe was, innermost frame first
    companion_errors: dict[str, str] = field(default_factory=dict)  # torchvision/torchaudio import errors
    torch_copies: list[str] = field(default_factory=list)  # every torch/ folder on sys.path, the winner first
    torch_copy_versions: dict[str, str] = field(default_factory=dict)  # folder -> __version__ in its version.py
    user_site: Optional[str] = None  # ~/.local/lib/pythonX.Y/site-packages (or $PYTHONUSERBASE's)
    user_site_enabled: Optional[bool] = None  # site.ENABLE_USER_SITE: off in venvs, with -s, -I, PYTHONNOUSERSITE
    isolated: Optional[bool] = None  # python -I
    no_user_site_flag: Optional[bool] = None  # python -s or PYTHONNOUSERSITE
    sys_prefix: Optional[str] = None  # the environment (venv, conda env) the interpreter runs in


@dataclass
class LibraryCopy:
    """A shared library that the dynamic loader finds through LD_PRELOAD or LD_LIBRARY_PATH before the copy
    torch was built with (it has the name of a library torch or its bundled libraries load)."""

    path: str
    via: str  # "LD_PRELOAD" or "LD_LIBRARY_PATH"
    entry: str  # the LD_PRELOAD / LD_LIBRARY_PATH entry that brings it
    state: str = "ok"  # ok, empty, truncated, not ELF, wrong class, unreadable
    size: Optional[int] = None


@dataclass
class GpuProcess:
    """A process NVML says holds memory on a GPU, with what the OS knows about it."""

    pid: int
    used_bytes: Optional[int] = None
    alive: Optional[bool] = None  # None: cannot tell (another PID namespace)
    status: Optional[str] = None  # psutil status: running, sleeping, zombie, ...
    user: Optional[str] = None
    command: Optional[str] = None
    parent_pid: Optional[int] = None
    orphaned: bool = False  # the leader of its process group (its main process or launcher) is gone


@dataclass
class GpuFacts:
    """One GPU as NVML sees it (PCI order, like nvidia-smi)."""

    index: int
    name: str = ""
    uuid: Optional[str] = None
    pci_bus_id: Optional[str] = None
    capability: Optional[tuple[int, int]] = None
    memory_total: Optional[int] = None
    memory_used: Optional[int] = None
    utilization: Optional[int] = None  # percent
    temperature: Optional[int] = None  # °C
    power_watts: Optional[float] = None
    power_limit_watts: Optional[float] = None
    throttle_reasons: list[str] = field(default_factory=list)  # only the ones that slow work down
    ecc_enabled: Optional[bool] = None
    ecc_uncorrected: Optional[int] = None  # volatile uncorrected errors since the driver loaded
    persistence_mode: Optional[bool] = None
    processes: list[GpuProcess] = field(default_factory=list)


@dataclass
class NvidiaFacts:
    """The NVIDIA driver and GPUs, from NVML (or why they are unknown)."""

    driver_version: Optional[str] = None
    driver_cuda: Optional[str] = None  # the newest CUDA the driver supports, e.g. "12.4"
    proc_driver: bool = False  # /proc/driver/nvidia exists: a kernel driver is loaded
    gpus: list[GpuFacts] = field(default_factory=list)
    unavailable_reason: Optional[str] = None


@dataclass
class ToolkitFacts:
    """A CUDA toolkit on this machine (only matters for building extensions)."""

    nvcc_path: Optional[str] = None
    nvcc_version: Optional[str] = None
    cuda_home: Optional[str] = None
    cuda_home_from_env: bool = False


@dataclass
class SystemFacts:
    """The OS, CPU, memory and disks, from the standard library and psutil."""

    python: str = ""
    python_executable: str = ""
    platform: str = ""
    machine: str = ""
    cpu_model: Optional[str] = None
    cpu_logical: Optional[int] = None
    cpu_physical: Optional[int] = None
    cpu_affinity: Optional[int] = None  # CPUs this process may run on
    load_average: Optional[float] = None  # runnable processes, 1-minute average (os.getloadavg)
    cgroup_cpu_limit: Optional[float] = None  # CPUs allowed by a container quota
    cgroup_memory_limit: Optional[int] = None  # bytes a container's cgroup allows (psutil shows the host's)
    cgroup_memory_used: Optional[int] = None  # bytes charged to that cgroup now
    memory_total: Optional[int] = None
    memory_available: Optional[int] = None
    disk_path: str = "."
    disk_total: Optional[int] = None
    disk_free: Optional[int] = None
    shm_total: Optional[int] = None  # /dev/shm size, None where there is none
    shm_free: Optional[int] = None
    open_files_soft: Optional[int] = None  # `ulimit -n`; None: unknown or unlimited
    open_files_hard: Optional[int] = None
    cache_free: dict[str, tuple[str, int]] = field(default_factory=dict)  # TMPDIR/TORCH_HOME/HF_HOME -> (path, free)
    container: Optional[str] = None  # "docker", "kubernetes", "container" or None


@dataclass
class PathEntry:
    """A module file or package found where Python looks before site-packages."""

    name: str
    path: str
    origin_dir: str  # the folder on Python's search path it sits in
    via: str = "the working directory"  # why that folder is searched: the working directory or PYTHONPATH


@dataclass
class UnmetRequirement:
    """An installed distribution's declared requirement that what is installed does not meet (`pip check`)."""

    dist: str
    version: str
    requirement: str  # e.g. "tokenizers<0.22,>=0.21"
    installed: Optional[str] = None  # the installed version of the required package; None: not installed

    @property
    def requirement_name(self) -> str:
        """The required package's name: "tokenizers" of "tokenizers<0.22,>=0.21"."""
        m = re.match(r"[A-Za-z0-9._-]+", self.requirement)
        return m.group(0) if m else self.requirement


@dataclass
class LaunchFacts:
    """How this process was launched for torch.distributed (RANK, WORLD_SIZE, ... as the launcher set them)."""

    rank: Optional[int] = None
    local_rank: Optional[int] = None
    world_size: Optional[int] = None
    local_world_size: Optional[int] = None
    master_addr: Optional[str] = None
    master_port: Optional[str] = None
    run_id: Optional[str] = None  # TORCHELASTIC_RUN_ID: set by torchrun
    local_rank_arg: Optional[str] = None  # "--local-rank" or "--local_rank" when a launcher passed one


@dataclass
class RankFacts:
    """One rank's summary as gathered on rank 0 by `torchdoctor env` under torchrun."""

    rank: int
    hostname: str = ""
    local_rank: Optional[int] = None
    world_size: Optional[int] = None
    local_world_size: Optional[int] = None
    master_addr: Optional[str] = None
    master_port: Optional[str] = None
    python: str = ""
    torch: dict[str, Any] = field(default_factory=dict)  # version, cuda, cudnn, nccl, hip
    gpu: Optional[str] = None  # the model of the GPU this rank uses (LOCAL_RANK-th visible one)
    env_vars: dict[str, str] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)  # the rank's own env findings


@dataclass
class EnvFacts:
    """Everything `torchdoctor env` knows about this machine; the input of every env check."""

    torch: TorchProbe = field(default_factory=TorchProbe)
    torch_dist_version: Optional[str] = None  # from package metadata, without importing torch
    torch_dist_cuda: Optional[str] = None  # torch/version.py `cuda = ...`, read as text
    torch_dist_location: Optional[str] = None  # the installed torch package folder
    torch_dist_editable: Optional[str] = None  # an editable install's source folder (PEP 610 direct_url.json)
    torch_dist_files_missing: bool = False  # pip lists torch, but its torch/__init__.py is not where it says
    torch_dist_requirements: dict[str, str] = field(default_factory=dict)  # torch's own requirements: name -> spec
    libraries: list[LibraryCopy] = field(default_factory=list)  # LD_PRELOAD/LD_LIBRARY_PATH copies torch may load
    torch_damaged_files: list[str] = field(default_factory=list)  # torch/lib libraries that are not whole ELF files
    nvidia: NvidiaFacts = field(default_factory=NvidiaFacts)
    toolkit: ToolkitFacts = field(default_factory=ToolkitFacts)
    system: SystemFacts = field(default_factory=SystemFacts)
    env_vars: dict[str, str] = field(default_factory=dict)
    packages: dict[str, str] = field(default_factory=dict)  # companion distribution -> version
    torch_requirements: dict[str, str] = field(default_factory=dict)  # distribution -> its torch requirement
    numpy_requirements: dict[str, str] = field(default_factory=dict)  # distribution -> its numpy requirement
    unmet_requirements: list[UnmetRequirement] = field(default_factory=list)  # other than torch's and numpy's
    shadowing: list[PathEntry] = field(default_factory=list)
    cwd: str = "."
    launch: Optional[LaunchFacts] = None  # set when launched for torch.distributed
    ranks: list[RankFacts] = field(default_factory=list)  # every rank's summary (rank 0 under torchrun)
    missing_ranks: list[int] = field(default_factory=list)  # ranks that did not report in time
    missing_doing: dict[str, str] = field(default_factory=dict)  # rank -> what it last said it was doing
    report_details: dict[str, str] = field(default_factory=dict)  # OS, compilers, lscpu, conda (--format markdown)

    @property
    def torch_cuda(self) -> Optional[str]:
        """torch.version.cuda from the probe, else as read from the installed files."""
        return self.torch.cuda if self.torch.ok else self.torch_dist_cuda

    @property
    def torch_version(self) -> Optional[str]:
        return self.torch.version or self.torch_dist_version

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
