"""Facts owned by rules: what a rule needs to know about a function, declared by the rule, computed by the engine.

A rule declares a `Fact`: a local predicate over one function body, and (optionally) how the fact propagates
through the calls that body makes. The engine (`Program.fact`) computes a declared fact once per function and run,
following calls through closures, methods (the class hierarchy, `__call__`), imports and installed libraries as
`Program.resolve_call` does; a call it cannot resolve is unknown and contributes nothing. The engine knows no
pitfall: what a fact means is the declaring rule's business.

Facts about *what* a function touches (which optimizer it steps, whose gradients it clears) are sets of
`Effect`s: a receiver named as the function names it, mapped to the caller's names when followed through a
call (a parameter becomes the argument passed, `self.x` the caller's `obj.x`, a name bound inside the callee
is dropped), and the path condition it runs under (the tests of the enclosing `if`s the fact's `guard` keeps,
e.g. `(i + 1) % k == 0`: every k-th call rather than every call).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Generic, Optional, TypeVar

from torchdoctor.lint.index import CallSite, FunctionScope, ref
from torchdoctor.lint.stubs import LibraryScope

if TYPE_CHECKING:
    from torchdoctor.lint.program import Module, Program

T = TypeVar("T")
DEPTH = 3  # how many calls deep a fact is followed from where it was first asked


@dataclass(frozen=True)
class Effect:
    """A function touches `receiver` (a name or attribute chain as the function's caller would write it; "?"
    when the function touches something it cannot name, e.g. `p.grad = None` over parameters it was handed in
    a form no name says), under `condition` ('' = every time it runs), reached through the calls in `via`."""

    receiver: str
    condition: str = ""
    via: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class Fact(Generic[T]):
    """A fact a rule needs about functions.

    - `local(fn)`: the value read from the function's own body (it may ask other facts, or this one, of the
      functions `fn.resolve(call)` finds: the engine caches each and stops recursion with `empty`).
    - `join`: how a callee's value combines with the caller's; None when the fact is not followed through calls.
    - `through(value, fn, call, callee)`: how a callee's value reads at one call in `fn` (default: unchanged;
      `effects` facts rebind receivers to the caller's names and add the call's path condition).
    - `final(value)`: nothing a further callee adds can change the answer (stop following: `True` for an "any").
    - `guard(test)`: which `if` tests make a path condition worth keeping (effects facts only).
    """

    name: str
    local: Callable[["Function"], T]
    empty: T
    join: Optional[Callable[[T, T], T]] = None
    through: Optional[Callable[[T, "Function", CallSite, "Function"], T]] = None
    final: Optional[Callable[[T], bool]] = None
    guard: Optional[Callable[[ast.expr], bool]] = None

    @classmethod
    def any(cls, name: str, local: Callable[["Function"], bool]) -> "Fact[bool]":
        """A yes/no fact true when the function or any function it calls (followed `DEPTH` calls) satisfies it."""
        return Fact(name, local, False, join=_or, final=_true)

    @classmethod
    def effects(
        cls,
        name: str,
        local: Callable[["Function"], frozenset[Effect]],
        guard: Optional[Callable[[ast.expr], bool]] = None,
    ) -> "Fact[frozenset[Effect]]":
        """What the function and the functions it calls touch, with receivers in the caller's names."""

        def through(value: frozenset[Effect], fn: Function, call: CallSite, callee: Function) -> frozenset[Effect]:
            return rebind(value, fn, call, callee, guard)

        return Fact(name, local, frozenset(), join=_union, through=through, guard=guard)


