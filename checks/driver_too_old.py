"""driver-too-old: the NVIDIA driver is older than the CUDA version torch was built with needs."""

from __future__ import annotations

import re
from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Pitfall
from torchdoctor.sdk.env import EnvFacts

from ._envutil import MACHINE_STATE, best_wheel_cuda, major_minor, pip_install

MIN_DRIVER = {10: "410.48", 11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}

DRIVER_TOO_OLD = Pitfall(
    code="TD104",
    name="driver-too-old",
    severity="error",
    summary="The NVIDIA driver is older than the CUDA version torch was built with needs.",
    why="""
        The NVIDIA driver is too old for the CUDA version torch was built with (`torch.version.cuda`). torch ships
        its own CUDA runtime, but that runtime needs a driver of at least the same CUDA major version: a 470 driver
        (CUDA 11.4) cannot run a `+cu124` wheel.

        CUDA simply does not start. `torch.cuda.is_available()` returns `False` and torch warns:

        ```text
        UserWarning: CUDA initialization: The NVIDIA driver on your system is too old (found version 11040). Please
        update your GPU driver by downloading and installing a new version from the URL:
        http://www.nvidia.com/Download/index.aspx Alternatively, go to: https://pytorch.org to install a PyTorch
        version that has been compiled with your version of the CUDA driver.
        ```

        Older torch versions raise an `AssertionError` with the same text. Scripts that fall back to the CPU keep
        running, very slowly, on a machine whose GPUs sit idle.
    """,
    fix="""
        Either upgrade the driver, or install a torch build for a CUDA version the driver supports. The minimum Linux
        drivers per CUDA major version are 450.80.02 (11.x), 525.60.13 (12.x) and 580.65.06 (13.x).

        ```console
        $ nvidia-smi | head -4            # "CUDA Version: 11.4" = the newest CUDA this driver runs
        $ sudo apt install nvidia-driver-550 && sudo reboot
        # or keep the driver and use a wheel built for CUDA 11.x:
        $ pip install --force-reinstall torch==2.5.1 --index-url https://download.pytorch.org/whl/cu118
        ```

        Not every torch release is published for every CUDA version; if pip finds no such wheel, choose an older torch
        or upgrade the driver.
    """,
    bad=Example(
        """
            $ nvidia-smi --query-gpu=driver_version --format=csv,noheader
            470.223.02
            $ python -c "import torch; print(torch.__version__, torch.cuda.is_available())"
            UserWarning: CUDA initialization: The NVIDIA driver on your system is too old (found version 11040). ...
            2.5.1+cu124 False
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    good=Example(
        """
            $ pip install --force-reinstall torch==2.5.1 --index-url https://download.pytorch.org/whl/cu118
            $ python -c "import torch; print(torch.__version__, torch.cuda.is_available())"
            2.5.1+cu118 True
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    details={
        "env": """
            It reads the driver version and the driver's newest supported CUDA version from NVML, without initialising
            CUDA, and torch's CUDA version from the probe (or from `torch/version.py` when torch does not import). When
            NVML reports the driver's CUDA version, the driver is too old only if its **major** version is lower than
            torch's: CUDA minor-version compatibility lets a 12.2 driver run a `cu124` wheel, so that is not flagged.
            When
            NVML gives only the driver version, it is compared with the minimum driver table above. The check is silent
            for
            CPU builds and when no NVIDIA driver is found (see [cpu-only-build](cpu-only-build.md) for the reverse
            problem).
        """,
    },
)


def _version_tuple(v: str) -> tuple[int, ...]:
    """'525.60.13' -> (525, 60, 13), for comparing driver versions."""
    return tuple(int(x) for x in re.findall(r"\d+", v))


@DRIVER_TOO_OLD.env
def driver_too_old(facts: EnvFacts) -> Iterator[Finding]:
    """The driver's CUDA major version (or, failing that, its version) below what torch's CUDA needs."""
    torch_cuda = major_minor(facts.torch_cuda)
    nv = facts.nvidia
    if torch_cuda is None or not nv.driver_version:
        return
    need = MIN_DRIVER.get(torch_cuda[0])
    driver_cuda = major_minor(nv.driver_cuda)
    if driver_cuda is not None:
        too_old = driver_cuda[0] < torch_cuda[0]
    else:
        too_old = need is not None and _version_tuple(nv.driver_version) < _version_tuple(need)
    if not too_old:
        return
    alt = best_wheel_cuda(driver_cuda) if driver_cuda else None
    alt_text = f", or install a torch build for CUDA {alt[0]}.{alt[1]}: {pip_install(facts, alt)}" if alt else ""
    supports = f"supports CUDA up to {nv.driver_cuda}" if nv.driver_cuda else "is too old"
    yield Finding(
        f"NVIDIA driver {nv.driver_version} {supports}, but torch {facts.torch_version} was built with CUDA "
        f"{facts.torch_cuda}, which needs driver ≥ {need or '?'}: torch.cuda.is_available() is False and CUDA "
        "init warns 'The NVIDIA driver on your system is too old'.",
        fix=Fix(title=f"Upgrade the NVIDIA driver to ≥ {need or 'a newer release'}{alt_text}"),
    )
