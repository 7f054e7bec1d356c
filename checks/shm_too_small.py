"""shm-too-small: /dev/shm is too small for DataLoader workers (Docker's default is 64 MiB)."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall, byte_size
from torchdoctor.sdk.env import EnvFacts

from ._envutil import MACHINE_STATE, GiB

SHM_MIN = 1 * GiB

SHM_TOO_SMALL = Pitfall(
    code="TD111",
    name="shm-too-small",
    severity="warning",
    summary="/dev/shm is too small for DataLoader workers (Docker's default is 64 MiB).",
    why="""
        `/dev/shm` is smaller than 1 GiB. DataLoader workers hand every batch to the main process through shared
        memory, and NCCL uses it between processes on the same machine. Docker gives containers only 64 MiB by
        default, which is too small for almost any real batch.

        When `/dev/shm` fills up, workers are killed mid-epoch, often only once batches get large or `num_workers`
        goes up:

        ```text
        RuntimeError: DataLoader worker (pid 11011) is killed by signal: Bus error. It is possible that dataloader's
        workers are out of shared memory. Please try to raise your shared memory limit.
        ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).
        ```

        Multi-GPU jobs fail in NCCL with
        `NCCL WARN Error while creating shared memory segment /dev/shm/nccl-... error: No space left on device (28)`.
    """,
    fix="""
        Give the container more shared memory (or the host's IPC namespace):

        ```console
        $ docker run --gpus all --shm-size=8g my-image python train.py
        $ docker run --gpus all --ipc=host my-image python train.py
        $ df -h /dev/shm                       # check inside the container
        ```

        In docker compose set `shm_size: "8gb"`; on Kubernetes mount an `emptyDir` with `medium: Memory` at `/dev/shm`.
        If you cannot change the container, `DataLoader(num_workers=0)` avoids shared memory for batches (slower),
        and `NCCL_SHM_DISABLE=1` makes NCCL use other transports.
    """,
    bad=Example(
        """
            $ docker run --gpus all my-image df -h /dev/shm
            Filesystem      Size  Used Avail Use% Mounted on
            shm              64M     0   64M   0% /dev/shm
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    good=Example(
        """
            $ docker run --gpus all --shm-size=8g my-image df -h /dev/shm
            Filesystem      Size  Used Avail Use% Mounted on
            shm             8.0G     0  8.0G   0% /dev/shm
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    details={
        "env": """
            It reads the size and free space of `/dev/shm` with `os.statvfs` and reports a warning when the size is
            below 1 GiB, whether or not you run in a container, or when the size is enough but less than 1 GiB of it
            is free (leftover segments of killed workers or crashed jobs). Machines without
            `/dev/shm` (macOS, Windows) are not reported; on a normal Linux host `/dev/shm` is half the RAM and passes.
        """,
    },
)


@SHM_TOO_SMALL.env
def shm_too_small(facts: EnvFacts) -> Iterator[Finding]:
    """/dev/shm smaller than DataLoader workers and NCCL need."""
    shm, free = facts.system.shm_total, facts.system.shm_free
    if shm is not None and shm >= SHM_MIN and free is not None and free < SHM_MIN:
        yield Finding(
            f"/dev/shm is {byte_size(shm)} but only {byte_size(free)} is free: segments left by killed DataLoader "
            "workers or crashed jobs fill it, and the next workers die with 'Bus error' / 'No space left on device'.",
            fix=Fix(
                title="See what fills it (`ls -la --sort=size /dev/shm | head`; `df -h /dev/shm`) and delete the "
                "segments "
                "of processes that are gone (torch_*, nccl-*, psm_*), or stop the jobs that hold them."
            ),
            location=Location(file="/dev/shm"),
        )
    if shm is None or shm >= SHM_MIN:
        return
    yield Finding(
        f"/dev/shm is only {byte_size(shm)}: DataLoader workers pass batches through it and die with "
        "'RuntimeError: DataLoader worker (pid N) is killed by signal: Bus error', and NCCL fails with "
        "'No space left on device'.",
        fix=Fix(
            title="Give the container more shared memory: `docker run --shm-size=8g ...` (or `--ipc=host`); on "
            "Kubernetes mount an emptyDir with medium: Memory at /dev/shm. As a stop-gap: DataLoader(num_workers=0)."
        ),
        location=Location(file="/dev/shm"),
    )
