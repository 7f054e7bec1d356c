"""cuda-toolkit-mismatch: nvcc's CUDA major version differs from torch's, so extension builds fail."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Pitfall, Severity
from torchdoctor.sdk.env import EnvFacts

from ._envutil import MACHINE_STATE, major_minor

CUDA_TOOLKIT_MISMATCH = Pitfall(
    code="TD105",
    name="cuda-toolkit-mismatch",
    severity="warning",
    summary="The CUDA toolkit (nvcc) differs in major version from the CUDA torch was built with.",
    why="""
        The CUDA toolkit on the machine (`nvcc`, `CUDA_HOME`) has a different major version from the CUDA torch was
        built with. This does not affect training: it only breaks compiling CUDA extensions (custom ops, apex,
        flash-attn, DeepSpeed ops). Reported as **info**, or as a **warning** when `CUDA_HOME`/`CUDA_PATH` points at the
        mismatched toolkit, because extension builds will then use it.

        There are three different "CUDA versions" and they are often confused:

        - `nvidia-smi` shows `CUDA Version: 12.4`: the newest CUDA the **driver** supports, not an installed CUDA;
        - `torch.version.cuda`: the CUDA runtime bundled **inside** the torch wheel, the one training uses;
        - `nvcc --version`: a separately installed **toolkit**, used only to compile code.

        A toolkit of another major version is harmless until something compiles against torch, then:

        ```text
        RuntimeError: The detected CUDA version (11.8) mismatches the version that was used to compile PyTorch (12.4).
        Please make sure to use the same CUDA versions.
        ```
    """,
    fix="""
        Point `CUDA_HOME` at a toolkit with torch's CUDA major version before building (several toolkits can live
        side by side under `/usr/local/cuda-X.Y`), or leave the toolkit alone if you never build extensions:

        ```console
        $ python -c "import torch; print(torch.version.cuda)"
        12.4
        $ export CUDA_HOME=/usr/local/cuda-12.4
        $ export PATH=$CUDA_HOME/bin:$PATH
        $ pip install flash-attn --no-build-isolation
        ```
    """,
    bad=Example(
        """
            $ export CUDA_HOME=/usr/local/cuda-11.8
            $ python -c "import torch; print(torch.version.cuda)"
            12.4
            $ pip install flash-attn --no-build-isolation
            RuntimeError: The detected CUDA version (11.8) mismatches the version that was used to compile
PyTorch (12.4). ...
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    good=Example(
        """
            $ export CUDA_HOME=/usr/local/cuda-12.4
            $ $CUDA_HOME/bin/nvcc --version | tail -2
            Cuda compilation tools, release 12.4, V12.4.131
            $ pip install flash-attn --no-build-isolation
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    details={
        "env": """
            It finds the toolkit the way `torch.utils.cpp_extension` does: `CUDA_HOME`, then `CUDA_PATH`, then `nvcc` on
            `PATH`, then `/usr/local/cuda`; the version comes from the toolkit's `version.json` or `nvcc --version`. It
            fires
            only when that **major** version differs from `torch.version.cuda`'s: a minor difference (toolkit 12.1,
            torch
            12.4) builds fine and is not reported. It is silent for CPU builds of torch and when no toolkit is found.
            The driver's CUDA version (what `nvidia-smi` prints) is checked separately by
            [driver-too-old](driver-too-old.md).
        """,
    },
)


@CUDA_TOOLKIT_MISMATCH.env
def cuda_toolkit_mismatch(facts: EnvFacts) -> Iterator[Finding]:
    """nvcc of another CUDA major version than torch's (a warning when CUDA_HOME points at it)."""
    torch_cuda = major_minor(facts.torch_cuda)
    nvcc = major_minor(facts.toolkit.nvcc_version)
    if torch_cuda is None or nvcc is None or torch_cuda[0] == nvcc[0]:
        return
    explicit = facts.toolkit.cuda_home_from_env
    yield Finding(
        f"nvcc {facts.toolkit.nvcc_version} ({facts.toolkit.nvcc_path or facts.toolkit.cuda_home}) is CUDA "
        f"{nvcc[0]}.x but torch {facts.torch_version} was built with CUDA {facts.torch_cuda}. Training is not "
        "affected (torch ships its own CUDA runtime; nvidia-smi's 'CUDA Version' is only the driver's maximum), "
        "but building CUDA extensions (torch.utils.cpp_extension, apex, flash-attn, DeepSpeed ops) fails with "
        "'The detected CUDA version mismatches the version that was used to compile PyTorch'."
        + (" CUDA_HOME/CUDA_PATH points at it, so extension builds will use it." if explicit else ""),
        fix=Fix(
            title=f"Point CUDA_HOME at a CUDA {torch_cuda[0]}.x toolkit before building extensions, e.g. "
            f"`export CUDA_HOME=/usr/local/cuda-{torch_cuda[0]}.{torch_cuda[1]}`"
        ),
        severity=Severity.WARNING if explicit else Severity.INFO,
    )
