"""Setup rules in source: cuDNN benchmark against determinism."""
from __future__ import annotations

import ast
from typing import Iterator, Optional

from torchdoctor.findings import Finding, Severity
from torchdoctor.lint.flow import literal
from torchdoctor.lint.source import SourceFile
from torchdoctor.registry import Scope, check


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


@check(code="TD310", name="nondeterministic-settings", scope=Scope.SOURCE, severity="info",
       summary="Settings that make runs non-reproducible: cudnn.benchmark on, deterministic algorithms off, unseeded workers.")
def nondeterministic_settings(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or "benchmark" not in src.text or "determinis" not in src.text:
        return
    benchmark: Optional[ast.AST] = None
    deterministic: Optional[ast.AST] = None
    for scope in src.index.scopes:
        for b in scope.bindings:
            if b.target.endswith("cudnn.benchmark") and literal(b.value) is True:
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
        fix="For reproducible runs:\ntorch.backends.cudnn.benchmark = False\ntorch.backends.cudnn.deterministic = True\n"
            "torch.use_deterministic_algorithms(True)  # with CUBLAS_WORKSPACE_CONFIG=:4096:8 on CUDA",
        location=src.location(benchmark),
        severity=Severity.WARNING,
    )
