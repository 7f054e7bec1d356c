"""cuda-visible-devices: CUDA_VISIBLE_DEVICES malformed or naming absent GPUs; GPU order unlike nvidia-smi's."""

from __future__ import annotations

import re
from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Pitfall, Severity
from torchdoctor.sdk.env import EnvFacts

from ._envutil import MACHINE_STATE

_VISIBLE_TOKEN = re.compile(
    r"^(\s*\d+\s*|GPU-[0-9a-fA-F-]+|MIG-[0-9a-zA-Z/-]+)$"
)  # CUDA skips blanks around indices only

CUDA_VISIBLE_DEVICES = Pitfall(
    code="TD109",
    name="cuda-visible-devices",
    severity="warning",
    summary="CUDA_VISIBLE_DEVICES malformed or naming absent GPUs; GPU order differs from nvidia-smi's.",
    why="""
        `CUDA_VISIBLE_DEVICES` is malformed, repeats a GPU, or names GPUs this machine does not have; or the machine
        mixes GPU models while `CUDA_DEVICE_ORDER` is not `PCI_BUS_ID`, so CUDA's GPU numbers differ from
        `nvidia-smi`'s.

        CUDA reads `CUDA_VISIBLE_DEVICES` once, when it initialises, and never complains about it:

        - it stops at the first invalid or absent entry: `0,1,a,2` or `0,5` on a 2-GPU box leaves only the GPUs before
          it;
        - a repeated entry (`0,0`) makes torch see no GPU at all;
        - an empty value or `-1` hides every GPU, so `torch.cuda.is_available()` is `False`.

        On a machine with different GPU models, CUDA numbers GPUs fastest first while `nvidia-smi` numbers them by PCI
        bus, so `cuda:0` or `CUDA_VISIBLE_DEVICES=0` may be a different card from the one `nvidia-smi` calls 0, and
        the job silently lands on the wrong (slower, or busy) GPU. Later symptoms include
        `NCCL WARN Duplicate GPU detected : rank 0 and rank 1 both on CUDA device ...` and
        `RuntimeError: CUDA error: invalid device ordinal`.
    """,
    fix="""
        Use comma-separated indices (or `GPU-...` UUIDs from `nvidia-smi -L`) that exist, each once, and make CUDA
        number GPUs like `nvidia-smi`. Set both before Python starts, or at least before anything initialises CUDA:

        ```console
        $ nvidia-smi -L
        $ export CUDA_DEVICE_ORDER=PCI_BUS_ID
        $ export CUDA_VISIBLE_DEVICES=0,1
        $ python train.py
        ```
    """,
    bad=Example(
        """
            $ nvidia-smi -L
            GPU 0: NVIDIA GeForce RTX 3090 (UUID: GPU-...)
            GPU 1: NVIDIA GeForce RTX 4090 (UUID: GPU-...)
            $ CUDA_VISIBLE_DEVICES=0 python train.py    # CUDA's 0 is the faster 4090, nvidia-smi's GPU 1
            $ CUDA_VISIBLE_DEVICES=1,2 python train.py  # there is no GPU 2
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    good=Example(
        """
            $ CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0 python train.py
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    details={
        "env": """
            It reads the two variables from the environment `torchdoctor env` runs in and the GPU list from NVML:

            - **warning**: an entry that is not an index, a `GPU-` UUID (prefix) or a `MIG-` id, or a repeated entry;
            - **warning**: an index ≥ the number of GPUs, or a UUID matching no GPU;
            - **info**: the value is empty or `-1` while GPUs exist (hiding them is often deliberate);
            - **warning**: GPU models differ and `CUDA_DEVICE_ORDER` is not `PCI_BUS_ID`.

            Without NVML (no driver) only the format is checked. A machine whose GPUs are all the same model is not
            warned about the device order. Changing `CUDA_VISIBLE_DEVICES` inside a script after CUDA has initialised
            cannot be seen from `torchdoctor env`.
        """,
    },
)


@CUDA_VISIBLE_DEVICES.env
def cuda_visible_devices(facts: EnvFacts) -> Iterator[Finding]:
    """A malformed CUDA_VISIBLE_DEVICES, one naming absent GPUs, or mixed GPUs in CUDA's order."""
    gpus = facts.nvidia.gpus
    value = facts.env_vars.get("CUDA_VISIBLE_DEVICES")
    if value is not None:
        tokens = value.split(",")
        if value.strip() in ("", "-1"):
            if gpus:
                yield Finding(
                    f"CUDA_VISIBLE_DEVICES={value!r} hides all {len(gpus)} GPU(s): torch.cuda.is_available() is False.",
                    fix=Fix(
                        title="unset CUDA_VISIBLE_DEVICES (or list the GPUs to use, e.g. CUDA_VISIBLE_DEVICES=0,1)"
                    ),
                    severity=Severity.INFO,
                )
        else:
            bad = next((t for t in tokens if not _VISIBLE_TOKEN.match(t)), None)
            stripped = [t.strip() for t in tokens]
            dupes = sorted({t for t in stripped if stripped.count(t) > 1})
            if bad is not None or dupes:
                reason = (
                    f"CUDA stops reading at the invalid entry {bad!r}, so the GPUs after it are hidden"
                    if bad is not None
                    else f"it lists {', '.join(dupes)} twice, which makes CUDA see no GPU at all"
                )
                yield Finding(
                    f"CUDA_VISIBLE_DEVICES={value!r} is malformed: {reason}.",
                    fix=Fix(
                        title="List GPU indices or full UUIDs (`nvidia-smi -L`), comma-separated, e.g. "
                        "CUDA_VISIBLE_DEVICES=0,1"
                    ),
                )
            elif gpus:
                uuids = {g.uuid for g in gpus if g.uuid}
                absent = [
                    t
                    for t in stripped
                    if (t.isdigit() and int(t) >= len(gpus))
                    or (t.startswith("GPU-") and uuids and not any(u.startswith(t) for u in uuids))
                ]
                if absent:
                    yield Finding(
                        f"CUDA_VISIBLE_DEVICES={value!r} names {', '.join(absent)}, but this machine has "
                        f"{len(gpus)} GPU(s) (0-{len(gpus) - 1}): CUDA stops at the first absent one.",
                        fix=Fix(title=f"Pick GPUs that exist: `nvidia-smi -L` lists them (indices 0-{len(gpus) - 1})."),
                    )
    models = {g.name for g in gpus}
    if len(models) > 1 and facts.env_vars.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        listing = ", ".join(f"{g.index}: {g.name}" for g in gpus)
        yield Finding(
            f"This machine mixes GPU models ({listing}) and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA numbers "
            "GPUs fastest-first, nvidia-smi by PCI bus, so cuda:0 and CUDA_VISIBLE_DEVICES=0 may not be "
            "nvidia-smi's GPU 0.",
            fix=Fix(title="export CUDA_DEVICE_ORDER=PCI_BUS_ID (before Python starts, or before CUDA is initialised)"),
        )
