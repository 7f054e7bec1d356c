"""One pass over a module's `ast` that records, per function, the calls, assignments and loops.

Every record carries its context (enclosing loops, whether autograd is off there, source position),
which is all the intra-procedural data flow the lint rules need: statement order inside a function
or loop body, and which names were bound to what.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Callable, Iterator, Optional, Sequence, Union

from torchdoctor.lint.import_roots import RELATIVE

Pos = tuple  # (line, col): source order stands in for statement order inside one function
# The records are made by the hundred thousand in a run: without a __dict__ (Python 3.10+) they are built and
# freed faster and take less memory.
_SLOTS = {"slots": True} if sys.version_info >= (3, 10) else {}

_GRAD_OFF = ("no_grad", "inference_mode")


def ref(node: ast.AST) -> Optional[str]:
    """A stable key for a name, an attribute chain or a constant subscript (`self.opt`, `opts['g']`)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = ref(node.value)
        return f"{base}.{node.attr}" if base is not None else None
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        base = ref(node.value)
        return f"{base}[{node.slice.value!r}]" if base is not None else None
    return None


def resolve(node: ast.AST, aliases: dict[str, str]) -> str:
    """The dotted name of `node` with import aliases resolved (`nn.Linear` -> `torch.nn.Linear`); only the
    attribute chain when it does not start at a name."""
    if type(node) is ast.Attribute and type(node.value) is ast.Name:  # `name.attr`, by far the commonest
        return f"{aliases.get(node.value.id, node.value.id)}.{node.attr}"
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def last(dotted: Optional[str]) -> str:
    """The last segment of a dotted name (`torch.optim.SGD` -> `SGD`)."""
    return dotted.rsplit(".", 1)[-1] if dotted else ""


@dataclass(**_SLOTS)
class Loop:
    """A `for`/`while` loop (or a framework step method that runs once per batch)."""

    node: ast.stmt
    parent: Optional["Loop"]

    def encloses(self, other: Optional["Loop"]) -> bool:
        while other is not None:
            if other is self:
                return True
            other = other.parent
        return False


@dataclass(**_SLOTS)
class CallSite:
    """A call with its context: `qualname` resolves import aliases (`nn.Linear` -> `torch.nn.Linear`)."""

    node: ast.Call
    qualname: str
    attr: str
    receiver: Optional[str]
    loop: Optional[Loop]
    grad_off: bool
    pos: Pos
    discarded: bool = False  # the call is a whole expression statement: its result is thrown away

    def kwarg(self, name: str) -> Optional[ast.expr]:
        for kw in self.node.keywords:
            if kw.arg == name:
                return kw.value
        return None

    @property
    def has_star_kwargs(self) -> bool:
        return any(kw.arg is None for kw in self.node.keywords)


@dataclass(**_SLOTS)
class Binding:
    """`target = value` (also `target += value`, `for target in ...` and `with ... as target`)."""

    target: str
    value: Optional[ast.expr]
    node: Union[ast.stmt, ast.arg]
    loop: Optional[Loop]
    grad_off: bool
    pos: Pos
    augmented: bool = False


@dataclass(**_SLOTS)
class FunctionScope:
    """A function body (or the module body): its calls, bindings and loops in source order."""

    node: Union[ast.Module, ast.FunctionDef, ast.AsyncFunctionDef]
    name: str
    class_name: Optional[str] = None
    grad_off: bool = False
    outer_loop: Optional[Loop] = None  # the loop a nested function (a closure) is defined in
    calls: list[CallSite] = field(default_factory=list)
    bindings: list[Binding] = field(default_factory=list)
    loops: list[Loop] = field(default_factory=list)
    returns: list[ast.Return] = field(default_factory=list)
    parent: Optional["FunctionScope"] = None  # the function (or module body) this one is defined in
    # The last names of everything this function calls (`step` for `opt.step()`), set when the module is indexed:
    # several rules skip a function that calls nothing they look for, asked in one set lookup.
    call_attrs: frozenset[str] = field(default=frozenset(), repr=False, compare=False)
    # target -> its bindings, built on the first question (and again if bindings were added since)
    _by_target: Optional[dict[str, list[Binding]]] = field(default=None, init=False, repr=False, compare=False)
    _tabled: int = field(default=0, init=False, repr=False, compare=False)

    def calls_named(self, *names: str) -> Sequence[CallSite]:
        """The calls whose last name (`attr`) is one of `names`, in source order. Most functions call none of the
        names a rule asks about: that answer comes from `call_attrs` alone, without a pass over the calls."""
        if len(names) == 1:
            name = names[0]
            return [c for c in self.calls if c.attr == name] if name in self.call_attrs else _NONE
        return [c for c in self.calls if c.attr in names] if not self.call_attrs.isdisjoint(names) else _NONE

    def bindings_of(self, target: str) -> list[Binding]:
        """The bindings of `target` in this scope, in source order."""
        table = self._by_target
        if table is None or self._tabled != len(self.bindings):
            table = self._by_target = {}
            for b in self.bindings:
                table.setdefault(b.target, []).append(b)
            self._tabled = len(self.bindings)
        return list(table.get(target, ()))


