"""recompiling: torch.compile compiles the same code again and again, or the compiled step has graph breaks."""

from __future__ import annotations

import logging
import re
from typing import Any, Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import RuntimeCheck, StepEvent

RECOMPILES = 4  # recompilations of one function during the session (the first compile not counted)
SHOWN = 3  # graph-break sites named in one message

_SETUP = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.CrossEntropyLoss()
batches = [(torch.randn(n, 16), torch.randint(0, 4, (n,))) for n in range(2, 12)]  # batch sizes vary
"""

RECOMPILING = Pitfall(
    code="TD342",
    name="recompiling",
    severity="warning",
    summary="torch.compile recompiles the model again and again (a new shape or Python value each step), "
    "or the compiled code breaks into several graphs.",
    why="""
        `torch.compile` specialises the code it compiles to what it saw: tensor shapes, dtypes, Python ints
        and flags, and guards that they stay so. When a guard fails it compiles again. Inputs whose shape
        changes every step under `dynamic=False` (variable sequence lengths, ragged last batches), or a Python
        number that changes (a step counter, a random choice passed as an int), make it compile over and over:
        each compile costs seconds to minutes, and after `torch._dynamo.config.recompile_limit` (8) compiles
        it gives up and runs that function uncompiled for the rest of the run. Graph breaks (`.item()`,
        `print`, data-dependent Python branches, unsupported calls) split the step into several graphs that
        run with Python in between, losing most of the speed-up.
    """,
    fix="""
        For changing shapes, compile with `dynamic=True` (or mark the changing dimension with
        `torch._dynamo.mark_dynamic(x, 0)`, or pad to a few fixed sizes); pass changing numbers as tensors.
        For graph breaks, remove the breaking call from the compiled code (the finding names its line): log
        outside the model, keep values as tensors, or compile the part without it.
    """,
    bad=Example(
        """
        model = torch.compile(model, backend="eager", dynamic=False)
        for x, y in batches:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        model = torch.compile(model, backend="eager", dynamic=True)
        for x, y in batches:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
        """,
        setup=_SETUP,
    ),
    details={
        "runtime": """
            `watch` reads dynamo's own record of guard failures (`torch._dynamo.utils.guard_failures`, one
            reason per cached graph each time a function is compiled again) and counts the recompilations of
            each compiled function since the session started. It reports a function compiled again 4 times or
            more for a changing shape or value (the guard that failed last is quoted: a size mismatch means
            changing shapes), and any function that reached the recompile limit. Recompilations for the mode
            a function is called under (grad mode, autocast, train/eval) are counted only towards the limit:
            there are few combinations, so they stop once each was compiled. While the session runs it also
            listens to dynamo's graph-break log (its `graph_breaks` artifact logger, set to debug level for the
            session and restored after) and reports each compiled function that broke into several graphs,
            with the line and reason of each break. The examples use `backend="eager"` to compile in
            milliseconds; the default inductor backend recompiles the same way. Quiet: a compiled model with
            static shapes; the one recompilation with which dynamo marks a changed dimension dynamic
            (`dynamic=None`, the default); a model evaluated every few steps under `torch.no_grad()` and
            `eval()` (one more compiled version, then none), including when its forward computes the loss.
        """,
    },
)

# Guards on the mode a function runs under (grad mode, autocast, a module's train/eval flag): there are few
# combinations, so the recompilations they cause stop once each was compiled (an evaluation under no_grad and
# eval() every N steps: one more version, then none); they are reported only when they reach the limit
_MODE = re.compile(r"GLOBAL_STATE changed|\.training\b|grad_mode|autocast|inference_mode|is_grad_enabled", re.I)
_SIZE = re.compile(r"size mismatch|stride mismatch|dim\(\) mismatch|rank mismatch", re.I)
_BREAK = re.compile(
    r"in user code at (?P<file>.+?):(?P<line>\d+)\nGraph Break Reason: (?P<reason>.*?)(\nUser code|$)", re.S
)


class _BreakLog(logging.Handler):
    """Collects dynamo's graph-break records: (file, line) -> reason."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.sites: dict[tuple[str, int], str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        try:
            match = _BREAK.search(record.getMessage())
        except Exception:
            return
        if match and len(self.sites) < 64:
            self.sites.setdefault((match["file"], int(match["line"])), _reason(match["reason"]))


