"""The facts a source check sees: one parsed file (`SourceFile`) and what is known about the project."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Optional, TypeVar, Union

from torchdoctor.findings import Finding, Location
from torchdoctor.lint.facts import Fact, Function
from torchdoctor.lint.index import CallSite, FunctionScope, ModuleIndex, build_index
from torchdoctor.lint.program import Module, Program, stamp

T = TypeVar("T")
_MAX_IMPORTED = 400  # modules followed when asking what a file's imports contain

_LINE_END = re.compile(r"\r\n|\r|\n")


# The nodes `ast.parse` gives a source span (the ones a finding or an edit points at).
Spanned = Union[ast.stmt, ast.expr, ast.arg, ast.keyword]


def end_of(node: Spanned) -> tuple[int, int]:
    """Where `node` ends: (line, UTF-8 byte column). `ast.parse` always sets both; typeshed allows None."""
    line, col = node.end_lineno, node.end_col_offset
    assert line is not None and col is not None, f"{type(node).__name__} without an end position"
    return line, col


@dataclass
class ProjectFacts:
    """What one run knows about the project: the program model, shared by every file the run checks."""

    program: Program = field(default_factory=Program)

    def answer(self, path: str, question: str, *args: str) -> str:
        """The current answer to a dependency a file recorded: a module's stamp, or a project tree's stamp."""
        if question == "file":
            return stamp(args[0])
        if question == "tree":
            return self.program.tree_stamp(args[0])
        raise ValueError(f"unknown project question {question!r}")


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
    """The project as one file sees it: questions to the program model. Every other module an answer used
    (and the project tree, for questions about callers) is recorded with its stamp, so the lint cache reuses
    the file's result only while all of them are unchanged."""

    facts: ProjectFacts
    path: str
    abspath: Optional[str] = None
    tree: Optional[ast.Module] = None
    index: Optional[ModuleIndex] = None
    asked: list[tuple] = field(default_factory=list)
    # (id(scope), callee name) -> answer: several checks ask about the same calls, and a function calls the same
    # names again and again; the first ask recorded what the answer read, so a repeat reads and records nothing.
    _callees: dict[tuple, Optional[Function]] = field(default_factory=dict, repr=False)
    _recorded: set[str] = field(default_factory=set, repr=False)  # the files `asked` holds a stamp of

    @cached_property
    def module(self) -> Optional[Module]:
        if self.abspath is None or self.tree is None or self.index is None:
            return None
        return self.facts.program.add(self.abspath, self.tree, self.index)

    def function(self, scope: FunctionScope) -> Optional[Function]:
        """A function of this file, to ask its facts (None when the file is not part of a program model)."""
        module = self.module
        return Function(self.facts.program, module, scope) if module is not None else None

    def fact(self, fn: Optional[Function], fact: Fact[T]) -> Optional[T]:
        """The declared fact of a function (`function()`, `callee()`, `callers()`), recording the files the
        answer read; None when there is no function to ask about."""
        module = self.module
        if fn is None or module is None:
            return None
        program = self.facts.program
        program.touched = set()
        answer = fn.fact(fact)
        self._record(program, module)
        return answer

    def at_call(self, scope: FunctionScope, call: CallSite, fact: Fact[T]) -> Optional[T]:
        """The fact of the function `call` runs, as it reads at that call of `scope` (an effects fact: receivers
        in this function's names, the call's path condition added); None when the call is unknown."""
        callee = self.callee(scope, call)
        if callee is None:
            return None
        value = self.fact(callee, fact)
        caller = self.function(scope)
        if value is None or fact.through is None or caller is None:
            return value
        return fact.through(value, caller, call, callee)

    def instance_method(self, scope: FunctionScope, receiver: str, name: str) -> Optional[FunctionScope]:
        """The project method `receiver.name(...)` runs when `receiver` is bound to an instance of a project class
        (`meter = AverageMeter()`; `meter.update(...)`); None when that is not known."""
        found = self._ask(lambda p, m: p.instance_method(m, scope, receiver, name), None)
        return found[1] if found is not None else None

    def unknown_decorators(self, scope: FunctionScope) -> list[ast.expr]:
        """Decorators of the function whose effect is unknown (not defined in the project, not known harmless)."""
        return self._ask(lambda p, m: p.unknown_decorators(m, scope), [])

    def callers(self, scope: FunctionScope) -> list[tuple[Function, CallSite]]:
        """Every call of this function in the project: the calling function and the call."""

        def ask(program: Program, module: Module) -> list[tuple[Function, CallSite]]:
            root = program.root_of(module.path)
            self.asked.append(("tree", root, program.tree_stamp(root)))  # covers every file the answer read
            return [(Function(program, other, s), call) for other, s, call in program.callers(module, scope)]

        return self._ask(ask, [], record_files=False)

    def callee(self, scope: FunctionScope, call: CallSite) -> Optional[Function]:
        """The function a call runs (closure, method, module, imported or installed-library function), to ask
        its facts; None when it is unknown."""
        func = call.node.func  # the answer depends only on the scope and the callee's name (see resolve_call)
        if type(func) is ast.Name:
            key: tuple = (id(scope), func.id)
        elif type(func) is ast.Attribute and type(func.value) is ast.Name:
            key = (id(scope), func.value.id, func.attr)
        else:
            return None  # `f()(...)`, `a.b.c(...)`: never resolved to a project function
        if key in self._callees:
            return self._callees[key]
        answer = None  # asked for most calls of a file: `_ask` written out, without a closure per call
        module = self.module
        if module is not None:
            program = self.facts.program
            program.touched = set()
            found = program.resolve_call(module, scope, call)
            if found is not None:
                answer = Function(program, *found)
            self._record(program, module)
        self._callees[key] = answer
        return answer

    def imported_module_mentions(self, text: str) -> bool:
        """Whether a project module this file imports (or one those import) has the string constant `text`."""

        def ask(program: Program, module: Module) -> bool:
            seen, todo = {module.path}, [module]
            while todo and len(seen) < _MAX_IMPORTED:
                current = todo.pop(0)  # breadth first: the modules imported directly come first
                for target, _ in current.imports(program).values():
                    if target is None or target in seen:
                        continue
                    seen.add(target)
                    other = program.module(target)
                    if other is not None and other.mentions(text):
                        return True
                    if other is not None:
                        todo.append(other)
            return False

        return self._ask(ask, False)

    def _ask(self, question: Callable[[Program, Module], T], default: T, record_files: bool = True) -> T:
        module = self.module
        if module is None:
            return default
        program = self.facts.program
        program.touched = set()
        answer = question(program, module)
        if record_files:
            self._record(program, module)
        return answer

    def _record(self, program: Program, module: Module) -> None:
        """Record the stamps of the other modules the last answer read (most answers read none)."""
        touched = program.touched
        if touched:
            recorded = self._recorded
            for path in sorted(touched - recorded - {module.path}):
                self.asked.append(("file", path, stamp(path)))
                recorded.add(path)


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
        index = build_index(self.tree if self.tree is not None else ast.Module(body=[], type_ignores=[]))
        self.project.tree, self.project.index = self.tree, index
        return index

    @cached_property
    def lines(self) -> list[str]:
        """Lines as `ast` counts them (only \\n, \\r\\n and \\r end a line; str.splitlines knows more)."""
        text = self.text
        # Without a CR the same split as the pattern's, 8x faster.
        return text.split("\n") if "\r" not in text else _LINE_END.split(text)

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
        return "\n".join([head, *self.lines[first + 1 : last], tail])

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