@dataclass
class ModuleIndex:
    """Everything recorded about one module."""

    aliases: dict[str, str]
    scopes: list[FunctionScope]
    classes: dict[str, list[str]]  # class name -> dotted base names
    functions: dict[str, list[FunctionScope]]
    imports: int = 0  # import statements, at any depth (the import table reads only the top level when all are)
    imported: set[str] = field(default_factory=set)  # every name an import binds, at any depth (`*` not included)
    # the first name of every module an import names, at any depth (`torch` for `from torch.nn import Linear`;
    # "." for a relative import): a module importing no project module cannot call another file's function
    import_roots: set[str] = field(default_factory=set)
    # what rules and their helpers work out once per module, keyed by the question and its arguments (see flow)
    memo: dict[tuple, Any] = field(default_factory=dict, repr=False, compare=False)

    def all_calls(self) -> Iterator[CallSite]:
        for scope in self.scopes:
            yield from scope.calls


class _Indexer:
    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}
        self.scopes: list[FunctionScope] = []
        self.classes: dict[str, list[str]] = {}
        self.imports = 0  # import statements seen, at any depth
        self.imported: set[str] = set()
        self.import_roots: set[str] = set()

    def is_grad_off(self, expr: ast.expr) -> bool:
        """`torch.no_grad()`, `torch.inference_mode()`, or `set_grad_enabled(x)` unless x is literally True."""
        if not isinstance(expr, ast.Call):
            return False
        name = last(resolve(expr.func, self.aliases))
        if name in _GRAD_OFF:
            return True
        if name == "set_grad_enabled":
            arg = expr.args[0] if expr.args else None
            return not (isinstance(arg, ast.Constant) and arg.value is True)
        return False

    def run(self, tree: ast.Module) -> ModuleIndex:
        module_scope = FunctionScope(tree, "<module>")
        self.scopes.append(module_scope)
        self.body(tree.body, module_scope, None, False, None)
        functions: dict[str, list[FunctionScope]] = {}
        for scope in self.scopes:
            scope.calls.sort(key=_position)
            scope.call_attrs = frozenset(map(_attr, scope.calls))
            if scope is not module_scope:
                functions.setdefault(scope.name, []).append(scope)
        return ModuleIndex(
            self.aliases, self.scopes, self.classes, functions, self.imports, self.imported, self.import_roots
        )

    def body(self, stmts: list, scope: FunctionScope, loop: Optional[Loop], off: bool, cls: Optional[str]) -> None:
        handlers = _STMT_HANDLERS
        for stmt in stmts:
            handler = handlers.get(type(stmt))
            if handler is not None:
                handler(self, stmt, scope, loop, off, cls)
            else:
                self.other(stmt, scope, loop, off, cls)

    def stmt(self, node: ast.stmt, scope: FunctionScope, loop: Optional[Loop], off: bool, cls: Optional[str]) -> None:
        handler = _STMT_HANDLERS.get(type(node))
        if handler is not None:
            handler(self, node, scope, loop, off, cls)
        else:
            self.other(node, scope, loop, off, cls)

    # One method per statement type (dispatched on the exact type: `ast.parse` makes no subclasses).
    def assign(
        self, node: ast.Assign, scope: FunctionScope, loop: Optional[Loop], off: bool, cls: Optional[str]
    ) -> None:
        value = node.value
        self.expr(value, scope, loop, off)
        for target in node.targets:
            if type(target) is _Name:  # `name = ...`, the commonest target
                scope.bindings.append(Binding(target.id, value, node, loop, off, (node.lineno, node.col_offset)))
            else:
                self.target(target, value, node, scope, loop, off)

    def expression(
        self, node: ast.Expr, scope: FunctionScope, loop: Optional[Loop], off: bool, cls: Optional[str]
    ) -> None:
        if type(node.value) is _Call:
            first = len(scope.calls)
            self.expr(node.value, scope, loop, off)
            scope.calls[first].discarded = True
        else:
            self.expr(node.value, scope, loop, off)

    def return_(
        self, node: ast.Return, scope: FunctionScope, loop: Optional[Loop], off: bool, cls: Optional[str]
    ) -> None:
        scope.returns.append(node)
        if node.value is not None:
            self.expr(node.value, scope, loop, off)

    def import_(
        self, node: ast.Import, scope: FunctionScope, loop: Optional[Loop], off: bool, cls: Optional[str]
    ) -> None:
        self.imports += 1
        for a in node.names:
            self.import_roots.add(a.name.split(".", 1)[0])
            self.imported.add(a.asname or a.name.split(".", 1)[0])
            if a.asname:
                self.aliases[a.asname] = a.name

    def import_from(
        self, node: ast.ImportFrom, scope: FunctionScope, loop: Optional[Loop], off: bool, cls: Optional[str]
    ) -> None:
        self.imports += 1
        self.import_roots.add(RELATIVE if node.level else (node.module or "").split(".", 1)[0])
        self.imported.update(a.asname or a.name for a in node.names if a.name != "*")
        if node.module and not node.level:
            for a in node.names:
                self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"

    def function(
        self,
        node: Union[ast.FunctionDef, ast.AsyncFunctionDef],
        scope: FunctionScope,
        loop: Optional[Loop],
        off: bool,
        cls: Optional[str],
    ) -> None:
        decorated_off = False
        for d in node.decorator_list:
            self.expr(d, scope, loop, off)
            decorated_off = decorated_off or self.is_grad_off(d) or last(resolve(d, self.aliases)) in _GRAD_OFF
        inner = FunctionScope(node, node.name, cls, grad_off=decorated_off, outer_loop=loop, parent=scope)
        self.scopes.append(inner)
        pos = (node.lineno, node.col_offset)
        args = node.args
        params = args.args + args.kwonlyargs + args.posonlyargs if args.kwonlyargs or args.posonlyargs else args.args
        inner.bindings.extend([Binding(param.arg, None, param, None, decorated_off, pos) for param in params])
        # A Lightning-style step method runs once per batch: its body is a loop body.
        step_loop = Loop(node, None) if cls and node.name == "training_step" else None
        if step_loop:
            inner.loops.append(step_loop)
        self.body(node.body, inner, step_loop, decorated_off, None)

    def class_(
        self, node: ast.ClassDef, scope: FunctionScope, loop: Optional[Loop], off: bool, cls: Optional[str]
    ) -> None:
        self.classes[node.name] = [resolve(b, self.aliases) for b in node.bases]
        for d in node.decorator_list:
            self.expr(d, scope, loop, off)
        self.body(node.body, scope, loop, off, node.name)

    def for_(
        self,
        node: Union[ast.For, ast.AsyncFor],
        scope: FunctionScope,
        loop: Optional[Loop],
        off: bool,
        cls: Optional[str],
    ) -> None:
        self.expr(node.iter, scope, loop, off)
        inner_loop = Loop(node, loop)
        scope.loops.append(inner_loop)
        for name in _target_names(node.target):
            scope.bindings.append(Binding(name, node.iter, node, inner_loop, off, (node.lineno, node.col_offset)))
        self.body(node.body, scope, inner_loop, off, cls)
        self.body(node.orelse, scope, loop, off, cls)

    def while_(
        self, node: ast.While, scope: FunctionScope, loop: Optional[Loop], off: bool, cls: Optional[str]
    ) -> None:
        self.expr(node.test, scope, loop, off)
        inner_loop = Loop(node, loop)
        scope.loops.append(inner_loop)
        self.body(node.body, scope, inner_loop, off, cls)
        self.body(node.orelse, scope, loop, off, cls)

    def with_(
        self,
        node: Union[ast.With, ast.AsyncWith],
        scope: FunctionScope,
        loop: Optional[Loop],
        off: bool,
        cls: Optional[str],
    ) -> None:
        inner_off = off
        for item in node.items:
            self.expr(item.context_expr, scope, loop, off)
            if self.is_grad_off(item.context_expr):
                inner_off = True
            if item.optional_vars is not None:
                for name in _target_names(item.optional_vars):
                    scope.bindings.append(
                        Binding(name, item.context_expr, node, loop, off, (node.lineno, node.col_offset))
                    )
        self.body(node.body, scope, loop, inner_off, cls)

    def ann_assign(
        self, node: ast.AnnAssign, scope: FunctionScope, loop: Optional[Loop], off: bool, cls: Optional[str]
    ) -> None:
        if node.value is not None:
            self.expr(node.value, scope, loop, off)
            self.target(node.target, node.value, node, scope, loop, off)

    def aug_assign(
        self, node: ast.AugAssign, scope: FunctionScope, loop: Optional[Loop], off: bool, cls: Optional[str]
    ) -> None:
        self.expr(node.value, scope, loop, off)
        key = ref(node.target)
        if key is not None:
            scope.bindings.append(
                Binding(key, node.value, node, loop, off, (node.lineno, node.col_offset), augmented=True)
            )
        else:
            self.expr(node.target, scope, loop, off)

    def other(self, node: ast.stmt, scope: FunctionScope, loop: Optional[Loop], off: bool, cls: Optional[str]) -> None:
        """Any other statement (`if`, `try`, `match`, `raise`, ...): its sub-statements, expressions and clauses."""
        for f in child_fields(type(node)):
            value = getattr(node, f, None)
            for child in value if type(value) is list else (value,):
                if isinstance(child, ast.stmt):
                    self.stmt(child, scope, loop, off, cls)
                elif isinstance(child, ast.expr):
                    self.expr(child, scope, loop, off)
                elif isinstance(child, _BLOCKS):
                    self.body(child.body, scope, loop, off, cls)

    def target(
        self,
        target: ast.expr,
        value: Optional[ast.expr],
        node: ast.stmt,
        scope: FunctionScope,
        loop: Optional[Loop],
        off: bool,
    ) -> None:
        if type(target) is _Name:
            scope.bindings.append(Binding(target.id, value, node, loop, off, (node.lineno, node.col_offset)))
            return
        if isinstance(target, (ast.Tuple, ast.List)):
            values = (
                value.elts if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts) else None
            )
            for i, elt in enumerate(target.elts):
                self.target(elt, values[i] if values else None, node, scope, loop, off)
            return
        key = ref(target)
        if key is not None:
            scope.bindings.append(Binding(key, value, node, loop, off, (node.lineno, node.col_offset)))
        self.expr(target, scope, loop, off)

    def expr(
        self,
        node: ast.expr,
        scope: FunctionScope,
        loop: Optional[Loop],
        off: bool,
        Name: type[ast.Name] = ast.Name,
        Constant: type[ast.Constant] = ast.Constant,
        Attribute: type[ast.Attribute] = ast.Attribute,
        Call: type[ast.Call] = ast.Call,
        keyword: type[ast.keyword] = ast.keyword,
        Lambda: type[ast.Lambda] = ast.Lambda,
    ) -> None:
        """Record the calls in `node` (callee resolved, method name, receiver): pre-order, a node's children
        from its last field to its first. (The node types are defaults, so local names at no cost per call: this
        runs once per statement's expression, tens of thousands of times a run.)"""
        calls, aliases = scope.calls, self.aliases
        fields_of = _CHILD_FIELDS
        stack: list = [node]
        pop, push, extend = stack.pop, stack.append, stack.extend
        while stack:
            n = pop()
            t = type(n)
            # The commonest nodes first; each pushes exactly the children the generic walk below would.
            if t is Name or t is Constant:
                continue
            if t is Attribute or t is keyword:
                push(n.value)
                continue
            if t is Call:
                func = n.func
                ft = type(func)
                # A callee `name` or `name.attr` holds no call: it is not walked.
                # (`rpartition(".")[2]` is `last()` without a Python call; a node's fields are read once each)
                if ft is Attribute:
                    value, attr = func.value, func.attr
                    if type(value) is Name:  # `name.attr(...)`, by far the commonest callee
                        vid = value.id
                        qual = f"{aliases.get(vid, vid)}.{attr}"
                        calls.append(CallSite(n, qual, attr, vid, loop, off, (n.lineno, n.col_offset)))
                    else:
                        qual = resolve(func, aliases)
                        calls.append(CallSite(n, qual, attr, ref(value), loop, off, (n.lineno, n.col_offset)))
                        push(value)
                elif ft is Name:
                    fid = func.id
                    qual = aliases.get(fid, fid)
                    calls.append(CallSite(n, qual, qual.rpartition(".")[2], None, loop, off, (n.lineno, n.col_offset)))
                else:
                    qual = resolve(func, aliases)
                    calls.append(CallSite(n, qual, qual.rpartition(".")[2], None, loop, off, (n.lineno, n.col_offset)))
                    push(func)
                extend(n.args)
                extend(n.keywords)
                continue
            if n is None or t is Lambda:
                continue
            for f in fields_of.get(t) or child_fields(t):
                v = getattr(n, f, None)
                if v is None:
                    continue
                if type(v) is list:
                    extend(v)
                else:
                    push(v)


