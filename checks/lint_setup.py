"""Launch rules in source: `--local_rank` parsing instead of the LOCAL_RANK environment variable."""
from __future__ import annotations

import ast
from typing import Iterator

from torchdoctor.findings import Finding
from torchdoctor.lint.flow import literal
from torchdoctor.lint.index import CallSite
from torchdoctor.lint.source import Edit, FixableFinding, SourceFile
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
        last_arg = max([*call.node.args, *call.node.keywords], key=lambda n: (n.end_lineno, n.end_col_offset))
        yield Edit(src.end(last_arg), src.end(last_arg), ", default=" + _FROM_ENV + "None")
    if not src.imports_plain("os"):
        yield Edit((_import_line(src), 0), (_import_line(src), 0), "import os\n")


def _import_line(src: SourceFile) -> int:
    """Where `import os` goes: after `from __future__` imports and the docstring, before the first import."""
    body = src.tree.body
    line = 1
    for i, stmt in enumerate(body):
        if i == 0 and isinstance(stmt, ast.Expr) and isinstance(literal(stmt.value), str):
            line = stmt.end_lineno + 1
        elif isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            line = stmt.end_lineno + 1
        else:
            return stmt.lineno if isinstance(stmt, (ast.Import, ast.ImportFrom)) else line
    return line
