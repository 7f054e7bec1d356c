"""gpu-arch-unsupported: a GPU's compute capability has no kernels in the installed torch build."""

from __future__ import annotations

import re
from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.env import EnvFacts

from ._envutil import MACHINE_STATE, best_wheel_cuda, major_minor, pip_install

FIRST_CUDA_FOR_CC = {
    (12, 0): (12, 8),
    (10, 0): (12, 8),
    (9, 0): (11, 8),
    (8, 9): (11, 8),
    (8, 7): (11, 4),
    (8, 6): (11, 1),
    (8, 0): (11, 0),
    (7, 5): (10, 0),
}

GPU_ARCH_UNSUPPORTED = Pitfall(
    code="TD103",
    name="gpu-arch-unsupported",
    severity="error",
    summary="A GPU's compute capability has no kernels in this torch build ('no kernel image is available').",
    why="""
        A GPU's compute capability (e.g. 12.0, `sm_120`, on an RTX 50-series card) has no kernels in the installed
        torch build: `torch.cuda.get_arch_list()` contains neither machine code for it nor PTX that the driver could
        compile for it. torch imports fine and may even report the GPU as available, but every CUDA kernel fails.

        Each torch wheel is compiled for a fixed list of GPU architectures. A GPU newer than the wheel's CUDA
        version (Blackwell needs CUDA ≥ 12.8 wheels), or an old one dropped by newer wheels (CUDA 13 wheels no longer
        include pre-Turing GPUs), gives:

        ```text
        UserWarning: NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with the current PyTorch
        installation. The current PyTorch install supports CUDA capabilities sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90.
        RuntimeError: CUDA error: no kernel image is available for execution on the device
        ```

        Recent torch releases word the warning as `Found GPU0 ... which is of compute capability (CC) X.Y ... does not
        include kernels for this GPU`. Older ones raised `cuda runtime error (48)`.
    """,
    fix="""
        Install the same torch version built with a CUDA release that compiles for your GPU; torchdoctor prints the
        command with the right index:

        ```console
        $ nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader
        NVIDIA GeForce RTX 5090, 12.0
        $ pip install --force-reinstall torch==2.7.1 --index-url https://download.pytorch.org/whl/cu128
        $ python -c "import torch; print(torch.cuda.get_arch_list())"
        ```

        For GPUs older than compute capability 7.5 pick a CUDA 12.x wheel (e.g. `cu126`), not `cu130`.
    """,
    bad=Example(
        """
            import torch  # 2.5.1+cu124: arch list sm_50 ... sm_90, GPU is sm_120

            x = torch.ones(8, device="cuda")
            y = x * 2  # RuntimeError: CUDA error: no kernel image is available for execution on the device
        """,
        unseen={"env": MACHINE_STATE},
    ),
    good=Example(
        """
            $ pip install --force-reinstall torch==2.7.1 --index-url https://download.pytorch.org/whl/cu128
            $ python -c "import torch; print('sm_120' in torch.cuda.get_arch_list())"
            True
            $ python -c "import torch; print((torch.ones(8, device='cuda') * 2).sum().item())"
            True 16.0
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    details={
        "env": """
            It compares each GPU's compute capability from NVML with the arch list the torch probe read from
            `torch.cuda.get_arch_list()`. A GPU X.Y is covered by `sm_XZ` with the same major version and Z ≤ Y, or by
            PTX `compute_NN` at or below its capability. Variants with a letter suffix (`sm_90a`, `sm_100f`) are
            ignored; wheels that ship them also ship the plain `sm_XY`. One error per uncovered GPU; if the probe's tiny
            CUDA
            operation failed, its error text is quoted. The check stays quiet when torch did not import, is a CPU or
            ROCm
            build, reports an empty arch list, or NVML gives no compute capability.
        """,
    },
)


def _covered(cc: tuple[int, int], arch_list: list[str]) -> bool:
    """A GPU runs a wheel with SASS for its major version at or below its minor (not the 'a'/'f'
    arch-specific variants), or PTX (compute_XY) at or below its capability to JIT from."""
    want = cc[0] * 10 + cc[1]
    for arch in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+)([a-z]?)", arch)
        if not m:
            continue
        num = int(m.group(2))
        major, minor = divmod(num, 10)
        if m.group(1) == "sm" and not m.group(3) and major == cc[0] and minor <= cc[1]:
            return True
        if m.group(1) == "compute" and num <= want:
            return True
    return False


@GPU_ARCH_UNSUPPORTED.env
def gpu_arch_unsupported(facts: EnvFacts) -> Iterator[Finding]:
    """Each GPU whose compute capability neither the build's SASS nor its PTX covers."""
    arch_list = facts.torch.arch_list
    if not (facts.torch.ok and facts.torch.cuda and arch_list):
        return
    for gpu in facts.nvidia.gpus:
        if gpu.capability is None:
            continue
        cc = (gpu.capability[0], gpu.capability[1])
        if _covered(cc, arch_list):
            continue
        sm = f"sm_{cc[0]}{cc[1]}"
        need = FIRST_CUDA_FOR_CC.get(cc) or next((v for k, v in sorted(FIRST_CUDA_FOR_CC.items()) if k >= cc), (12, 8))
        if cc < (7, 5):
            target = best_wheel_cuda((12, 6))  # CUDA 13 wheels dropped pre-Turing GPUs
        else:
            target = best_wheel_cuda(major_minor(facts.nvidia.driver_cuda), min_cuda=need) or need
        seen = f" The probe's CUDA op failed with: {facts.torch.cuda_error}" if facts.torch.cuda_error else ""
        yield Finding(
            f"GPU{gpu.index} {gpu.name} has compute capability {cc[0]}.{cc[1]} ({sm}), but torch {facts.torch.version} "
            f"(CUDA {facts.torch.cuda}) only has kernels for {' '.join(arch_list)}: every CUDA op fails with "
            f"'CUDA error: no kernel image is available for execution on the device'.{seen}",
            fix=Fix(
                title=f"Install a build that includes {sm} (CUDA ≥ {need[0]}.{need[1]}"
                f"{' and ≤ 12.x' if cc < (7, 5) else ''}): {pip_install(facts, target)}"
            ),
            location=Location(device=f"GPU{gpu.index}"),
        )
