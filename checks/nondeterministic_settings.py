"""nondeterministic-settings: cuDNN benchmark mode, deterministic algorithms off, unseeded workers: runs differ."""

from __future__ import annotations

import ast
import os
from typing import Any, Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall, Severity
from torchdoctor.sdk.runtime import RuntimeCheck, StepEvent
from torchdoctor.sdk.source import FunctionScope, SourceFile, Spanned, literal

from ._user_names import rebuilt_loader

_TRAINING = """
import torch
from torch import nn

model = nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.MSELoss()
loader = [(torch.randn(8, 4), torch.randn(8, 2)) for _ in range(2)]
"""

NONDETERMINISTIC_SETTINGS = Pitfall(
    code="TD310",
    name="nondeterministic-settings",
    severity="info",
    summary="Settings that make runs non-reproducible: cudnn.benchmark on, deterministic algorithms off, unseeded "
    "workers.",
    why="""
        Reproducing a result needs the same algorithms in the same order. `torch.backends.cudnn.benchmark = True`
        times several convolution algorithms and keeps the fastest, which can change from run to run, so asking
        for determinism at the same time does not give it. Unseeded data-loader workers and a missing
        `torch.manual_seed()` change the data order and the initial weights of every run.
    """,
    fix="Turn benchmark mode off when you ask for determinism, and use deterministic algorithms.",
    bad=Example(
        """
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = True
        for x, y in loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
        """,
        setup=_TRAINING,
    ),
    good=Example(
        """
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True)
        for x, y in loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
        """,
        setup=_TRAINING,
    ),
    details={
        "source": """
            The lint rule reports `cudnn.benchmark = True` in a file that also sets `cudnn.deterministic = True` or
            calls `torch.use_deterministic_algorithms(True)`, unless the two sit in different branches of one `if` or
            the same function switches determinism off (`use_deterministic_algorithms(False)`) before the benchmark
            line (settings apply in order); this contradiction is a warning. The other settings (seeds, worker seeding)
            depend on run-time state
            and are checked by `watch`.
        """,
        "runtime": """
            `watch` reads the settings at the start of the session, at steps 0, `every`, ... below 32, then every
            `10 * every` steps and from step `100 * every` on every `100 * every`. By default it only
            reports, as info, settings that actively hurt reproducibility: `cudnn.benchmark=True` (and that it
            overrides `cudnn.deterministic=True`). With `watch(..., deterministic=True)` every item becomes a
            warning and it also reports deterministic algorithms off, `CUBLAS_WORKSPACE_CONFIG` unset when CUDA is
            present, `torch.manual_seed()` never called (the initial seed is a random 64-bit number), and loaders
            passed with `loader=` that use workers without `generator=` or `worker_init_fn=`.
        """,
    },
)


def _reproducibility_problems(loaders: list[Any], deterministic: bool) -> list[tuple[str, Fix]]:
    """What makes this run non-reproducible, each with the line that mends it; without `deterministic`, only
    settings that actively hurt."""
    import torch

    cudnn = torch.backends.cudnn
    cuda = torch.cuda.is_available()
    problems = []
    if cudnn.benchmark and cudnn.deterministic:
        problems.append(
            ("cudnn.benchmark=True overrides cudnn.deterministic=True (pytorch/pytorch#6351)", _NO_BENCHMARK)
        )
    elif cudnn.benchmark and (deterministic or cuda):
        problems.append(
            (
                "cudnn.benchmark=True picks convolution algorithms by timing, which can differ between runs",
                _NO_BENCHMARK,
            )
        )
    if not deterministic:
        return problems
    if not torch.are_deterministic_algorithms_enabled():
        problems.append(
            (
                "deterministic algorithms are off (torch.use_deterministic_algorithms(True))",
                Fix(
                    "Ask for deterministic algorithms before training (ops without one then raise, naming themselves)",
                    "torch.use_deterministic_algorithms(True)",
                ),
            )
        )
    elif cuda and not os.environ.get("CUBLAS_WORKSPACE_CONFIG"):
        problems.append(
            (
                "CUBLAS_WORKSPACE_CONFIG is unset, which deterministic cuBLAS needs",
                Fix(
                    "Set it before the first CUDA call, at the top of the script (or in the shell: "
                    "`export CUBLAS_WORKSPACE_CONFIG=:4096:8`)",
                    'os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"',
                ),
            )
        )
    if torch.initial_seed() >= 2**32:
        problems.append(
            (
                f"torch.manual_seed() was not called (the seed is the random {torch.initial_seed()})",
                Fix(
                    "Seed torch before the model is built (initial weights) and the data is shuffled",
                    "torch.manual_seed(0)",
                ),
            )
        )
    for loader in loaders:
        if getattr(loader, "num_workers", 0) > 0 and loader.worker_init_fn is None and loader.generator is None:
            problems.append(
                (
                    f"the DataLoader over {type(loader.dataset).__name__} uses {loader.num_workers} workers "
                    "without generator= or worker_init_fn= to seed them",
                    rebuilt_loader(
                        loader,
                        {"generator": "torch.Generator().manual_seed(0)"},
                        "Seed its workers and its shuffling with a generator of its own",
                    ),
                )
            )
    return problems


