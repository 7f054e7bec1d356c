"""The file-level source rule: a file that cannot be read is reported, never a traceback."""
from __future__ import annotations

from typing import Iterator

from torchdoctor.findings import Finding, Location
from torchdoctor.lint.source import SourceFile
from torchdoctor.registry import Scope, check


@check(code="TD507", name="source-unreadable", scope=Scope.SOURCE, severity="warning",
       summary="A file could not be read, decoded as its declared encoding, or parsed as Python, so it was not checked.")
def source_unreadable(src: SourceFile) -> Iterator[Finding]:
    if src.problem is None:
        return
    yield Finding(
        f"{src.path} was not checked: it is {src.problem}." if src.problem.startswith("not ")
        else f"{src.path} was not checked: it {src.problem}.",
        fix="Fix the file (it will not import either), or exclude it with --exclude or .gitignore.",
        location=Location(file=src.path, line=src.problem_line),
    )