@RECOMPILING.runtime
class Recompiling(RuntimeCheck):
    """Recompilations per compiled function since the start, and graph breaks while the session runs."""

    def on_start(self) -> None:
        self.reported: set[str] = set()
        self.breaks_said: set[tuple[str, int]] = set()
        self.failures, self.seen = _guard_failures(), {}
        if self.failures is not None:
            self.seen = {code: len(reasons) for code, reasons in list(self.failures.items())}
        self.log: Optional[logging.Logger] = None
        self.handler = _BreakLog()
        try:
            from torch._dynamo.symbolic_convert import graph_break_log
        except Exception:  # a torch without dynamo's graph-break log: recompiles only
            return
        self.log, self.saved = graph_break_log, (graph_break_log.level, graph_break_log.propagate)
        graph_break_log.setLevel(logging.DEBUG)
        graph_break_log.propagate = False  # debug records go to this session only, never to the user's handlers
        graph_break_log.addHandler(self.handler)

    def on_periodic(self, event: StepEvent) -> Iterator[Finding]:
        yield from self._judge()

    def on_stop(self) -> Iterator[Finding]:
        try:
            yield from self._judge()
        finally:
            if self.log is not None:
                self.log.removeHandler(self.handler)
                if not any(isinstance(h, _BreakLog) for h in self.log.handlers):  # the last session to leave
                    self.log.setLevel(self.saved[0])
                    self.log.propagate = self.saved[1]

    def _judge(self) -> Iterator[Finding]:
        if self.failures is not None:
            for code, reasons in list(self.failures.items()):
                where = self._name(code)
                if where in self.reported:
                    continue
                before = _recompiles(reasons[: self.seen.get(code, 0)])
                new = _recompiles(reasons[self.seen.get(code, 0) :])
                growing = [r for r in new if not all(_MODE.search(reason) for reason in r)]
                limit = _limit()
                gave_up = bool(new) and len(before) + len(new) + 1 >= limit
                if len(growing) >= RECOMPILES or gave_up:
                    self.reported.add(where)
                    yield self._recompiles(where, code, len(new), growing or new, limit if gave_up else None)
        sites = [s for s in self.handler.sites if s not in self.breaks_said]
        if sites:
            self.breaks_said.update(sites)
            yield from self._breaks(sites)

    def _recompiles(
        self, where: str, code: Any, recompiles: int, causes: list[list[str]], limit: Optional[int]
    ) -> Finding:
        last = causes[-1]
        reason = next((r for r in last if not _MODE.search(r)), last[0])
        reason = re.sub(r"^\d+/\d+: ", "", reason).split("\n")[0].strip()
        gave_up = (
            f"; it reached the recompile limit ({limit}), so dynamo runs it uncompiled from now on" if limit else ""
        )
        shapes = bool(_SIZE.search(reason))
        modes = _MODE.search(reason) is not None
        cause = (
            "the input shapes change from step to step"
            if shapes
            else "it is called under more combinations of grad mode, autocast and train/eval than the limit allows"
            if modes
            else "a value it specialised on (a Python number or flag, a dtype) keeps changing"
        )
        return Finding(
            f"torch.compile had to compile {where} again {recompiles} times while watched{gave_up}: {cause} (the last "
            f"failed guard: {reason}). Each compilation costs seconds or more, and the steps run uncompiled "
            "meanwhile.",
            fix=self._fix(shapes, modes),
            location=self._location(where, code),
            key=where,
        )

    def _fix(self, shapes: bool, modes: bool = False) -> Fix:
        if modes:
            return Fix(
                title="Allow dynamo more compiled versions of the function (one per mode combination it meets):",
                code="torch._dynamo.config.recompile_limit = 32",
            )
        if not shapes:
            return Fix(
                title="Pass the changing number as a tensor (or keep it constant), e.g.:",
                code="out = model(x, torch.tensor(step))",
            )
        backend = self._backend()
        extra = f'backend="{backend}", ' if backend and backend != "inductor" else ""
        return Fix(title="Compile with dynamic shapes:", code=f"torch.compile(model, {extra}dynamic=True)")

    def _breaks(self, sites: list[tuple[str, int]]) -> Iterator[Finding]:
        shown = "; ".join(f"{file}:{line}: {self.handler.sites[(file, line)]}" for file, line in sites[:SHOWN])
        more = f" and {len(sites) - SHOWN} more" if len(sites) > SHOWN else ""
        file, line = sites[0]
        yield Finding(
            f"the compiled code breaks into separate graphs at {len(sites)} place(s), running Python between "
            f"them at every step: {shown}{more}.",
            fix=Fix(
                title="Move the breaking call out of the compiled code (log after the step, keep values as tensors), "
                "or compile the parts around it:",
                code="torch._dynamo.config.capture_scalar_outputs = True  # for .item() calls",
            ),
            location=Location(file=file, line=line),
            key=f"break:{file}:{line}",
        )

    def _name(self, code: Any) -> str:
        """The watched model a compiled module's code belongs to, else the function's qualified name."""
        filename = getattr(code, "co_filename", "")
        if "torch" in filename.replace("\\", "/").split("/site-packages/")[-1].split("/")[:1]:
            compiled = [
                wm.label
                for wm in self.ctx.models
                if any(type(w).__name__ == "OptimizedModule" for w in _chain(wm.module))
            ]
            if compiled or len(self.ctx.models) == 1:  # a module compiled after watch() was given it
                return (compiled or [self.ctx.models[0].label])[0]
        name = str(getattr(code, "co_qualname", None) or getattr(code, "co_name", "?")).split("<locals>.")[-1]
        return f"{name}() ({filename}:{getattr(code, 'co_firstlineno', 0)})"

    def _location(self, where: str, code: Any) -> Location:
        if any(wm.label == where for wm in self.ctx.models):
            return Location(module=where)
        return Location(file=getattr(code, "co_filename", None), line=getattr(code, "co_firstlineno", None))

    def _backend(self) -> Optional[str]:
        """The backend the watched compiled model was given (dynamo keeps it on the compile context)."""
        for wm in self.ctx.models:
            for w in _chain(wm.module):
                callback = getattr(getattr(w, "dynamo_ctx", None), "callback", None)
                backend = getattr(
                    getattr(callback, "_torchdynamo_orig_backend", None), "_torchdynamo_orig_backend", None
                )
                name = getattr(backend, "__name__", None)
                if isinstance(name, str):
                    return name
        return None