_NO_BENCHMARK = Fix(
    "Turn benchmark mode off: replace the line that sets it to True with",
    "torch.backends.cudnn.benchmark = False",
)


@NONDETERMINISTIC_SETTINGS.runtime
class NondeterministicSettings(RuntimeCheck):
    """Reads cuDNN/determinism flags, the seed and the loaders at start and at the set-up steps (`ctx.setup_due`)."""

    setup = True  # what it judges changes seldom

    def on_start(self) -> Iterator[Finding]:
        self.reported: set[str] = set()
        yield from self._check()

    def on_periodic(self, event: StepEvent) -> Iterator[Finding]:
        yield from self._check()

    def _check(self) -> Iterator[Finding]:
        deterministic = self.ctx.deterministic
        for problem, fix in _reproducibility_problems(self.ctx.loaders, deterministic):
            if problem in self.reported:
                continue
            self.reported.add(problem)
            asked = " (watch(..., deterministic=True) asks for a reproducible run)" if deterministic else ""
            yield Finding(
                f"This run is not reproducible: {problem}{asked}.",
                fix=fix,
                severity=Severity.WARNING if deterministic else Severity.INFO,
                location=Location(step=self.ctx.step),
                key=problem,
            )


@NONDETERMINISTIC_SETTINGS.source
def nondeterministic_settings(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or "benchmark" not in src.text or "determinis" not in src.text:
        return
    benchmark: Optional[Spanned] = None
    deterministic: Optional[Spanned] = None
    for scope in src.index.scopes:
        switched_off = _determinism_turned_off(scope)
        for b in scope.bindings:
            if b.target.endswith("cudnn.benchmark") and literal(b.value) is True:
                if any(pos < b.pos for pos in switched_off):
                    continue  # determinism was switched off before this line: benchmark mode is what they want
                benchmark = benchmark or b.node
            elif b.target.endswith("cudnn.deterministic") and literal(b.value) is True:
                deterministic = deterministic or b.node
        for c in scope.calls:
            if c.attr == "use_deterministic_algorithms" and c.node.args and literal(c.node.args[0]) is True:
                deterministic = deterministic or c.node
    if benchmark is None or deterministic is None or _exclusive(src.tree, benchmark.lineno, deterministic.lineno):
        return
    yield Finding(
        f"`{src.snippet(benchmark)}` (line {benchmark.lineno}) is set together with `{src.snippet(deterministic)}` "
        f"(line {deterministic.lineno}): benchmark mode times several cuDNN algorithms and keeps the fastest, which "
        "can differ from run to run, so the run you asked to be reproducible is not.",
        fix=Fix(
            "For reproducible runs:",
            "torch.backends.cudnn.benchmark = False\ntorch.backends.cudnn.deterministic = True\n"
            "torch.use_deterministic_algorithms(True)  # with CUBLAS_WORKSPACE_CONFIG=:4096:8 on CUDA",
        ),
        location=src.location(benchmark),
        severity=Severity.WARNING,
    )


def _determinism_turned_off(scope: FunctionScope) -> list[tuple]:
    """Where this function switches determinism off (`use_deterministic_algorithms(False)`,
    `cudnn.deterministic = False`): settings apply in order, so a benchmark after that is no conflict."""
    off = [
        c.pos
        for c in scope.calls
        if c.attr == "use_deterministic_algorithms" and c.node.args and literal(c.node.args[0]) is False
    ]
    off += [b.pos for b in scope.bindings if b.target.endswith("cudnn.deterministic") and literal(b.value) is False]
    return off


def _exclusive(tree: ast.Module, a: int, b: int) -> bool:
    """Lines `a` and `b` sit in different branches of one `if` (they never both run)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and node.orelse:
            body = (node.body[0].lineno, node.body[-1].end_lineno)
            orelse = (node.orelse[0].lineno, node.orelse[-1].end_lineno)
            inside = lambda line, span: span[0] <= line <= span[1]  # noqa: E731
            if inside(a, body) and inside(b, orelse) or inside(b, body) and inside(a, orelse):
                return True
    return False
