"""Built-in checks hand their findings an explicit `Fix(title, code)`; free text (which `Fix.parse` splits by
guessing where the prose ends) is for plug-ins only.

Read from the source with `ast`, so that every fix site is judged, not only those the examples reach: a
`Finding(..., fix=X)` passes when X is a `Fix(...)` call, None, or a name, attribute or call that stands for
one (a variable every assignment of which passes, a parameter, function or field annotated `Fix`) — mypy
then holds those annotations to what the code returns.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, Optional, Sequence

import pytest

ROOT = Path(__file__).resolve().parents[1]
FINDINGS = {"Finding", "FixableFinding"}


def _sources() -> list[Path]:
    """The built-in checks and their helpers, and the engine code that builds findings itself."""
    return sorted((ROOT / "checks").glob("*.py")) + sorted((ROOT / "torchdoctor").rglob("*.py"))


class _Module:
    """One module's definitions, to follow a fix expression to what it is built from."""

    def __init__(self, tree: ast.Module, helpers: list[ast.Module]) -> None:
        self.tree = tree
        self.parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        trees = [tree, *helpers]
        self.functions = {
            n.name: n for t in trees for n in ast.walk(t) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        self.fields = {
            n.target.id: n.annotation
            for t in trees
            for cls in ast.walk(t)
            if isinstance(cls, ast.ClassDef)
            for n in cls.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        }

    def scope_of(self, node: ast.AST) -> ast.AST:
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                return node
        return self.tree

    def problem(self, value: ast.expr, seen: frozenset[str] = frozenset()) -> Optional[str]:
        """Why `value` may be free text (None when it is sure to be a `Fix` or None)."""
        if isinstance(value, ast.Call) and _name(value.func) == "Fix":
            return None
        if isinstance(value, ast.Constant) and value.value is None:
            return None
        if isinstance(value, ast.IfExp):
            return self.problem(value.body, seen) or self.problem(value.orelse, seen)
        if isinstance(value, ast.Call) and _name(value.func) in self.functions:
            function = self.functions[_name(value.func)]
            return None if _is_fix(function.returns) else f"{function.name}() is not annotated to return a Fix"
        if isinstance(value, ast.Attribute) and value.attr in self.fields:
            return None if _is_fix(self.fields[value.attr]) else f"the field {value.attr} is not a Fix"
        if isinstance(value, ast.Name):
            return self._name_problem(value, seen)
        if isinstance(value, _Unpacked) and isinstance(value.value, ast.Tuple):
            return self.problem(value.value.elts[value.index], seen)
        if isinstance(value, _Unpacked) and isinstance(value.value, ast.Call):
            function = self.functions.get(_name(value.value.func))
            returns = function.returns if function is not None else None
            if value.element:  # list[...] / Iterator[...]: the item's type
                returns = returns.slice if isinstance(returns, ast.Subscript) else None
            if isinstance(returns, ast.Subscript) and isinstance(returns.slice, ast.Tuple):
                element = returns.slice.elts[value.index] if value.index < len(returns.slice.elts) else None
                return None if _is_fix(element) else f"element {value.index} of {function.name}() is not a Fix"
            return f"unpacked from {ast.unparse(value.value)[:60]}, which is not annotated tuple[..., Fix]"
        return f"free text: {ast.unparse(value)[:80]}"

    def _name_problem(self, name: ast.Name, seen: frozenset[str]) -> Optional[str]:
        if name.id in seen:
            return None
        scope = self.scope_of(name)
        args = scope.args if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
        if args is not None:
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if arg.arg == name.id:
                    return None if _is_fix(arg.annotation) else f"the parameter {name.id} is not annotated Fix"
        values = list(_assigned(scope, name.id)) or list(_assigned(self.tree, name.id))
        if not values:
            return f"{name.id} is never assigned"
        for value in values:
            why = self.problem(value, seen | {name.id})
            if why:
                return f"{name.id} = {why}"
        return None


def _name(func: ast.expr) -> str:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _is_fix(annotation: Optional[ast.expr]) -> bool:
    """An annotation that admits a Fix (or None) and no text."""
    if annotation is None:
        return False
    text = ast.unparse(annotation).strip("'\"")
    return "Fix" in text and "str" not in text


def _assigned(scope: ast.AST, name: str) -> Iterator[ast.expr]:
    """The values `name` is assigned in `scope` (not in functions nested in it); unpacked from a call's tuple,
    the element's annotation stands for it (`message, fix = describe(...)` with `-> tuple[str, Fix]`)."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == name:
                    yield node.value
                elif isinstance(target, ast.Tuple) and name in [_name(e) for e in target.elts]:
                    yield _Unpacked(node.value, [_name(e) for e in target.elts].index(name))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and _name(node.target) == name and node.value:
            yield node.value
        elif isinstance(node, ast.For) and isinstance(node.target, ast.Tuple) and isinstance(node.iter, ast.Call):
            names = [_name(e) for e in node.target.elts]
            if name in names:  # `for problem, fix in problems(...)` with `-> list[tuple[str, Fix]]`
                yield _Unpacked(node.iter, names.index(name), element=True)
        todo.extend(ast.iter_child_nodes(node))


class _Unpacked(ast.expr):
    """Element `index` of what `value` returns."""

    def __init__(self, value: ast.expr, index: int, element: bool = False) -> None:
        super().__init__()
        self.value, self.index, self.element = value, index, element  # element: of each item of what it returns


def free_text_fixes(path: Path, source: str, helpers: Sequence[ast.Module] = ()) -> list[str]:
    """`path:line: why` for each finding in `source` whose fix may be free text."""
    tree = ast.parse(source)
    module = _Module(tree, list(helpers))
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func) in FINDINGS:
            for keyword in node.keywords:
                why = module.problem(keyword.value) if keyword.arg == "fix" else None
                if why:
                    problems.append(f"{path.relative_to(ROOT)}:{keyword.value.lineno}: {why}")
    return problems


def _helpers() -> list[ast.Module]:
    """The checks' shared private modules (checks/_*.py): a fix may be built by one of their functions."""
    return [ast.parse(p.read_text(encoding="utf-8")) for p in sorted((ROOT / "checks").glob("_*.py"))]


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_builtin_findings_get_an_explicit_fix(path):
    assert free_text_fixes(path, path.read_text(encoding="utf-8"), _helpers()) == []


@pytest.mark.parametrize(
    "source",
    [
        'Finding("m", fix="Do this:\\nx = 1")',
        'Finding("m", fix=f"Do {this}")',
        'Finding("m", fix="Do this:\\n" + CODE)',
        'Finding("m", fix="a" if c else Fix("b"))',
        'fix = "Do this"\nFinding("m", fix=fix)',
        'def f(fix: str):\n    yield Finding("m", fix=fix)',
        'def g() -> str:\n    return "x"\nFinding("m", fix=g())',
        'def g():\n    return Fix("x")\nFinding("m", fix=g())',
        "class C:\n    fix: str\nFinding('m', fix=c.fix)",
        'fix = Fix("a")\nif c:\n    fix = "b"\nFinding("m", fix=fix)',
        'FixableFinding("m", fix="Do this")',
        'Finding("m", fix=unknown)',
        "def d() -> tuple[str, str]:\n    ...\nm, fix = d()\nFinding(m, fix=fix)",
        "m, fix = d()\nFinding(m, fix=fix)",
    ],
)
def test_free_text_is_caught(source):
    assert free_text_fixes(ROOT / "checks" / "x.py", source), source


@pytest.mark.parametrize(
    "source",
    [
        'Finding("m", fix=Fix(title="Do this:", code="x = 1"))',
        'Finding("m", fix=None)',
        'Finding("m", fix=Fix("a") if c else None)',
        'fix = Fix("a")\nif c:\n    fix = Fix("b", "y = 2")\nFinding("m", fix=fix)',
        'def f(fix: "Optional[Fix]"):\n    yield Finding("m", fix=fix)',
        'def g() -> Fix:\n    return Fix("x")\nFinding("m", fix=g())',
        "class C:\n    fix: Fix\nFinding('m', fix=c.fix)",
        'Finding("m")',
        "def d() -> tuple[str, Fix]:\n    ...\nm, fix = d()\nFinding(m, fix=fix)",
    ],
)
def test_explicit_fixes_pass(source):
    assert free_text_fixes(ROOT / "checks" / "x.py", source) == [], source
