"""Installed-library functions known from a kept resolution, not parsed until something reads their body.

A call resolved into an installed library in an earlier run (kept per distribution version, see
torchdoctor.lint.libraries) is answered with a `LibraryScope` in a `LibraryModule`: the function's name, class,
line and the names its signature and body bind, which is all a kept fact's key and the rebinding of its
receivers at a call need. Anything else read from either (the body, the calls, the imports) parses the module
then, transparently, and reads the real one: a stub never answers a question with less than the source says.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any, Optional, Sequence

from torchdoctor.lint.index import CallSite, FunctionScope

if TYPE_CHECKING:
    from torchdoctor.lint.program import Module, Program


class LibraryModule:
    """A library module by path; parsed (through the program, so once per run) on the first other question."""

    def __init__(self, path: str, program: "Program") -> None:
        self.path = path
        self._program = program
        self._real: Optional["Module"] = None

    @property
    def pending(self) -> bool:
        """Not parsed yet."""
        return self._real is None

    def real(self) -> "Module":
        if self._real is None:
            self._real = self._program.module_or_empty(self.path)
        return self._real

    def imports(self, program: "Program") -> dict[str, tuple[Optional[str], Optional[str]]]:
        return self.real().imports(program)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.real(), name)


class LibraryScope(FunctionScope):
    """A library function as a kept resolution describes it; its `node`, calls, bindings... are the parsed
    function's, read on first use (an unset slot falls through to `__getattr__`)."""

    __slots__ = ("module", "lineno", "params", "keywords", "locals", "_real")

    def __init__(
        self,
        module: LibraryModule,
        class_name: Optional[str],
        name: str,
        lineno: int,
        params: tuple[str, ...],
        keywords: frozenset[str],
        locals: frozenset[str],
    ) -> None:  # FunctionScope.__init__ is not called: its body-derived slots stay unset until read
        self.module, self.name, self.class_name, self.lineno = module, name, class_name, lineno
        self.params, self.keywords, self.locals = params, keywords, locals
        self._real: Optional[FunctionScope] = None

    @property
    def pending(self) -> bool:
        """Neither this function nor its module has been parsed in this run."""
        return self._real is None and self.module.pending

    def real(self) -> tuple["Module", FunctionScope]:
        """The parsed module and function (an empty function when the source no longer has it)."""
        module = self.module.real()
        if self._real is None:
            for scope in module.index.scopes:
                node = scope.node
                if (
                    scope.name == self.name
                    and scope.class_name == self.class_name
                    and getattr(node, "lineno", 0) == self.lineno
                ):
                    self._real = scope
                    break
            else:
                self._real = FunctionScope(ast.parse(f"def {self.name}(): pass").body[0], self.name, self.class_name)  # type: ignore[arg-type]
        return module, self._real

    def bindings_of(self, target: str) -> list:
        return self.real()[1].bindings_of(target)

    def calls_named(self, *names: str) -> Sequence[CallSite]:
        return self.real()[1].calls_named(*names)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.real()[1], name)


def describe(scope: FunctionScope) -> tuple[tuple[str, ...], list[str], list[str]]:
    """What a kept resolution remembers of a function's signature and body: positional parameters, every
    parameter name, the names its body binds."""
    node = scope.node
    if isinstance(node, ast.Module):
        return (), [], []
    args = node.args
    params = tuple(a.arg for a in args.posonlyargs + args.args)
    keywords = sorted({*params, *(a.arg for a in args.kwonlyargs)})
    bound = sorted({b.target for b in scope.bindings if not isinstance(b.node, ast.arg)})
    return params, keywords, bound
