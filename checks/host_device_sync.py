"""host-device-sync: every step blocks the CPU until the GPU catches up (.item(), .cpu(), printing a CUDA tensor)."""

from __future__ import annotations

import linecache
import re
import sys
import warnings
from typing import Any, Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import RuntimeCheck, StepEvent, is_library

SAMPLES = 3  # steps watched under torch.cuda.set_sync_debug_mode("warn"), after the first
SHOWN = 3  # lines named in one message
_MESSAGE = r".*synchronizing CUDA operation"
# frames of these packages are not the user's line; a sync made inside torchdoctor, torch.amp (GradScaler) or an
# optimizer is not one the user can move

_NEEDS_GPU = "it takes a CUDA GPU (torch.cuda.set_sync_debug_mode); the examples run on the CPU."

HOST_DEVICE_SYNC = Pitfall(
    code="TD344",
    name="host-device-sync",
    severity="info",
    summary="Every step blocks the CPU until the GPU has finished (.item(), .cpu(), printing or branching on a "
    "CUDA tensor): the GPU runs dry at each of them.",
    why="""
        CUDA runs asynchronously: the CPU queues kernels and races ahead while the GPU works through them, so the
        next step's work is queued before the GPU needs it. Reading a value back — `loss.item()`, `.cpu()`,
        `.tolist()`, `print(tensor)`, `if tensor > 0:`, `torch.nonzero`, indexing with a boolean mask — makes the
        CPU wait until the GPU has computed it; then the GPU waits, empty, for the CPU to queue more. Once per
        step, for logging, this can cost a large part of the step on small and medium models.
    """,
    fix="""
        Keep per-step values on the GPU (`running_loss += loss.detach()`) and read them every N steps; log
        with `if step % 100 == 0:`; avoid data-dependent Python branches on tensors inside the step.
    """,
    bad=Example(
        """
        for step, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = criterion(model(x.to("cuda")), y.to("cuda"))
            loss.backward()
            optimizer.step()
            print(f"step {step}: loss {loss.item():.4f}")
        """,
        unseen={"runtime": _NEEDS_GPU},
    ),
    good=Example(
        """
        for step, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = criterion(model(x.to("cuda")), y.to("cuda"))
            loss.backward()
            optimizer.step()
            if step % 100 == 0:
                print(f"step {step}: loss {loss.item():.4f}")
        """,
        unseen={"runtime": _NEEDS_GPU},
    ),
    details={
        "runtime": """
            When a watched model is on a CUDA GPU, `watch` turns on `torch.cuda.set_sync_debug_mode("warn")` for
            3 steps after the first one, collects the synchronising operations it reports (silently: they are
            not shown to the user), and puts it back. Each is attributed to the innermost line of the user's code
            that led to it; a line that synchronised in every one of those steps is reported, with the line.
            Syncs inside `optimizer.step()`, `GradScaler`, torch.distributed or torchdoctor itself are left
            out. The sync debug mode does not see every synchronising operation (torch documents it as
            experimental), so a quiet report is not proof of none.
        """,
    },
)


def debug_mode(mode: str) -> None:
    """torch.cuda.set_sync_debug_mode (its own function, so that a CPU test can stand in for it)."""
    import torch

    torch.cuda.set_sync_debug_mode(mode)


def on_cuda(model: Any) -> bool:
    return any(p.is_cuda for p in list(model.parameters())[:1])


@HOST_DEVICE_SYNC.runtime
class HostDeviceSync(RuntimeCheck):
    """Steps 1 to 3 under the sync debug mode: the user lines that synchronised in every one of them."""

    def on_start(self) -> None:
        self.cuda = False
        self.models_seen = 0  # models looked at: `torchdoctor run` (and watch) adopt models as they train
        self.sampling = self.done = self.in_step = False
        self.current: dict[tuple[str, int], int] = {}
        self.steps: list[dict[tuple[str, int], int]] = []
        self.filter: Optional[tuple[Any, ...]] = None
        self.shown: Any = None

    def on_step_pre(self, event: StepEvent) -> None:
        self.in_step = True

    def on_step_post(self, event: StepEvent) -> Optional[list[Finding]]:
        self.in_step = False
        if not self.cuda and len(self.ctx.models) != self.models_seen:  # a model adopted since
            self.models_seen = len(self.ctx.models)
            self.cuda = any(on_cuda(wm.inner) for wm in self.ctx.models)
        if not self.cuda or self.done or event.optimizer is not self.ctx.optimizers[0]:
            return None  # the every-step path on the CPU or once sampled: no generator made
        if not self.sampling:
            self._begin()
            return None
        self.steps.append(self.current)
        self.current = {}
        if len(self.steps) < SAMPLES:
            return None
        self._end()
        return list(self._judge(event.step))

    def on_stop(self) -> None:
        self._end()

    def _begin(self) -> None:
        self.sampling = True
        warnings.filterwarnings("always", message=_MESSAGE)
        self.filter = warnings.filters[0]
        self.shown = warnings.showwarning
        warnings.showwarning = self._show
        debug_mode("warn")

    def _end(self) -> None:
        if not self.sampling:
            return
        self.sampling, self.done = False, True
        try:
            debug_mode("default")
        finally:
            filters: list[Any] = warnings.filters  # type: ignore[assignment]
            if self.filter in filters:
                filters.remove(self.filter)
                warnings._filters_mutated()  # type: ignore[attr-defined]
            if warnings.showwarning == self._show:
                warnings.showwarning = self.shown

    def _show(
        self, message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Optional[str] = None
    ) -> None:
        if not re.match(_MESSAGE, str(message)):
            self.shown(message, category, filename, lineno, file, line)
            return
        if self.in_step:
            return
        site = _user_line(sys._getframe(1))
        if site is not None:
            self.current[site] = self.current.get(site, 0) + 1

    def _judge(self, step: int) -> Iterator[Finding]:
        every = set(self.steps[0]).intersection(*self.steps[1:])
        if not every:
            return
        sites = sorted(every)
        shown = "; ".join(f"{file}:{line} `{linecache.getline(file, line).strip()}`" for file, line in sites[:SHOWN])
        more = f" and {len(sites) - SHOWN} more" if len(sites) > SHOWN else ""
        per_step = sum(min(s[site] for s in self.steps) for site in sites)
        file, line = sites[0]
        yield Finding(
            f"each of steps {step - SAMPLES + 1}-{step} waited for the GPU at least {per_step} time(s), at the same "
            f"line(s) every step: {shown}{more}. Each wait drains the GPU's queue of work.",
            fix=Fix(
                title="Read values back every N steps, not every step (keep running sums on the GPU), e.g.:",
                code="if step % 100 == 0:",
            ),
            location=Location(file=file, line=line),
        )


def _user_line(frame: Any) -> Optional[tuple[str, int]]:
    """The innermost frame of the user's code that led to a sync, or None when the way there passes through
    torchdoctor, an optimizer, torch.amp (GradScaler) or torch.distributed (nothing the user can move)."""
    import os

    import torch

    import torchdoctor.sdk

    base = os.path.dirname(torch.__file__)
    theirs = tuple(os.path.join(base, part) + os.sep for part in ("amp", "optim", "distributed")) + (
        os.path.dirname(os.path.dirname(torchdoctor.sdk.__file__)) + os.sep,
        os.path.dirname(__file__) + os.sep,
    )
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(theirs):
            return None
        if not is_library(frame):
            return filename, frame.f_lineno
        frame = frame.f_back
    return None
