"""The facts a source check sees: one parsed file (`SourceFile`) and what is known about the project."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Optional

from torchdoctor.findings import Finding, Location
from torchdoctor.lint.index import ModuleIndex, build_index

# A `.set_epoch(` call on a line where no `#` comes before it (cross-file facts are read from text).
_LINE_END = re.compile(r"\r\n|\r|\n")
_SET_EPOCH_CALL = re.compile(r"^[^#\n]*\.set_epoch\(", re.MULTILINE)


@dataclass
class ProjectFacts:
    """Cheap cross-file facts over every file linted in one run (read from text, used only to stay quiet)."""

    texts: dict[str, str] = field(default_factory=dict)

    @cached_property
    def files_calling_set_epoch(self) -> frozenset[str]:
        return frozenset(path for path, text in self.texts.items() if "set_epoch" in text and _SET_EPOCH_CALL.search(text))

    def mentioned_elsewhere(self, name: str, path: str) -> bool:
        """Whether `name` appears as a word in another linted file (e.g. a function imported there)."""
        word = re.compile(rf"\b{re.escape(name)}\b")
        return any(p != path and name in text and word.search(text) for p, text in self.texts.items())


@dataclass(frozen=True)
class Edit:
    """Replace the text between two (line, column) positions (1-based lines, 0-based character columns)."""

    start: tuple[int, int]
    end: tuple[int, int]
    text: str


@dataclass
class FixableFinding(Finding):
    """A finding with a rewrite that `torchdoctor lint --fix` may apply."""

    edits: tuple[Edit, ...] = ()


@dataclass
class SourceFile:
    """One Python file: its text and `ast` (or why it could not be read), plus the project facts."""

    path: str
    text: str
    tree: Optional[ast.Module] = None
    problem: Optional[str] = None
    problem_line: Optional[int] = None
    project: ProjectFacts = field(default_factory=ProjectFacts)

    @cached_property
    def index(self) -> ModuleIndex:
        return build_index(self.tree if self.tree is not None else ast.Module(body=[], type_ignores=[]))

    @cached_property
    def lines(self) -> list[str]:
        """Lines as `ast` counts them (only \\n, \\r\\n and \\r end a line; str.splitlines knows more)."""
        return _LINE_END.split(self.text)

    def char_col(self, line: int, byte_col: int) -> int:
        """`ast` columns count UTF-8 bytes; editors and edits count characters."""
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        return len(text.encode("utf-8")[:byte_col].decode("utf-8", "replace")) if not text.isascii() else byte_col

    def location(self, node: ast.AST) -> Location:
        line = getattr(node, "lineno", 1)
        return Location(file=self.path, line=line, column=self.char_col(line, getattr(node, "col_offset", 0)) + 1)

    def start(self, node: ast.AST) -> tuple[int, int]:
        return node.lineno, self.char_col(node.lineno, node.col_offset)

    def end(self, node: ast.AST) -> tuple[int, int]:
        return node.end_lineno, self.char_col(node.end_lineno, node.end_col_offset)

    def segment(self, node: ast.AST) -> str:
        """The source text of `node` as written."""
        first, last = node.lineno - 1, node.end_lineno - 1
        if last >= len(self.lines):
            return ast.unparse(node)
        if first == last:
            line = self.lines[first]
            if line.isascii():
                return line[node.col_offset:node.end_col_offset]
            return line.encode("utf-8")[node.col_offset:node.end_col_offset].decode("utf-8", "replace")
        head = self.lines[first].encode("utf-8")[node.col_offset:].decode("utf-8", "replace")
        tail = self.lines[last].encode("utf-8")[:node.end_col_offset].decode("utf-8", "replace")
        return "\n".join([head, *self.lines[first + 1:last], tail])

    def snippet(self, node: ast.AST, limit: int = 70) -> str:
        """The source of `node` for a message: on one line, shortened when long."""
        text = " ".join(self.segment(node).split())
        return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."

    def imports_plain(self, module: str) -> bool:
        """Whether the module body binds `module` itself by a plain top-level `import module`."""
        for stmt in self.tree.body if self.tree is not None else []:
            if isinstance(stmt, ast.Import) and any(a.name == module and a.asname is None for a in stmt.names):
                return True
        return False