def _recompiles(reasons: list[Any]) -> list[list[str]]:
    """Dynamo's guard-failure record of one function, cut into its recompilations: each lists the failed guard
    of every cached version, newest first, ending with the first version's (``"3/0: ..."``)."""
    out: list[list[str]] = []
    current: list[str] = []
    for reason in reasons:
        current.append(str(reason))
        if re.match(r"\d+/0:", current[-1]):
            out.append(current)
            current = []
    return out


def _limit() -> int:
    """Dynamo's recompile limit (``recompile_limit``, ``cache_size_limit`` in older torch)."""
    import torch

    config = torch._dynamo.config
    return int(getattr(config, "recompile_limit", None) or getattr(config, "cache_size_limit", None) or 8)


def _reason(text: str) -> str:
    """The specific line of dynamo's graph-break reason (its first line is often a generic 'Encountered graph
    break when attempting to trace ...'), with the first hint."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    specific = [
        line
        for line in lines
        if not line.startswith(
            ("Encountered graph break", "Explanation:", "Hint:", "Developer debug", "For more details")
        )
    ]
    hint = next((line for line in lines if line.startswith("Hint:")), "")
    reason = (specific or lines or ["unknown reason"])[0]
    return f"{reason} ({hint})" if hint else reason


def _chain(module: Any) -> list[Any]:
    from torchdoctor.sdk.runtime import wrapper_chain

    return list(wrapper_chain(module))


def _guard_failures() -> Optional[dict[Any, list[Any]]]:
    """Dynamo's record of guard failures per compiled code object, when this torch keeps one."""
    try:
        from torch._dynamo.utils import guard_failures
    except Exception:
        return None
    return guard_failures if isinstance(guard_failures, dict) else None
