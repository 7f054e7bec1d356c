"""The module graph: nothing imports the command line, and no two modules import each other (even lazily)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"torchdoctor": ROOT / "torchdoctor", "torchdoctor.checks": ROOT / "checks"}


def modules() -> dict[str, Path]:
    """Every module of the package (checks/ is installed as torchdoctor.checks) -> its file."""
    out = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports anywhere (functions included), except under TYPE_CHECKING."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    stack = list(ast.parse(path.read_text(encoding="utf-8")).body)
    while stack:
        node = stack.pop()
        if _is_type_checking(node):
            continue
        stack.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def test_nothing_outside_the_cli_imports_it():
    importers = {
        name
        for name, deps in graph().items()
        if not name.startswith("torchdoctor.cli") and any(d.startswith("torchdoctor.cli") for d in deps)
    }
    assert importers == {"torchdoctor.__main__"}  # `python -m torchdoctor` is the command line too


def test_no_import_cycles():
    edges = graph()
    state: dict[str, str] = {}
    cycles = []

    def visit(node, trail):
        state[node] = "open"
        for dep in sorted(edges[node]):
            if state.get(dep) == "open":
                cycles.append(trail[trail.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, trail + [dep])
        state[node] = "done"

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])
    assert cycles == []
    assert "torchdoctor.lint.command" in edges["torchdoctor.cli.lint"]  # the graph does see lazy imports


def test_checks_import_only_the_sdk():
    outside = {
        name: sorted(d for d in deps if not d.startswith(("torchdoctor.sdk", "torchdoctor.checks")))
        for name, deps in graph().items()
        if name.startswith("torchdoctor.checks")
    }
    assert {name: deps for name, deps in outside.items() if deps} == {}


# the generated index of built-in checks, which the registry reads so that a door imports only its own checks
READ_ACROSS = {("torchdoctor.registry", "torchdoctor.checks._scopes")}


def test_private_modules_are_imported_only_inside_their_package():
    """A module whose name starts with `_` belongs to its package: nothing outside it may import it."""
    crossing = set()
    for name, deps in graph().items():
        for dep in deps:
            package, _, leaf = dep.rpartition(".")
            if leaf.startswith("_") and not leaf.startswith("__") and not name.startswith(package + "."):
                crossing.add((name, dep))
    assert crossing == READ_ACROSS


DOORS = {
    "torchdoctor.sdk.env": "torchdoctor.env",
    "torchdoctor.sdk.checkpoint": "torchdoctor.ckpt",
    "torchdoctor.sdk.runtime": "torchdoctor.watch",
    "torchdoctor.sdk.source": "torchdoctor.lint",
}
SHARED = ("torchdoctor.findings", "torchdoctor.pitfall", "torchdoctor.units", "torchdoctor.wrappers")


def test_each_sdk_module_imports_only_its_own_door():
    edges = graph()
    for sdk, door in DOORS.items():
        assert [d for d in edges[sdk] if not d.startswith((door, *SHARED))] == [], sdk
