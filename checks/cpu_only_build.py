"""cpu-only-build: a CPU-only torch build on a machine with an NVIDIA driver or GPU."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Pitfall, Severity
from torchdoctor.sdk.env import EnvFacts

from ._envutil import MACHINE_STATE, best_wheel_cuda, has_nvidia, local_tag, major_minor, pip_install

CPU_ONLY_BUILD = Pitfall(
    code="TD102",
    name="cpu-only-build",
    severity="error",
    summary="A CPU-only torch build on a machine with an NVIDIA driver or GPU.",
    why="""
        The installed torch is a CPU-only build (`torch.version.cuda` is `None`, version tag `+cpu`) on a machine
        that has an NVIDIA GPU or a loaded NVIDIA driver. Training silently runs on the CPU, or fails as soon as
        the code asks for CUDA.

        `pip install torch` from the wrong index, a `requirements.txt` pinned to `+cpu`, or a conda solve that picked
        the CPU variant all give a torch that cannot use the GPU:

        ```text
        >>> torch.cuda.is_available()
        False
        >>> torch.zeros(1).cuda()
        AssertionError: Torch not compiled with CUDA enabled
        ```

        Code that picks `device = "cuda" if torch.cuda.is_available() else "cpu"` does not fail at all: it trains
        on the CPU, tens of times slower, with the GPU idle.
    """,
    fix="""
        Install the CUDA build of the same torch version that matches the driver (`nvidia-smi` shows the newest
        CUDA the driver supports in its header). torchdoctor prints the exact command, for example:

        ```console
        $ pip install --force-reinstall torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124
        $ python -c "import torch; print(torch.version.cuda, torch.cuda.is_available())"
        12.4 True
        ```

        Reinstall torchvision/torchaudio from the same index so their `+cuXYZ` tags match
        (see [companion-version-mismatch](companion-version-mismatch.md)).
    """,
    bad=Example(
        """
            $ pip install torch==2.5.1 --index-url https://download.pytorch.org/whl/cpu
            $ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
            NVIDIA A100-SXM4-80GB, 550.54.15
            $ python -c "import torch; print(torch.__version__, torch.version.cuda)"
            2.5.1+cpu None
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    good=Example(
        """
            $ pip install torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124
            $ python -c "import torch; print(torch.__version__, torch.version.cuda)"
            2.5.1+cu124 12.4
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    details={
        "env": """
            The build is CPU-only when the torch probe imported torch and found neither `torch.version.cuda` nor
            `torch.version.hip`, or when the installed version carries the `+cpu` tag. The NVIDIA side comes from NVML
            (GPUs, driver version, the driver's CUDA version) and `/proc/driver/nvidia`; no CUDA is initialised. With a
            driver or GPU present the finding is an **error** and the fix names the newest published CUDA wheel the
            driver
            can run. When the only CUDA trace is a toolkit (`nvcc`) with no driver and no GPU, the finding is only
            **info**: a CPU build is right for that machine. A CPU build on a machine with no NVIDIA driver, GPU or
            toolkit
            is not reported, and ROCm builds (`torch.version.hip`) are not called CPU-only.
        """,
    },
)


@CPU_ONLY_BUILD.env
def cpu_only_build(facts: EnvFacts) -> Iterator[Finding]:
    """A CPU-only torch where an NVIDIA driver or GPU exists (info when only a toolkit does)."""
    version = facts.torch_version
    known_cpu = (facts.torch.ok and not facts.torch.cuda and not facts.torch.hip) or local_tag(version) == "cpu"
    if not known_cpu:
        return
    nv = facts.nvidia
    if has_nvidia(facts):
        gpus = ", ".join(f"GPU{g.index} {g.name}" for g in nv.gpus) or "a loaded NVIDIA kernel driver"
        driver = f"driver {nv.driver_version}, CUDA ≤ {nv.driver_cuda}" if nv.driver_version else "driver present"
        target = best_wheel_cuda(major_minor(nv.driver_cuda))
        yield Finding(
            f"torch {version} is a CPU-only build (torch.version.cuda is None) but this machine has {gpus} "
            f"({driver}): torch.cuda.is_available() is False and .cuda() raises "
            "'AssertionError: Torch not compiled with CUDA enabled'.",
            fix=Fix(title=f"Install the CUDA build that matches the driver: {pip_install(facts, target or (12, 6))}"),
        )
    elif facts.toolkit.nvcc_path:
        yield Finding(
            f"torch {version} is a CPU-only build. A CUDA toolkit is installed (nvcc {facts.toolkit.nvcc_version} "
            f"at {facts.toolkit.nvcc_path}) but there is no NVIDIA driver or GPU, so the CPU build is right here.",
            fix=Fix(title="Nothing to do on this machine; on a GPU machine install a CUDA build of torch."),
            severity=Severity.INFO,
        )
