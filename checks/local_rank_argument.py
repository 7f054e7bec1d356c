"""local-rank-argument: the script reads its rank only from --local_rank, which launchers no longer pass."""

from __future__ import annotations

import ast
from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Pitfall, Severity
from torchdoctor.sdk.env import EnvFacts
from torchdoctor.sdk.source import CallSite, Edit, FixableFinding, SourceFile, has_word, literal

_FROM_ENV = 'int(os.environ["LOCAL_RANK"]) if "LOCAL_RANK" in os.environ else '
_ENV_UNSEEN = (
    "it reads the arguments its own process was launched with (by a launcher put before "
    "`-m torchdoctor env`), not the argparse calls of a training script."
)

LOCAL_RANK_ARGUMENT = Pitfall(
    code="TD406",
    name="local-rank-argument",
    severity="error",
    summary=(
        "The script reads the local rank only from --local_rank; launch >= 2.0 passes --local-rank and torchrun sets "
        "LOCAL_RANK."
    ),
    why="""
        Since PyTorch 2.0 `python -m torch.distributed.launch` passes `--local-rank=N` (with a dash) instead of
        `--local_rank=N`, so a script that declares only `--local_rank` fails with
        `error: unrecognized arguments: --local-rank=0`. torchrun passes no argument at all: it sets the
        `LOCAL_RANK` environment variable, and the script silently keeps the argument's default.
    """,
    fix="""
        Accept both spellings and fall back to `LOCAL_RANK` (`torchdoctor lint --fix` makes this change).
    """,
    bad=Example(
        """
            parser.add_argument("--local_rank", type=int, default=-1)
        """,
        setup="import argparse\n\nparser = argparse.ArgumentParser()\n",
        unseen={"env": _ENV_UNSEEN},
    ),
    good=Example(
        """
            parser.add_argument("--local_rank", "--local-rank", type=int,
                                default=int(os.environ["LOCAL_RANK"]) if "LOCAL_RANK" in os.environ else -1)
        """,
        setup="import argparse\nimport os\n\nparser = argparse.ArgumentParser()\n",
        unseen={"env": _ENV_UNSEEN},
    ),
    details={
        "source": """
            The lint rule reports `add_argument("--local_rank", ...)` in a file that never mentions `--local-rank` or
            `LOCAL_RANK`, unless the script parses with `parse_known_args` and a project module it imports (directly
            or through other project modules) reads `LOCAL_RANK`, and in files that use deepspeed (whose launcher
            passes `--local_rank=N`, the spelling they accept). `--fix` adds the dashed spelling and, when the argument
            has `type=int`, a default read from
            `LOCAL_RANK` that keeps the old default when the variable is unset (adding `import os` if needed).
        """,
        "env": """
            `torchdoctor env` accepts the `--local-rank`/`--local_rank` argument a launcher puts before the command, so
            `python -m torch.distributed.launch --nproc-per-node 2 -m torchdoctor env` works; when it sees one it
            reports (as a warning, once for all ranks) that this launcher passes `--local-rank=N` and that the
            training script must accept that spelling or, better, be launched with torchrun and read `LOCAL_RANK`.
            Under torchrun no argument is passed and nothing is reported.
        """,
    },
)


def _local_rank_edits(src: SourceFile, call: CallSite, spelling: ast.expr) -> Iterator[Edit]:
    """The --fix edits: the dashed spelling and, with type=int, a default read from LOCAL_RANK."""
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
        given: list[ast.expr | ast.keyword] = [*call.node.args, *call.node.keywords]
        last_arg = max(given, key=lambda n: (n.end_lineno or 0, n.end_col_offset or 0))
        yield Edit(src.end(last_arg), src.end(last_arg), ", default=" + _FROM_ENV + "None")
    if src.tree is not None and not src.imports_plain("os"):
        line = _import_line(src.tree)
        yield Edit((line, 0), (line, 0), "import os\n")


def _import_line(tree: ast.Module) -> int:
    """Where `import os` goes: after `from __future__` imports and the docstring, before the first import."""
    line = 1
    for i, stmt in enumerate(tree.body):
        if i == 0 and isinstance(stmt, ast.Expr) and isinstance(literal(stmt.value), str):
            line = (stmt.end_lineno or stmt.lineno) + 1
        elif isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            line = (stmt.end_lineno or stmt.lineno) + 1
        else:
            return stmt.lineno if isinstance(stmt, (ast.Import, ast.ImportFrom)) else line
    return line


@LOCAL_RANK_ARGUMENT.source
def parses_only_local_rank(src: SourceFile) -> Iterator[Finding]:
    """`add_argument("--local_rank")` in a file that never mentions --local-rank or LOCAL_RANK."""
    if src.tree is None or "--local_rank" not in src.text or "--local-rank" in src.text or "LOCAL_RANK" in src.text:
        return
    if has_word(src.text, "deepspeed"):
        return  # the deepspeed launcher passes --local_rank=N (with an underscore): the spelling it expects
    calls = list(src.index.all_calls())
    if any(c.attr == "parse_known_args" for c in calls) and src.project.imported_module_mentions("LOCAL_RANK"):
        return  # the launcher's argument is tolerated and a project module it imports reads the rank from the env
    for call in calls:
        if call.attr != "add_argument":
            continue
        spelling = next((a for a in call.node.args if literal(a) == "--local_rank"), None)
        if spelling is None:
            continue
        yield FixableFinding(
            f"`{src.snippet(call.node)}` accepts only --local_rank: `python -m torch.distributed.launch` (torch >= "
            f"2.0) "
            "passes --local-rank=N ('unrecognized arguments: --local-rank=0') and torchrun passes no argument at all, "
            "only the LOCAL_RANK environment variable.",
            fix=Fix(
                title="Accept both spellings and fall back to the environment:",
                code='parser.add_argument("--local_rank", "--local-rank", type=int,\n'
                '    default=int(os.environ["LOCAL_RANK"]) if "LOCAL_RANK" in os.environ else -1)',
            ),
            location=src.location(call.node),
            edits=tuple(_local_rank_edits(src, call, spelling)),
        )


@LOCAL_RANK_ARGUMENT.env
def launched_with_local_rank(facts: EnvFacts) -> Iterator[Finding]:
    """A --local-rank/--local_rank argument in this process's launch arguments."""
    arg = facts.launch.local_rank_arg if facts.launch else None
    if arg is None:
        return
    yield Finding(
        f"This process was started with `{arg}=N` in its arguments: it was launched by torch.distributed.launch "
        "(deprecated), which passes `--local-rank=N` since torch 2.0 (`--local_rank=N` before). A training "
        "script that declares only one spelling fails with 'error: unrecognized arguments: --local-rank=0', "
        "and under torchrun no such argument comes at all.",
        fix=Fix(
            title="Launch with torchrun and read the rank from the environment:",
            code='local_rank = int(os.environ["LOCAL_RANK"])\n'
            '# or accept both spellings: parser.add_argument("--local-rank", "--local_rank", type=int, '
            'default=int(os.environ.get("LOCAL_RANK", 0)))',
        ),
        severity=Severity.WARNING,
    )
