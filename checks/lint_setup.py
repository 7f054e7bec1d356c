"""Launch and setup rules in source: `--local_rank` parsing, cuDNN benchmark against determinism."""
from __future__ import annotations

import ast
from typing import Iterator, Optional

from torchdoctor.findings import Finding, Severity
from torchdoctor.lint.flow import literal
from torchdoctor.lint.index import CallSite
from torchdoctor.lint.source import Edit, FixableFinding, SourceFile, Spanned, end_of
from torchdoctor.registry import Scope, check

_FROM_ENV = 'int(os.environ["LOCAL_RANK"]) if "LOCAL_RANK" in os.environ else '


@check(code="TD406", name="local-rank-argument", scope=Scope.SOURCE, severity="error",
       summary="The script reads the local rank only from --local_rank; launch >= 2.0 passes --local-rank and torchrun sets LOCAL_RANK.")
def local_rank_argument(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or "--local_rank" not in src.text or "--local-rank" in src.text or "LOCAL_RANK" in src.text:
        return
    for call in src.index.all_calls():
        if call.attr != "add_argument":
            continue
        spelling = next((a for a in call.node.args if literal(a) == "--local_rank"), None)
        if spelling is None:
            continue
        yield FixableFinding(
            f"`{src.snippet(call.node)}` accepts only --local_rank: `python -m torch.distributed.launch` (torch >= 2.0) "
            "passes --local-rank=N ('unrecognized arguments: --local-rank=0') and torchrun passes no argument at all, "
            "only the LOCAL_RANK environment variable.",
            fix='Accept both spellings and fall back to the environment:\nparser.add_argument("--local_rank", '
                '"--local-rank", type=int,\n    default=int(os.environ["LOCAL_RANK"]) if "LOCAL_RANK" in os.environ else -1)',
            location=src.location(call.node),
            edits=tuple(_local_rank_edits(src, call, spelling)),
        )


def _local_rank_edits(src: SourceFile, call: CallSite, spelling: ast.expr) -> Iterator[Edit]:
    yield Edit(src.end(spelling), src.end(spelling), ', "--local-rank"')
    type_ = call.kwarg("type")
    if not (isinstance(type_, ast.Name) and type_.id == "int"):
        return  # without type=int the environment value would have another type than the argument's
    default = call.kwarg("default")
    if default is not None:
        text = src.segment(default)
        simple = isinstance(default, (ast.Constant, ast.Name, ast.Attribute, ast.UnaryOp))
        yield Edit(src.start(default), src.end(default), _FROM_ENV + (text if simple else f"({text})"))
    else:
        arguments: list[Spanned] = [*call.node.args, *call.node.keywords]
        last_arg = max(arguments, key=end_of)
        yield Edit(src.end(last_arg), src.end(last_arg), ", default=" + _FROM_ENV + "None")
    if not src.imports_plain("os"):
        yield Edit((_import_line(src), 0), (_import_line(src), 0), "import os\n")


def _import_line(src: SourceFile) -> int:
    """Where `import os` goes: after `from __future__` imports and the docstring, before the first import."""
    body = src.tree.body if src.tree is not None else []
    line = 1
    for i, stmt in enumerate(body):
        if i == 0 and isinstance(stmt, ast.Expr) and isinstance(literal(stmt.value), str):
            line = end_of(stmt)[0] + 1
        elif isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            line = end_of(stmt)[0] + 1
        else:
            return stmt.lineno if isinstance(stmt, (ast.Import, ast.ImportFrom)) else line
    return line


def _exclusive(tree: ast.Module, a: int, b: int) -> bool:
    """Lines `a` and `b` sit in different branches of one `if` (they never both run)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and node.orelse:
            body = (node.body[0].lineno, end_of(node.body[-1])[0])
            orelse = (node.orelse[0].lineno, end_of(node.orelse[-1])[0])
            inside = lambda line, span: span[0] <= line <= span[1]  # noqa: E731
            if inside(a, body) and inside(b, orelse) or inside(b, body) and inside(a, orelse):
                return True
    return False


@check(code="TD310", name="nondeterministic-settings", scope=Scope.SOURCE, severity="info",
       summary="Settings that make runs non-reproducible: cudnn.benchmark on, deterministic algorithms off, unseeded workers.")
def nondeterministic_settings(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or "benchmark" not in src.text or "determinis" not in src.text:
        return
    benchmark: Optional[Spanned] = None
    deterministic: Optional[Spanned] = None
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
