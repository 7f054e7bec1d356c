"""low-resources: little free RAM, or little free disk where you run."""
from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Location, Pitfall, byte_size
from torchdoctor.sdk.env import EnvFacts

from ._envutil import GiB, MACHINE_STATE

LOW_RAM = 1 * GiB
LOW_DISK = 2 * GiB

LOW_RESOURCES = Pitfall(
    code="TD115",
    name="low-resources",
    severity="warning",
    summary="Little free RAM, or little free disk where you run.",
    why="""
        Little RAM is available, or little disk space is free on the disk holding the directory you run from.
        Training then dies in ways that do not mention memory or disk: killed DataLoader workers, and checkpoints
        that stop half-way and cannot be loaded again.

        DataLoader workers, `torch.load` of a large checkpoint and dataset caching all need RAM; when it runs out, the
        kernel's OOM killer ends a process:

        ```text
        RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.
        ```

        A full disk makes `torch.save` fail mid-write and leaves a truncated file:

        ```text
        RuntimeError: [enforce fail at inline_container.cc:...] . PytorchStreamWriter failed writing file data/5:
        file write failed
        RuntimeError: [enforce fail at inline_container.cc:...] . unexpected pos 322619584 vs 322619472
        OSError: [Errno 28] No space left on device
        ```

        Loading such a checkpoint later fails with
        `RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory`.
    """,
    fix="""
        ```console
        $ free -h                                   # what is available
        $ ps aux --sort=-rss | head                 # who uses the memory
        $ df -h .                                   # free space where you run
        $ du -sh ~/.cache/torch ~/.cache/huggingface ./checkpoints
        ```

        Stop other jobs or lower `num_workers`; load big checkpoints with `torch.load(path, mmap=True)`; delete old
        checkpoints and caches, or save checkpoints to a larger disk.
    """,
    bad=Example(
        """
            import torch

            # 60 GB of checkpoints already on a 64 GB disk; one more will not fit
            torch.save(model.state_dict(), f"checkpoints/epoch{epoch}.pt")
        """,
        unseen={"env": MACHINE_STATE},
    ),
    good=Example(
        """
            import os
            import shutil
            import torch

            path = f"checkpoints/epoch{epoch}.pt"
            tmp = path + ".tmp"
            torch.save(model.state_dict(), tmp)  # a failed write never replaces the last good checkpoint
            os.replace(tmp, path)
            old = f"checkpoints/epoch{epoch - 3}.pt"
            if os.path.exists(old):
                os.remove(old)  # keep only the last three
            print(shutil.disk_usage("checkpoints").free // 2**30, "GiB free")
        """,
        unseen={"env": MACHINE_STATE},
    ),
    details={
        "env": """
            With psutil: a warning when available RAM is below 1 GiB or below 5 % of total RAM, and a warning when free
            space on the disk holding the working directory is below 2 GiB or below 2 % of that disk. It looks only at
            the working directory's disk: run `torchdoctor env` from where you save checkpoints. Swap, GPU memory (see
            [gpu-memory-held](gpu-memory-held.md)) and `/dev/shm` (see [shm-too-small](shm-too-small.md)) are not part
            of
            this check.
        """,
    },
)


@LOW_RESOURCES.env
def low_resources(facts: EnvFacts) -> Iterator[Finding]:
    """Available RAM or free disk below an absolute or relative floor."""
    s = facts.system
    if s.memory_available is not None and s.memory_total and (
            s.memory_available < LOW_RAM or s.memory_available < 0.05 * s.memory_total):
        yield Finding(
            f"Only {byte_size(s.memory_available)} of {byte_size(s.memory_total)} RAM is available: DataLoader workers and "
            "torch.load will be OOM-killed ('DataLoader worker ... is killed by signal: Killed').",
            fix="Stop other jobs (`ps aux --sort=-rss | head`), lower num_workers, or load checkpoints with mmap=True.",
        )
    if s.disk_free is not None and s.disk_total and (s.disk_free < LOW_DISK or s.disk_free < 0.02 * s.disk_total):
        yield Finding(
            f"Only {byte_size(s.disk_free)} free on the disk holding {s.disk_path}: torch.save of a checkpoint can fail "
            "half-way and leave a truncated file ('PytorchStreamReader failed reading zip archive').",
            fix="Free space (old checkpoints, ~/.cache/torch, ~/.cache/huggingface) or save checkpoints elsewhere.",
            location=Location(file=s.disk_path),
        )
