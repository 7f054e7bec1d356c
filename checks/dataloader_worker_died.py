"""dataloader-worker-died: a DataLoader worker process died (bus error: shared memory; killed: RAM)."""

from __future__ import annotations

import re
from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall, byte_size
from torchdoctor.sdk.runtime import CrashEvent, LoaderEvent, RuntimeCheck

_SETUP = """
import os, signal
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

model = nn.Linear(4, 3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
MAIN = os.getpid()

class Images(Dataset):
    def __len__(self):
        return 32
    def __getitem__(self, i):
        if i == 12 and os.getpid() != MAIN:  # what a worker that outgrows /dev/shm receives
            os.kill(os.getpid(), signal.SIGBUS)
        return torch.randn(4), i % 3
"""

DATALOADER_WORKER_DIED = Pitfall(
    code="TD332",
    name="dataloader-worker-died",
    severity="error",
    summary="A DataLoader worker process died: a bus error means shared memory (/dev/shm) ran out, a kill "
    "means RAM ran out.",
    why="""
        DataLoader workers hand every batch to the training process through shared memory (`/dev/shm`).
        Docker gives a container 64 MiB of it by default, so a few batches of images are enough: the worker
        gets SIGBUS and the training process only says "DataLoader worker (pid 1234) exited unexpectedly".
        When the kernel's out-of-memory killer ends a worker instead ("killed by signal: Killed"), RAM ran
        out: each worker holds its own copy of whatever the dataset object keeps in Python lists (reference
        counts make copy-on-write pages copied), so memory grows with `num_workers`.
    """,
    fix="""
        For a bus error: more shared memory (`docker run --shm-size=8g ...` or `--ipc=host`; in Kubernetes an
        `emptyDir` with `medium: Memory` mounted at `/dev/shm`), or fewer workers / smaller batches, or
        `num_workers=0` (batches made in the training process need no shared memory). The "file_system"
        sharing strategy does not help: it keeps its files in `/dev/shm` too.
        For a kill: fewer workers, and keep the dataset's bulk data in numpy arrays or memory-mapped files
        instead of Python lists of objects. Any other death: run once with `num_workers=0` to see the
        worker's own error.
    """,
    bad=Example(
        """
        dataset = Images()
        loader = DataLoader(dataset, batch_size=8, num_workers=2)
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        dataset = Images()
        loader = DataLoader(dataset, batch_size=8, num_workers=0)  # in-process: no shared memory to run out of
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        """,
        setup=_SETUP,
    ),
    details={
        "runtime": """
            The check remembers the last DataLoader with worker processes that started a pass. When the
            watched code (or the program, under `torchdoctor run`) ends with the DataLoader's "worker ...
            exited unexpectedly" / "killed by signal" error, it reads the signal from the chain of
            exceptions and measures what that signal points at: the size and free space of `/dev/shm` for a
            bus error, total and available RAM for a kill; with the loader's `num_workers` and
            `batch_size`. Quiet for any other exception.
        """,
    },
)

_SIGNAL = re.compile(r"killed by signal: ([A-Za-z ]+)")
_DIED = re.compile(r"DataLoader worker \(pids?(?:\(s\))? [\d, ]+\) (?:exited unexpectedly|is killed by signal)")


@DATALOADER_WORKER_DIED.runtime
class DataLoaderWorkerDied(RuntimeCheck):
    """At a crash: a dead DataLoader worker, explained from /dev/shm, RAM and the loader's settings."""

    def on_start(self) -> None:
        self.settings = ""  # of the last DataLoader with workers that started a pass (numbers only)
        self.workers, self.batch = 0, "batch_size"  # its num_workers, and its batch_size as code

    def on_loader_iter(self, event: LoaderEvent) -> None:
        loader = event.loader
        if getattr(loader, "num_workers", 0):
            self.workers = int(loader.num_workers)
            size = getattr(loader, "batch_size", None)
            self.batch = str(size) if isinstance(size, int) else "batch_size"
            self.settings = (
                f" (the DataLoader had num_workers={loader.num_workers}, "
                f"batch_size={getattr(loader, 'batch_size', None)}"
                f"{', pin_memory=True' if getattr(loader, 'pin_memory', False) else ''})"
            )

    def on_crash(self, event: CrashEvent) -> Iterator[Finding]:
        from torchdoctor.sdk.runtime import evidence

        chain = list(evidence.iter_exceptions(event.exception))
        if not any(isinstance(e, RuntimeError) and _DIED.search(str(e)) for e in chain):
            return
        signal = next((m.group(1).strip() for e in chain if (m := _SIGNAL.search(str(e)))), None)
        head = (
            f"A DataLoader worker died at step {self.ctx.step}"
            + (f", killed by signal {signal}" if signal else "")
            + self.settings
        )
        if signal == "Bus error":
            yield Finding(
                head + ": " + _shm_text(),
                fix=Fix(
                    title="Give the container more shared memory (`docker run --shm-size=8g ...` or `--ipc=host`), "
                    "or make the batches in the training process, which needs no shared memory (slower):",
                    code=f"loader = DataLoader(dataset, batch_size={self.batch}, num_workers=0)",
                ),
                location=Location(file="/dev/shm"),
            )
        elif signal == "Killed":
            yield Finding(
                head + ": " + _ram_text(),
                fix=Fix(
                    title="Use fewer workers, and keep the dataset's bulk data in numpy arrays or memory-mapped "
                    "files (Python lists of objects are copied into every worker as their reference counts change):",
                    code=f"loader = DataLoader(dataset, batch_size={self.batch}, num_workers={self.workers // 2})",
                ),
            )
        else:
            yield Finding(
                head
                + ": the worker ended without saying why"
                + (f" ({signal})" if signal else "")
                + ". "
                + _shm_text()
                + " "
                + _ram_text(),
                fix=Fix(
                    title="Run once with the workers in-process to see the worker's own error:",
                    code=f"loader = DataLoader(dataset, batch_size={self.batch}, num_workers=0)",
                ),
            )


def _shm_text() -> str:
    import shutil

    try:
        usage = shutil.disk_usage("/dev/shm")
    except OSError:
        return "/dev/shm could not be measured."
    small = " — Docker's default, too small for batches of images" if usage.total <= 64 << 20 else ""
    return (
        f"/dev/shm, through which workers hand over batches, is {byte_size(usage.total)} "
        f"({byte_size(usage.free)} free now){small}."
    )


def _ram_text() -> str:
    import psutil

    ram = psutil.virtual_memory()
    return (
        f"the kernel ended it, which it does when memory runs out: RAM {byte_size(ram.total)}, "
        f"{byte_size(ram.available)} available now."
    )