_position = attrgetter("pos")
_NONE: Sequence[CallSite] = ()
_attr = attrgetter("attr")
_Name, _Constant, _Attribute, _Call = ast.Name, ast.Constant, ast.Attribute, ast.Call
_STMT_HANDLERS: dict[type, Callable[..., None]] = {
    ast.Assign: _Indexer.assign,
    ast.Expr: _Indexer.expression,
    ast.Return: _Indexer.return_,
    ast.Import: _Indexer.import_,
    ast.ImportFrom: _Indexer.import_from,
    ast.FunctionDef: _Indexer.function,
    ast.AsyncFunctionDef: _Indexer.function,
    ast.ClassDef: _Indexer.class_,
    ast.For: _Indexer.for_,
    ast.AsyncFor: _Indexer.for_,
    ast.While: _Indexer.while_,
    ast.With: _Indexer.with_,
    ast.AsyncWith: _Indexer.with_,
    ast.AnnAssign: _Indexer.ann_assign,
    ast.AugAssign: _Indexer.aug_assign,
}
# Clauses with a statement body of their own (`match` exists from Python 3.10).
_BLOCKS = (ast.ExceptHandler, ast.match_case) if hasattr(ast, "match_case") else (ast.ExceptHandler,)
# Expression fields that never hold a sub-expression (walking them, or `ctx`/operator nodes, is wasted time).
_SCALAR_FIELDS = frozenset({"ctx", "op", "ops", "id", "attr", "arg", "kind", "conversion", "is_async"})
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}


def child_fields(t: type[ast.AST]) -> tuple[str, ...]:
    """The fields of node type `t` that may hold sub-nodes (all but `ctx`, operators, names and flags)."""
    fields = _CHILD_FIELDS.get(t)
    if fields is None:
        fields = _CHILD_FIELDS[t] = tuple(f for f in t._fields if f not in _SCALAR_FIELDS)
    return fields


def _target_names(target: ast.expr) -> list[str]:
    """The names a `for` or `with ... as` target binds, left to right (`i`, `(x, y)`, `*rest`, `self.best`)."""
    if type(target) is _Name:  # the commonest target
        return [target.id]
    names = []
    stack = [target]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Tuple, ast.List)):
            stack.extend(reversed(node.elts))
        elif isinstance(node, ast.Starred):
            stack.append(node.value)
        else:
            key = ref(node)
            if key is not None:
                names.append(key)
    return names


def build_index(tree: ast.Module) -> ModuleIndex:
    """Index `tree` (one pass); see `ModuleIndex`."""
    return _Indexer().run(tree)
