"""source-unreadable: a file that cannot be read, decoded or parsed is reported (and skipped), never a traceback."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall, Severity
from torchdoctor.sdk.source import SourceFile

SOURCE_UNREADABLE = Pitfall(
    code="TD507",
    name="source-unreadable",
    severity="error",
    summary="A file could not be read, decoded as its declared encoding, or parsed as Python, so it was not checked.",
    why="""
        A file with a syntax error, or with bytes that are not UTF-8 and no `# -*- coding: ... -*-` line, will not
        import either; the rest of the tree is still checked, and this finding says which file was skipped and why.
    """,
    fix="""
        Fix the file (or declare its encoding), or exclude it with `--exclude PATTERN`, `.gitignore`, or
        `exclude = [...]` in `[tool.torchdoctor]`.
    """,
    bad=Example(
        """
        def train(model, loader:
            ...
        """,
    ),
    good=Example(
        """
        def train(model, loader):
            ...
        """,
    ),
    details={
        "source": """
            Every file lint is given is read as bytes, decoded as UTF-8 or the encoding its PEP 263 `coding:` line
            declares, and parsed. A file that fails any of these is reported once (with the line where decoding
            or parsing failed), and no other rule looks at it. As with ruff, that is an error (exit 1 under the
            default `--fail-on error`); a file skipped only for its size (over 2 MB: generated data, not a
            training script) is a warning.
        """,
    },
)


@SOURCE_UNREADABLE.source
def source_unreadable(src: SourceFile) -> Iterator[Finding]:
    if src.problem is None:
        return
    yield Finding(
        f"{src.path} was not checked: it is {src.problem}."
        if src.problem.startswith("not ")
        else f"{src.path} was not checked: it {src.problem}.",
        fix=Fix(title="Fix the file (it will not import either), or exclude it with --exclude or .gitignore."),
        location=Location(file=src.path, line=src.problem_line),
        severity=Severity.WARNING if src.problem.startswith("larger than") else None,
    )
