"""low-resources: little free RAM, or little free disk where you run."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall, byte_size
from torchdoctor.sdk.env import EnvFacts

from ._envutil import MACHINE_STATE, GiB

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
            space on the disk holding the working directory is below 2 GiB or below 2 % of that disk. Inside a
            container whose cgroup (v1 `memory.limit_in_bytes` or v2 `memory.max`, the tightest along the process's
            cgroup and its ancestors) allows less than the host has, the limit and the cgroup's usage replace the
            host's RAM figures, which psutil reports. Free space where `TMPDIR`, `TORCH_HOME` and `HF_HOME` (their
            defaults when unset) point is checked against 2 GiB too. Run `torchdoctor env` from where you save
            checkpoints. Swap, GPU memory (see
            [gpu-memory-held](gpu-memory-held.md)) and `/dev/shm` (see [shm-too-small](shm-too-small.md)) are not part
            of
            this check.
        """,
    },
)


@LOW_RESOURCES.env
def low_resources(facts: EnvFacts) -> Iterator[Finding]:
    """Available RAM (within a container's memory limit) or free disk below an absolute or relative floor."""
    s = facts.system
    total, available, where = s.memory_total, s.memory_available, "RAM"
    limit = s.cgroup_memory_limit
    if limit is not None and (total is None or limit < total):
        total = limit
        where = f"this container may use (its cgroup memory limit; the host has {byte_size(s.memory_total)})"
        if s.cgroup_memory_used is not None:
            available = max(0, min(available if available is not None else limit, limit - s.cgroup_memory_used))
    if available is not None and total and (available < LOW_RAM or available < 0.05 * total):
        yield Finding(
            f"Only {byte_size(available)} of {'the ' if where != 'RAM' else ''}{byte_size(total)} {where} is "
            f"available: "
            "DataLoader workers and "
            "torch.load will be OOM-killed ('DataLoader worker ... is killed by signal: Killed').",
            fix=Fix(
                title="Stop other jobs (`ps aux --sort=-rss | head`), lower num_workers, or load checkpoints with "
                "mmap=True"
                + (", or give the container more memory (`docker run --memory=...`)." if where != "RAM" else ".")
            ),
        )
    disks = [("the working directory", s.disk_path, s.disk_free, s.disk_total)]
    disks += [(name, path, free, None) for name, (path, free) in sorted(s.cache_free.items())]
    for what, path, free, size in disks:
        if free is None or not (free < LOW_DISK or (size and free < 0.02 * size)):
            continue
        if what != "the working directory":
            yield Finding(
                f"Only {byte_size(free)} free for {what} ({path}): downloads of weights and datasets, and "
                "temporary files (torch.compile, DataLoader), fail half-way with 'No space left on device'.",
                fix=Fix(
                    title=f"Free space there, or point {what} at a disk with room (`export {what}=/big/disk/...`)."
                ),
                location=Location(file=path),
            )
        else:
            yield Finding(
                f"Only {byte_size(free)} free on the disk holding {path}: torch.save of a checkpoint can fail "
                "half-way and leave a truncated file ('PytorchStreamReader failed reading zip archive').",
                fix=Fix(
                    title="Free space (old checkpoints, ~/.cache/torch, ~/.cache/huggingface) or save "
                    "checkpoints elsewhere."
                ),
                location=Location(file=path),
            )
