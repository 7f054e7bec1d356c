"""torchdoctor/ckpt/ is the security boundary that reads checkpoints without running them: every module and
every public function and method there (names not starting with `_`, methods of private classes and the
unpickler's `op_<OPCODE>` handlers included) says what it does and why, and keeps saying it.
"""

import ast
from pathlib import Path

CKPT = Path(__file__).resolve().parents[1] / "torchdoctor" / "ckpt"


def undocumented(source: str) -> tuple[list[str], int]:
    """The public functions and methods of `source` without a (non-blank) docstring, and how many were looked at.

    Walks the module body and class bodies (nested classes too), not function bodies: a helper defined inside
    a function is not part of any interface.
    """
    missing: list[str] = []
    seen = 0
    todo: list[tuple[str, list[ast.stmt]]] = [("", ast.parse(source).body)]
    while todo:
        prefix, body = todo.pop()
        for node in body:
            if isinstance(node, ast.ClassDef):
                todo.append((f"{prefix}{node.name}.", node.body))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                seen += 1
                if not (ast.get_docstring(node) or "").strip():
                    missing.append(f"{prefix}{node.name} (line {node.lineno})")
    return missing, seen


def test_every_public_function_and_method_of_ckpt_has_a_docstring() -> None:
    missing, seen = [], 0
    for path in sorted(CKPT.glob("*.py")):
        found, count = undocumented(path.read_text(encoding="utf-8"))
        missing += [f"{path.name}: {name}" for name in found]
        seen += count
    assert seen > 150  # the walk reached the modules (the unpickler alone has ~90 public methods)
    assert missing == []


def test_every_ckpt_module_has_a_docstring() -> None:
    bare = [
        p.name for p in sorted(CKPT.glob("*.py")) if not ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")))
    ]
    assert bare == []


def test_the_walk_finds_methods_of_private_classes_and_skips_private_names() -> None:
    source = '''
class _Machine:
    def op_REDUCE(self, pos):
        self.push(None)

    def documented(self):
        """Says what."""

    def _private(self):
        pass

    class Inner:
        async def fetch(self):
            """  """


def public():
    def nested():  # inside a function: not an interface
        pass


def _helper():
    pass
'''
    missing, seen = undocumented(source)
    assert sorted(missing) == ["_Machine.Inner.fetch (line 13)", "_Machine.op_REDUCE (line 3)", "public (line 17)"]
    assert seen == 4
