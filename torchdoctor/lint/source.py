"""The facts a source check sees: one parsed file (`SourceFile`) and what is known about the project."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Optional, Union

from torchdoctor.findings import Finding, Location
from torchdoctor.lint.index import ModuleIndex, build_index

# A `.set_epoch(` call on a line where no `#` comes before it (cross-file facts are read from text).
_LINE_END = re.compile(r"\r\n|\r|\n")
_SET_EPOCH_CALL = re.compile(r"^[^#\n]*\.set_epoch\(", re.MULTILINE)


# The nodes `ast.parse` gives a source span (the ones a finding or an edit points at).
Spanned = Union[ast.stmt, ast.expr, ast.arg, ast.keyword]


def end_of(node: Spanned) -> tuple[int, int]:
    """Where `node` ends: (line, UTF-8 byte column). `ast.parse` always sets both; typeshed allows None."""
    line, col = node.end_lineno, node.end_col_offset
    assert line is not None and col is not None, f"{type(node).__name__} without an end position"
    return line, col


@dataclass
class ProjectFacts:
    """Cheap cross-file facts over every file linted in one run (read from text, used only to stay quiet)."""

    texts: dict[str, str] = field(default_factory=dict)
    _mentions: dict[str, frozenset[str]] = field(default_factory=dict, init=False, repr=False)

    def answer(self, path: str, question: str, *args: str) -> bool:
        """The answer to a `ProjectView` question asked by the file at `path`."""
        if question == "set-epoch-called-elsewhere":
            return bool(self._set_epoch_callers - {path})
        if question == "mentioned-elsewhere":
            return bool(self._files_mentioning(args[0]) - {path})
        raise ValueError(f"unknown project question {question!r}")

    @cached_property
    def _set_epoch_callers(self) -> frozenset[str]:
        return frozenset(path for path, text in self.texts.items() if "set_epoch" in text and _SET_EPOCH_CALL.search(text))

    def _files_mentioning(self, name: str) -> frozenset[str]:
        found = self._mentions.get(name)
        if found is None:
            found = self._mentions[name] = frozenset(p for p, text in self.texts.items() if has_word(text, name))
        return found


def has_word(text: str, word: str) -> bool:
    """Whether `word` occurs in `text` with no identifier character either side (a `\\b...\\b` regex, several
    times faster: str.find jumps to the candidates)."""
    at = text.find(word)
    while at >= 0:
        end = at + len(word)
        if (at == 0 or not _is_word_char(text[at - 1])) and (end == len(text) or not _is_word_char(text[end])):
            return True
        at = text.find(word, at + 1)
    return False


def _is_word_char(c: str) -> bool:
    return c.isalnum() or c == "_"


@dataclass
class ProjectView:
    """The project as one file sees it. Each question and its answer is recorded: the lint cache reuses the
    file's result only while every answer still holds."""

    facts: ProjectFacts
    path: str
    asked: list[tuple] = field(default_factory=list)

    def set_epoch_called_elsewhere(self) -> bool:
        """Whether another linted file calls `.set_epoch(` (outside a comment)."""
        return self._ask("set-epoch-called-elsewhere")

    def mentioned_elsewhere(self, name: str) -> bool:
        """Whether `name` appears as a word in another linted file (e.g. a function imported there)."""
        return self._ask("mentioned-elsewhere", name)

    def _ask(self, *question: str) -> bool:
        answer = self.facts.answer(self.path, *question)
        self.asked.append((*question, answer))
        return answer


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
    project: ProjectView = field(default_factory=lambda: ProjectView(ProjectFacts(), ""))

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

    def start(self, node: Spanned) -> tuple[int, int]:
        return node.lineno, self.char_col(node.lineno, node.col_offset)

    def end(self, node: Spanned) -> tuple[int, int]:
        line, byte_col = end_of(node)
        return line, self.char_col(line, byte_col)

    def segment(self, node: Spanned) -> str:
        """The source text of `node` as written."""
        (last, end_col), col = end_of(node), node.col_offset
        first, last = node.lineno - 1, last - 1
        if last >= len(self.lines):
            return ast.unparse(node)
        if first == last:
            line = self.lines[first]
            if line.isascii():
                return line[col:end_col]
            return line.encode("utf-8")[col:end_col].decode("utf-8", "replace")
        head = self.lines[first].encode("utf-8")[col:].decode("utf-8", "replace")
        tail = self.lines[last].encode("utf-8")[:end_col].decode("utf-8", "replace")
        return "\n".join([head, *self.lines[first + 1:last], tail])

    def snippet(self, node: Spanned, limit: int = 70) -> str:
        """The source of `node` for a message: on one line, shortened when long."""
        text = " ".join(self.segment(node).split())
        return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."

    def imports_plain(self, module: str) -> bool:
        """Whether the module body binds `module` itself by a plain top-level `import module`."""
        for stmt in self.tree.body if self.tree is not None else []:
            if isinstance(stmt, ast.Import) and any(a.name == module and a.asname is None for a in stmt.names):
                return True
        return False
