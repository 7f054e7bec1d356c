"""open-files-limit: the open-files limit (`ulimit -n`) is too low for DataLoader workers."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Pitfall, Severity
from torchdoctor.sdk.env import EnvFacts

from ._envutil import MACHINE_STATE

LOW_NOFILE = 1024  # below this: a warning
COMFORTABLE_NOFILE = 4096  # below this, when the hard limit allows more: a note

OPEN_FILES_LIMIT = Pitfall(
    code="TD119",
    name="open-files-limit",
    severity="warning",
    summary="The open-files limit (`ulimit -n`) is too low for DataLoader workers.",
    why="""
        DataLoader workers hand tensors to the main process through shared memory, and with the default sharing
        strategy (`file_descriptor`) every tensor in flight holds an open file descriptor. Several workers,
        `prefetch_factor` batches each and batches of many tensors (dicts of crops, lists of samples) exceed a low
        limit:

        ```text
        RuntimeError: received 0 items of ancdata
        OSError: [Errno 24] Too many open files
        ```
    """,
    fix="""
        Raise the soft limit up to the hard limit in the shell or job script that starts training, or switch the
        sharing strategy:

        ```console
        $ ulimit -n 65536            # up to `ulimit -Hn`
        ```

        or in Python, `torch.multiprocessing.set_sharing_strategy("file_system")` (uses file names instead of
        descriptors; leftover files in /dev/shm after crashes are the price).
    """,
    bad=Example(
        """
            $ ulimit -n 256
            $ python train.py            # DataLoader(num_workers=8)
            RuntimeError: received 0 items of ancdata
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    good=Example(
        """
            $ ulimit -n 65536
            $ python train.py
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    details={
        "env": """
            Reads the soft and hard `RLIMIT_NOFILE` with `resource.getrlimit` (not on Windows). A soft limit below
            1024 is a warning; below 4096, when the hard limit allows more, a note with the `ulimit -n` that raises
            it. 4096 and more, or unlimited, is not reported.
        """,
    },
)


@OPEN_FILES_LIMIT.env
def open_files_limit(facts: EnvFacts) -> Iterator[Finding]:
    """A soft open-files limit low enough for DataLoader workers to run out of descriptors."""
    soft, hard = facts.system.open_files_soft, facts.system.open_files_hard
    if soft is None or soft >= COMFORTABLE_NOFILE:
        return
    raise_to = min(hard, 65536) if hard else 65536
    if soft >= LOW_NOFILE and (hard is not None and hard <= soft):
        return  # nothing this user can raise it to
    fix = (
        f"`ulimit -n {raise_to}` in the shell or job script that starts training"
        if hard is None or hard > soft
        else "Ask for a higher hard limit (limits.conf / the container's --ulimit)"
    )
    yield Finding(
        f"The open-files limit is {soft} (hard limit {hard if hard is not None else 'unlimited'}): DataLoader "
        "workers passing many tensors per batch run out of descriptors ('received 0 items of ancdata', "
        "'Too many open files').",
        fix=Fix(title=fix + ', or `torch.multiprocessing.set_sharing_strategy("file_system")`.'),
        severity=Severity.WARNING if soft < LOW_NOFILE else Severity.INFO,
    )
