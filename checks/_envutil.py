"""Small helpers shared by the environment pitfalls (versions, wheel indexes, GPU processes)."""

from __future__ import annotations

import os
import re
import shlex
from typing import Optional

from torchdoctor.sdk import byte_size
from torchdoctor.sdk.env import EnvFacts, GpuProcess, PathEntry

GiB = 1024**3
# CUDA variants PyTorch has published wheels for (download.pytorch.org/whl/<tag>).
WHEEL_CUDA = ((11, 8), (12, 1), (12, 4), (12, 6), (12, 8), (12, 9), (13, 0))
INDEX_URL = "https://download.pytorch.org/whl/{tag}"
# Why no env example runs: `Example(unseen={"env": MACHINE_STATE})`.
MACHINE_STATE = (
    "it shows the state of some machine, and `torchdoctor env` reads only the machine it runs on "
    "(packages, driver, GPUs, environment variables), which a test process cannot swap for that one."
)


def major_minor(version: Optional[str]) -> Optional[tuple[int, int]]:
    """'12.1' / '12.1.105' / '2.13.0+cu121' -> (12, 1); None when it does not parse."""
    if not version:
        return None
    m = re.match(r"(\d+)\.(\d+)", str(version))
    return (int(m.group(1)), int(m.group(2))) if m else None


def base_version(version: str) -> str:
    """Drop the local tag: '2.13.0+cu121' -> '2.13.0'."""
    return version.split("+", 1)[0]


def local_tag(version: Optional[str]) -> Optional[str]:
    """'2.13.0+cu121' -> 'cu121'; None without a local tag."""
    return version.split("+", 1)[1] if version and "+" in version else None


def cuda_tag(cuda: tuple[int, int]) -> str:
    """(12, 1) -> 'cu121', the tag of that CUDA variant's wheel index."""
    return f"cu{cuda[0]}{cuda[1]}"


def best_wheel_cuda(
    max_cuda: Optional[tuple[int, int]], min_cuda: tuple[int, int] = (0, 0)
) -> Optional[tuple[int, int]]:
    """The newest published CUDA variant from `min_cuda` up to what the driver supports; failing that,
    one of the driver's major version (minor-version compatibility lets it run those)."""
    fits = [c for c in WHEEL_CUDA if c >= min_cuda]
    if max_cuda is None:
        return max(fits, default=None)
    return max((c for c in fits if c <= max_cuda), default=None) or max(
        (c for c in fits if c[0] == max_cuda[0]), default=None
    )


def pip(facts: EnvFacts) -> str:
    """`/path/to/python -m pip`: pip of the very interpreter that was examined, not whatever `pip` is on PATH."""
    return f"{shlex.quote(facts.system.python_executable or 'python')} -m pip"


def pip_install(facts: EnvFacts, cuda: Optional[tuple[int, int]], force: bool = True) -> str:
    """The exact pip command that installs this torch version for `cuda` (None: the CPU build)."""
    version = facts.torch_version
    pin = f"torch=={base_version(version)}" if version else "torch"
    tag = cuda_tag(cuda) if cuda else "cpu"
    return f"{pip(facts)} install {'--force-reinstall ' if force else ''}{pin} --index-url {INDEX_URL.format(tag=tag)}"


def torch_pin(facts: EnvFacts) -> str:
    """`"torch==2.13.0"` (local tag dropped) to add to a pip command so that pip keeps this torch."""
    version = facts.torch_version
    return f'"torch=={base_version(version)}"' if version else ""


def rename_fix(entry: PathEntry) -> str:
    """How to get a shadowing file or folder out of the way (shared by module-shadowing and the import failure)."""
    is_file = os.path.basename(entry.path) != entry.name
    cache = os.path.join(os.path.dirname(entry.path), "__pycache__")
    return f"Rename {entry.path} (e.g. to my_{entry.name}{'.py' if is_file else ''}) and delete {cache}" + (
        f", or take {entry.origin_dir} off PYTHONPATH." if entry.via == "PYTHONPATH" else "."
    )


def has_nvidia(facts: EnvFacts) -> bool:
    """An NVIDIA GPU or kernel driver is present."""
    return bool(facts.nvidia.gpus) or facts.nvidia.proc_driver or facts.nvidia.driver_version is not None


def gpu_process(p: GpuProcess) -> str:
    """One process on a GPU, for a finding: pid, user, memory it holds and (shortened) command."""
    bits = [f"pid {p.pid}"]
    if p.user:
        bits.append(p.user)
    if p.used_bytes is not None:
        bits.append(byte_size(p.used_bytes))
    if p.command:
        cmd = p.command if len(p.command) <= 80 else p.command[:77] + "..."
        bits.append(f"`{cmd}`")
    if p.status in ("stopped", "tracing-stop"):
        bits.append("stopped (Ctrl-Z, or a debugger): it keeps the memory until resumed or killed")
    return ", ".join(bits)