class Function:
    """One function of the program (project or installed library) as a rule's predicate sees it: its body, the
    functions its calls run, and the facts of either."""

    __slots__ = ("program", "module", "scope", "depth")

    def __init__(self, program: "Program", module: "Module", scope: FunctionScope, depth: int = 0) -> None:
        self.program, self.module, self.scope, self.depth = program, module, scope, depth

    @property
    def name(self) -> str:
        """The function's name (what a message names as `in `f``)."""
        return self.scope.name

    def fact(self, fact: Fact[T]) -> T:
        """The declared fact of this function (computed once per run and function)."""
        return self.program.fact(self.module, self.scope, fact, self.depth)

    def resolve(self, call: CallSite) -> Optional["Function"]:
        """The function `call` (one of this body's calls) runs; None when it is unknown (not followed)."""
        found = self.program.resolve_call(self.module, self.scope, call)
        return Function(self.program, found[0], found[1], self.depth + 1) if found is not None else None

    def enclosing(self) -> "Function":
        """The function (or module body) this one is defined in: where its decorators are looked up."""
        parent = self.module.parents.get(id(self.scope.node)) or self.module.index.scopes[0]
        return Function(self.program, self.module, parent, self.depth)

    def resolve_expr(self, func: ast.expr) -> Optional["Function"]:
        """The function a name or `x.name` written in this body means (a decorator, a callback passed on)."""
        if not isinstance(func, (ast.Name, ast.Attribute)):
            return None
        name = func.id if isinstance(func, ast.Name) else func.attr
        fake = CallSite(ast.Call(func=func, args=[], keywords=[]), "", name, None, None, False, (0, 0))
        return self.resolve(fake)

    @property
    def pending(self) -> bool:
        """An installed library's function known from a kept resolution, not parsed in this run (its facts are
        kept too; reading its body parses it)."""
        scope = self.scope
        return isinstance(scope, LibraryScope) and scope.pending

    def parameters(self) -> list[str]:
        """Positional parameter names, without the `self`/`cls` of a method."""
        scope = self.scope
        if isinstance(scope, LibraryScope) and scope.pending:
            params = list(scope.params)
        else:
            node = scope.node
            if isinstance(node, ast.Module):
                return []
            params = [a.arg for a in node.args.posonlyargs + node.args.args]
        if self.scope.class_name is not None and params[:1] in (["self"], ["cls"]):
            params = params[1:]
        return params

    def arguments(self, call: CallSite) -> dict[str, Optional[str]]:
        """What a call passes to this function: parameter -> the caller's name for the argument (None when the
        argument is not a name or attribute chain)."""
        return self._arguments(call, self.parameters())

    def _arguments(self, call: CallSite, params: list[str]) -> dict[str, Optional[str]]:
        passed: dict[str, Optional[str]] = {p: ref(a) for p, a in zip(params, call.node.args)}
        scope = self.scope
        if isinstance(scope, LibraryScope) and scope.pending:
            passed.update({kw.arg: ref(kw.value) for kw in call.node.keywords if kw.arg in scope.keywords})
            return passed
        node = scope.node
        if not isinstance(node, ast.Module):
            keywords = {a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs}
            passed.update({kw.arg: ref(kw.value) for kw in call.node.keywords if kw.arg in keywords})
        return passed

    def condition(self, node: ast.AST, guard: Optional[Callable[[ast.expr], bool]]) -> str:
        """The tests of the `if`s around `node` in this body that `guard` keeps, as source (' and ' between)."""
        if guard is None:
            return ""
        tests = [g.test for g in enclosing_ifs(self.scope.node.body, node) if guard(g.test)]
        return " and ".join(ast.unparse(t) for t in tests)

    def binds(self, name: str) -> bool:
        """The name is bound inside this body (a local of the function, not a parameter or free variable)."""
        scope = self.scope
        if isinstance(scope, LibraryScope) and scope.pending:
            return name in scope.locals
        return any(not isinstance(b.node, ast.arg) for b in scope.bindings_of(name))


def rebind(
    effects: frozenset[Effect],
    fn: Function,
    call: CallSite,
    callee: Function,
    guard: Optional[Callable[[ast.expr], bool]] = None,
) -> frozenset[Effect]:
    """The callee's effects as `fn` sees them at `call`: parameters become the arguments passed, `self.x` the
    receiver's attribute (`obj.m()`: `obj.x`; `self.m()`: `self.x`), the callee's own locals are dropped, free
    names kept; the call's path condition in `fn` (the tests `guard` keeps) is added to each."""
    if not effects:
        return effects
    params = callee.parameters()
    passed = callee._arguments(call, params)
    func = call.node.func
    owner = ref(func.value) if isinstance(func, ast.Attribute) else None
    around = fn.condition(call.node, guard)
    out = set()
    for effect in effects:
        head, _, rest = effect.receiver.partition(".")
        receiver: Optional[str]
        if head == "?":
            receiver = "?"
        elif head in passed:
            receiver = passed[head]
            receiver = f"{receiver}.{rest}" if receiver and rest else receiver
            receiver = receiver or "?"  # an expression passed: touched, but no name says what
        elif head in ("self", "cls") and callee.scope.class_name is not None:
            receiver = (f"{owner}.{rest}" if rest else owner) if owner else "?"
        elif head in params or callee.binds(head):
            receiver = None  # a parameter not passed (its default), or the callee's own object
        else:
            receiver = effect.receiver  # a free variable: a global or a closure's
        if receiver is None:
            continue
        condition = " and ".join(c for c in (around, effect.condition) if c)
        out.add(Effect(receiver, condition, (callee.name, *effect.via)))
    return frozenset(out)


def enclosing_ifs(body: list[ast.stmt], node: ast.AST) -> tuple[ast.If, ...]:
    """The `if` statements of `body` (nested blocks included, nested functions not) whose branch holds `node`,
    outermost first: found by descending the blocks whose lines span it (a few statements per level, no walk)."""
    found: list[ast.If] = []
    block = list(body)
    lineno, col = getattr(node, "lineno", 0), getattr(node, "col_offset", 0)
    where = (lineno, col)
    while block:
        stmt = next(
            (
                s
                for s in block
                if (s.lineno, s.col_offset) <= where <= (s.end_lineno or s.lineno, s.end_col_offset or 0)
            ),
            None,
        )
        if stmt is None or isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            break
        if isinstance(stmt, ast.If):
            if stmt.test.lineno <= lineno <= (stmt.test.end_lineno or stmt.test.lineno) and any(
                n is node for n in ast.walk(stmt.test)
            ):
                break  # the node is the condition itself
            found.append(stmt)
        block = (
            [s for name in ("body", "orelse", "finalbody") for s in getattr(stmt, name, [])]
            + [s for h in getattr(stmt, "handlers", []) for s in h.body]
            + [s for c in getattr(stmt, "cases", []) for s in c.body]
        )
    return tuple(found)


def _or(a: bool, b: bool) -> bool:
    return a or b


def _true(value: bool) -> bool:
    return bool(value)


def _union(a: frozenset[Effect], b: frozenset[Effect]) -> frozenset[Effect]:
    return a | b if b else a
