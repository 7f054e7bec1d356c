"""What a global a pickle calls or instantiates can reach, read from its installed source, never imported.

A non-allowlisted callable is judged by what its code can do, not by the package its name comes from.
Its module is located with importlib's path finders (a parent package is *found*, not imported) and read
with `ast`; from the function (or, for a class, the methods loading runs: `__new__`, `__init__`,
`__setstate__`, `_missing_`, the metaclass's `__call__`, along the bases) the calls are followed through
the library's own code, breadth first and bounded, until one reaches a *sink*: process creation,
`eval`/`exec`/`compile`, an import by name, a file write or delete, the network, a nested unsafe
deserialisation (`pickle.load`, `torch.load` without `weights_only=True`, `yaml.load` with an unsafe loader,
`numpy.load(allow_pickle=True)`) or `ctypes`. A function's decorators are followed like its calls, a call
through a module-level table (`OPENERS[suffix](path, mode=mode)`) reaches every callable the table holds, and
the constants a call passes (or a parameter's constant default) stand in for the parameter inside the callee,
so `@open_file(1, mode="wb")` writes and `@open_file(0, mode="rb")` does not. Standard-library, torch and
numpy callees are judged by the sink table only (their code is not followed, except inside the package of
the global being judged).
A global of `__main__` names whatever the *loading* program defines or imports under that name: it is judged
as each Python file under the working directory (the user's project) that binds the name at module level would
run it, read as `__main__` (a script's `from os import system` reaches os.system; an enum class reaches
nothing), and cannot be inspected when none binds it.
Verdicts are cached in the per-user cache, per distribution version of the global's package, each with
the modules the analysis looked for (what each resolved to, with its file's size and modification time, or
that it was not found): a cached verdict is reused only while every one of them still resolves the same, so
an upgrade of any library the calls went through, or a library installed where one was missing, is judged
again.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence, Union

from torchdoctor.ckpt.policy import VETTED_ROOTS, Use, Verdict, classify, dangerous_reason
from torchdoctor.pysource import parse_quietly

_ANALYSIS = 2  # bump when the rules change: cached verdicts of older rules are not reused
_MAX_FUNCTIONS = 300  # function bodies read per verdict
_MAX_DEPTH = 8  # calls followed from the global
_VETTED_DEPTH = 2  # ... when the global is in the standard library, torch or numpy
_NOT_FOLLOWED = frozenset(sys.stdlib_module_names) | {"torch", "numpy", "builtins"}
_BUILTINS = frozenset(dir(builtins))

PROCESS, EVAL, IMPORT, WRITE, NETWORK, UNPICKLE, NATIVE = (
    "process creation",
    "code evaluation",
    "an import by name",
    "a file write or delete",
    "the network",
    "a nested unsafe deserialisation",
    "native code (ctypes)",
)


def _names(category: str, module: str, names: str) -> dict[str, str]:
    return {f"{module}.{n}": category for n in names.split()}


# qualified name -> what calling (or, for a class, instantiating) it does
SINKS: dict[str, str] = {
    **_names(PROCESS, "subprocess", "Popen run call check_call check_output getoutput getstatusoutput"),
    **_names(
        PROCESS,
        "os",
        "system popen execl execle execlp execlpe execv execve execvp execvpe spawnl spawnle "
        "spawnlp spawnlpe spawnv spawnve spawnvp spawnvpe posix_spawn posix_spawnp fork forkpty "
        "startfile",
    ),
    **_names(PROCESS, "posix", "system popen execv execve fork posix_spawn posix_spawnp"),
    **_names(PROCESS, "pty", "spawn fork"),
    **_names(PROCESS, "platform", "popen"),
    **_names(PROCESS, "asyncio", "create_subprocess_exec create_subprocess_shell"),
    **_names(PROCESS, "webbrowser", "open open_new open_new_tab"),
    **_names(PROCESS, "_posixsubprocess", "fork_exec"),
    **_names(EVAL, "builtins", "eval exec compile execfile"),
    **_names(EVAL, "runpy", "run_path run_module _run_code _run_module_code"),
    **_names(EVAL, "code", "interact InteractiveInterpreter InteractiveConsole compile_command"),
    **_names(EVAL, "timeit", "timeit repeat Timer"),
    **_names(EVAL, "cProfile", "run runctx"),
    **_names(EVAL, "profile", "run runctx"),
    **_names(EVAL, "pdb", "run runeval runcall"),
    **_names(IMPORT, "builtins", "__import__"),
    **_names(IMPORT, "importlib", "import_module __import__ reload"),
    **_names(IMPORT, "importlib.util", "spec_from_file_location module_from_spec find_spec"),
    **_names(IMPORT, "importlib.machinery", "SourceFileLoader SourcelessFileLoader ExtensionFileLoader"),
    **_names(IMPORT, "pkgutil", "resolve_name"),
    **_names(IMPORT, "pydoc", "locate importfile"),
    **_names(IMPORT, "imp", "load_source load_module load_dynamic load_compiled"),
    **_names(IMPORT, "zipimport", "zipimporter"),
    **_names(
        WRITE,
        "os",
        "remove unlink rmdir removedirs rename renames replace mkdir makedirs symlink link "
        "truncate chmod chown lchown mkfifo mknod open utime",
    ),
    **_names(
        WRITE, "shutil", "rmtree move copy copy2 copyfile copytree copymode copystat make_archive unpack_archive chown"
    ),
    **_names(WRITE, "tempfile", "mkstemp mkdtemp NamedTemporaryFile TemporaryFile TemporaryDirectory"),
    **_names(WRITE, "logging", "FileHandler"),
    **_names(WRITE, "logging.handlers", "RotatingFileHandler TimedRotatingFileHandler WatchedFileHandler"),
    **_names(WRITE, "sqlite3", "connect"),
    **_names(WRITE, "dbm", "open"),
    **_names(WRITE, "numpy", "save savez savez_compressed savetxt memmap"),
    **_names(WRITE, "numpy.lib.format", "open_memmap"),
    **_names(WRITE, "torch", "save from_file"),
    **_names(NETWORK, "socket", "socket create_connection create_server fromfd"),
    **_names(NETWORK, "urllib.request", "urlopen urlretrieve build_opener"),
    **_names(NETWORK, "http.client", "HTTPConnection HTTPSConnection"),
    **_names(NETWORK, "ftplib", "FTP FTP_TLS"),
    **_names(NETWORK, "smtplib", "SMTP SMTP_SSL"),
    **_names(NETWORK, "telnetlib", "Telnet"),
    **_names(NETWORK, "xmlrpc.client", "ServerProxy"),
    **_names(NETWORK, "requests", "get post put delete head patch options request Session session"),
    **_names(NETWORK, "httpx", "get post put delete head patch options request stream Client AsyncClient"),
    **_names(NETWORK, "urllib3", "PoolManager request HTTPConnectionPool HTTPSConnectionPool"),
    **_names(NETWORK, "aiohttp", "ClientSession request"),
    **_names(UNPICKLE, "pickle", "load loads Unpickler _load _loads _Unpickler"),
    **_names(UNPICKLE, "_pickle", "load loads Unpickler"),
    **_names(UNPICKLE, "marshal", "load loads"),
    **_names(UNPICKLE, "dill", "load loads"),
    **_names(UNPICKLE, "cloudpickle", "load loads"),
    **_names(UNPICKLE, "joblib", "load"),
    **_names(UNPICKLE, "shelve", "open"),
    **_names(UNPICKLE, "pandas", "read_pickle"),
    **_names(UNPICKLE, "jsonpickle", "decode"),
    **_names(UNPICKLE, "yaml", "unsafe_load unsafe_load_all"),
    **_names(UNPICKLE, "torch.jit", "load"),
    **_names(UNPICKLE, "torch.package", "PackageImporter"),
    **_names(WRITE, "safetensors._safetensors_rust", "serialize_file"),
    **_names(NATIVE, "torch.ops", "load_library"),
    **_names(NATIVE, "torch.classes", "load_library"),
    **_names(NATIVE, "torch.utils.cpp_extension", "load load_inline"),
}
# every name of these modules is a sink
_SINK_MODULES = {"ctypes": NATIVE, "_ctypes": NATIVE, "cffi": NATIVE}
# method names that write files or run code whatever object they are called on
_SINK_METHODS = {
    "write_text": WRITE,
    "write_bytes": WRITE,
    "unlink": WRITE,
    "rmdir": WRITE,
    "touch": WRITE,
    "symlink_to": WRITE,
    "hardlink_to": WRITE,
    "extractall": WRITE,
    "tofile": WRITE,
    "exec_module": IMPORT,
    "load_module": IMPORT,
    "dlopen": NATIVE,
}
# callables that are sinks only for some arguments: name -> (category, argument index, keyword)
_OPENERS = {
    "builtins.open": 1,
    "io.open": 1,
    "io.FileIO": 1,
    "gzip.open": 1,
    "bz2.open": 1,
    "lzma.open": 1,
    "gzip.GzipFile": 1,
    "bz2.BZ2File": 1,
    "lzma.LZMAFile": 1,
    "tarfile.open": 1,
    "zipfile.ZipFile": 1,
    "codecs.open": 1,
    "os.fdopen": 1,
}
_SAFE_YAML_LOADERS = ("SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader", "FullLoader", "CFullLoader")


@dataclass(frozen=True)
class Reach:
    """The verdict on one global: the path to a sink when it reaches one; whether its source could be read."""

    path: tuple[str, ...] = ()  # the global, the callees followed, the sink
    what: str = ""  # the sink's category ("" when none is reached)
    inspected: bool = True
    note: str = ""  # why the source could not be inspected

    @property
    def dangerous(self) -> bool:
        """True when a sink was reached; a source that could not be inspected is not dangerous by
        itself (callers weigh `inspected` separately).
        """
        return bool(self.what)

    def reason(self) -> str:
        """One line for a finding."""
        if self.what:
            return f"it reaches {self.what}: {' → '.join(self.path)}" + (f" ({self.note})" if self.note else "")
        if not self.inspected:
            return f"its code could not be inspected ({self.note})"
        return (
            "its source (read, not run) reaches no process, eval/exec, import by name, file write, network, "
            "nested unpickling or ctypes" + (f" ({self.note})" if self.note else "")
        )


def _keyword(call: ast.Call, index: int, name: str) -> Optional[ast.expr]:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    if any(isinstance(a, ast.Starred) for a in call.args[: index + 1]) or any(kw.arg is None for kw in call.keywords):
        return ast.Name("<unknown>")
    return call.args[index] if len(call.args) > index else None


def _conditional(qual: str, call: Optional[ast.Call]) -> str:
    """The category of a call that is a sink only for some arguments ("" when these arguments are harmless)."""
    if call is None:
        return ""
    if qual in _OPENERS:
        mode = _keyword(call, _OPENERS[qual], "mode")
        if mode is None:
            return ""
        if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and not set(mode.value) & set("wax+"):
            return ""
        return WRITE
    if qual in ("torch.load", "torch.serialization.load"):
        flag = _keyword(call, 99, "weights_only")
        return "" if isinstance(flag, ast.Constant) and flag.value is True else UNPICKLE
    if qual in ("numpy.load", "numpy.lib.npyio.load"):
        flag = _keyword(call, 2, "allow_pickle")
        return "" if flag is None or isinstance(flag, ast.Constant) and flag.value is False else UNPICKLE
    if qual in ("yaml.load", "yaml.load_all"):
        loader = _keyword(call, 1, "Loader")
        name = loader.attr if isinstance(loader, ast.Attribute) else loader.id if isinstance(loader, ast.Name) else ""
        return "" if name in _SAFE_YAML_LOADERS else UNPICKLE
    return ""


def sink(qual: str, call: Optional[ast.Call] = None) -> str:
    """What reaching `qual` (called by `call`, when known) does, or ""."""
    for suffix in (".__init__", ".__new__", ".__call__"):
        if qual.endswith(suffix):
            qual = qual[: -len(suffix)]
    if qual.startswith("<object>."):
        return _SINK_METHODS.get(qual[len("<object>.") :], "")
    if qual.startswith("__builtin__."):
        qual = "builtins." + qual[len("__builtin__.") :]
    found = SINKS.get(qual) or _conditional(qual, call)
    if (
        found == IMPORT
        and call is not None
        and call.args
        and all(isinstance(a, ast.Constant) for a in call.args + [k.value for k in call.keywords])
    ):
        return ""  # the library imports a module it names itself
    if found:
        return found
    return next((what for mod, what in _SINK_MODULES.items() if qual == mod or qual.startswith(mod + ".")), "")


def sink_with_arguments(qual: str, args: object) -> str:
    """What the pickle's own call `qual(*args)` does when that depends on its arguments (`open(p, "w")`,
    `yaml.load(s, yaml.UnsafeLoader)`, `numpy.load(p, None, True)`), or ""."""
    if not isinstance(args, tuple):
        return ""
    from torchdoctor.ckpt.objects import GlobalRef

    def node(value: object) -> ast.expr:
        if isinstance(value, (str, bytes, int, float, bool)) or value is None:
            return ast.Constant(value)
        if isinstance(value, GlobalRef):
            return ast.Attribute(ast.Name(value.module), value.name)
        return ast.Name("<computed>")

    return _conditional(qual, ast.Call(ast.Name(qual), [node(a) for a in args], []))


# -- locating and reading modules (never importing them) ----------------------------------------------
_consulted: Optional[dict[str, str]] = None  # while a verdict is computed: each module looked for -> its stamp


def _spec(modname: str) -> Optional[importlib.machinery.ModuleSpec]:
    """The module's spec found by path finders only: parents are located, never imported. While a verdict
    is computed, what each module resolved to is recorded (the verdict depends on it)."""
    spec = _find(modname)
    if _consulted is not None and modname not in _consulted:
        _consulted[modname] = _stamp(spec)
    return spec


def _stamp(spec: Optional[importlib.machinery.ModuleSpec]) -> str:
    """What a module resolved to: its file with size and modification time ("" when it was not found)."""
    if spec is None:
        return ""
    if not spec.origin or not spec.has_location:  # a namespace package, a built-in or frozen module
        return f"{spec.origin}:{sorted(spec.submodule_search_locations or [])}"
    try:
        st = os.stat(spec.origin)
    except OSError:
        return spec.origin
    return f"{spec.origin}:{st.st_size}:{st.st_mtime_ns}"


@functools.lru_cache(maxsize=None)
def _find(modname: str) -> Optional[importlib.machinery.ModuleSpec]:
    parent, _, _ = modname.rpartition(".")
    try:
        if not parent:
            return importlib.machinery.PathFinder.find_spec(modname)
        up = _find(parent)
        if up is None or not up.submodule_search_locations:
            return None
        return importlib.machinery.PathFinder.find_spec(modname, list(up.submodule_search_locations))
    except (ImportError, ValueError, OSError):
        return None


@dataclass
class _Module:
    name: str
    path: str
    is_package: bool
    defs: dict[str, ast.AST]  # top-level name -> FunctionDef/ClassDef, or the expression bound to it
    imports: dict[str, str]  # top-level name -> the dotted name it imports
    stars: list[str]  # modules imported with `from m import *`, and those a module-level __getattr__ imports from


@functools.lru_cache(maxsize=512)
def _module(modname: str) -> Optional[_Module]:
    spec = _spec(modname)
    origin = spec.origin if spec is not None else None
    if not origin or not origin.endswith(".py"):
        return None
    return _parse(modname, origin, bool(spec and spec.submodule_search_locations))


def _parse(modname: str, origin: str, is_package: bool) -> Optional[_Module]:
    """The top-level names of the source file `origin`, read as module `modname`."""
    try:
        with open(origin, "rb") as f:
            tree = parse_quietly(importlib.util.decode_source(f.read()), origin)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError, RecursionError, MemoryError):
        return None
    mod = _Module(modname, origin, is_package, {}, {}, [])
    package = modname if mod.is_package else modname.rpartition(".")[0]
    _collect(tree.body, mod, package)
    lazy = mod.defs.get("__getattr__")
    if isinstance(lazy, ast.FunctionDef):  # a lazy module: the names come from what its __getattr__ imports
        for node in ast.walk(lazy):
            if isinstance(node, ast.ImportFrom):
                base = _absolute(node, package)
                mod.stars += [base] + [f"{base}.{a.name}" for a in node.names if a.name != "*"]
    return mod


def _absolute(stmt: ast.ImportFrom, package: str) -> str:
    """The absolute module name of a (possibly relative) `from … import`."""
    base = stmt.module or ""
    if stmt.level:
        parts = package.split(".")
        anchor = ".".join(parts[: len(parts) - stmt.level + 1])
        base = f"{anchor}.{base}" if base else anchor
    return base


def _collect(body: list[ast.stmt], mod: _Module, package: str) -> None:
    """Top-level bindings; the first binding of a name wins (the `try:` import before its fallback)."""
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if not any(_is_named(d, "overload") for d in stmt.decorator_list):  # typing stubs have no body
                mod.defs[stmt.name] = stmt
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    mod.imports.setdefault(alias.asname, alias.name)
                else:
                    top = alias.name.split(".")[0]
                    mod.imports.setdefault(top, top)
        elif isinstance(stmt, ast.ImportFrom):
            base = _absolute(stmt, package)
            for alias in stmt.names:
                if alias.name == "*":
                    mod.stars.append(base)
                else:
                    mod.imports.setdefault(alias.asname or alias.name, f"{base}.{alias.name}")
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            mod.defs.setdefault(stmt.targets[0].id, stmt.value)
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            mod.defs.setdefault(stmt.target.id, stmt.value)
        elif isinstance(stmt, ast.If) and not _is_type_checking(stmt.test):
            _collect(stmt.body + stmt.orelse, mod, package)
        elif isinstance(stmt, ast.Try):
            _collect(stmt.body + [s for h in stmt.handlers for s in h.body] + stmt.orelse, mod, package)


def _is_named(expr: ast.expr, name: str) -> bool:
    return (isinstance(expr, ast.Name) and expr.id == name) or (isinstance(expr, ast.Attribute) and expr.attr == name)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


# -- resolving names ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Def:
    """A definition found in source: a function, a class, or a module-level instance of a class."""

    qual: str
    node: ast.AST
    module: _Module


Target = Union[_Def, str, None]  # a definition, a qualified name outside readable source, or unknown


def _lookup(qual: str, depth: int = 0) -> Target:
    """The definition `qual` names; its qualified name when the source is not there (a C function, a
    name the module builds at run time); None when nothing of that name can be found."""
    if depth > 12:
        return None
    parts = qual.split(".")
    for cut in range(len(parts) - 1, 0, -1):  # the longest prefix that is a module
        modname = ".".join(parts[:cut])
        if modname == "__main__":  # the loading program: only a script read as it (`_judge_main`), never found
            return _attribute(_main, parts[cut:], depth) if _main is not None else None
        if _spec(modname) is None:
            continue
        mod = _module(modname)
        if mod is None:
            return qual  # a compiled module or one without readable source
        return _attribute(mod, parts[cut:], depth)
    return qual if parts[0] in _NOT_FOLLOWED or parts[0] in sys.builtin_module_names else None


def _attribute(mod: _Module, names: list[str], depth: int) -> Target:
    head, rest = names[0], names[1:]
    node = mod.defs.get(head)
    if node is None:
        if head in mod.imports:
            return _lookup(".".join([mod.imports[head]] + rest), depth + 1)
        for star in mod.stars[:20]:
            star_mod = _module(star) if depth < 10 and star != mod.name else None
            if star_mod is not None and (head in star_mod.defs or head in star_mod.imports or star_mod.stars):
                found = _attribute(star_mod, names, depth + 1)
                if found is not None:
                    return found
        if rest and mod.is_package and _spec(f"{mod.name}.{head}") is not None:
            return _lookup(".".join([mod.name, head] + rest), depth + 1)
        return f"{mod.name}.{'.'.join(names)}" if mod.name.split(".")[0] in _NOT_FOLLOWED else None
    qual = f"{mod.name}.{head}"
    if isinstance(node, (ast.Name, ast.Attribute)):  # an alias: X = other.name
        target = _expr_qual(node, mod, set())
        return _lookup(".".join([target] + rest), depth + 1) if target else None
    found = _Def(qual, node, mod)
    for name in rest:
        if not isinstance(found, _Def) or not isinstance(found.node, ast.ClassDef):
            return None
        found = _method(found, name, depth + 1)
    return found


def _method(cls: _Def, name: str, depth: int = 0) -> Target:
    """`name` looked up along the class's bases (source classes first-found, depth first as a simple MRO)."""
    if depth > 12 or not isinstance(cls.node, ast.ClassDef):
        return None
    for stmt in reversed(cls.node.body):  # the last definition wins; typing overloads have no body
        if (
            isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))
            and stmt.name == name
            and not any(_is_named(d, "overload") for d in stmt.decorator_list)
        ):
            return _Def(f"{cls.qual}.{name}", stmt, cls.module)
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
            value = stmt.value
            if (
                isinstance(value, ast.Call)
                and len(value.args) == 1
                and isinstance(value.func, ast.Name)
                and value.func.id in ("staticmethod", "classmethod")
            ):
                value = value.args[0]
            target = _expr_qual(value, cls.module, set())
            return _lookup(target, depth + 1) if target else None
    for base in cls.node.bases:
        qual = _expr_qual(base, cls.module, set())
        if not qual or qual in ("builtins.object", "object"):
            continue
        found = _lookup(qual, depth + 1)
        if isinstance(found, _Def) and isinstance(found.node, ast.ClassDef):
            hit = _method(found, name, depth + 1)
            if hit is not None:
                return hit
        elif isinstance(found, str) and sink(found):
            return f"{found}.{name}"
    return None


def _expr_qual(expr: ast.expr, mod: _Module, local: set[str], imported: Optional[dict[str, str]] = None) -> str:
    """The dotted global name an expression refers to in `mod` ("" when it is not a plain global);
    `imported` holds the names a function imports inside its body."""
    if isinstance(expr, ast.Name):
        if imported and expr.id in imported:
            return imported[expr.id]
        if expr.id in local:
            return ""
        if expr.id in mod.defs:
            return f"{mod.name}.{expr.id}"
        if expr.id in mod.imports:
            return mod.imports[expr.id]
        if expr.id in _BUILTINS:
            return f"builtins.{expr.id}"
        return f"{mod.name}.{expr.id}" if mod.stars else ""
    if isinstance(expr, ast.Attribute):
        base = _expr_qual(expr.value, mod, local, imported)
        return f"{base}.{expr.attr}" if base else ""
    return ""


# -- following calls ---------------------------------------------------------------------------------
_CALLED_METHODS = ("__new__", "__init__", "__post_init__", "__setstate__", "_missing_", "__call__")
_NEW_METHODS = ("__new__", "__setstate__")


def _entry_points(found: _Def, use: Use) -> Iterator[Target]:
    """What loading runs of a definition: a function's body, or a class's construction methods."""
    node = found.node
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        yield found
    elif isinstance(node, ast.ClassDef):
        names = _CALLED_METHODS if use is Use.CALLED else _NEW_METHODS
        for name in names:
            if name == "__call__":
                continue  # the class's own __call__ runs on its instances, not on construction
            yield _method(found, name)
        if _method(found, "__setstate__") is None:
            yield _method(found, "__getattr__")  # BUILD asks the object for __setstate__
        for kw in node.keywords:
            if kw.arg == "metaclass" and use is Use.CALLED:
                meta = _lookup(_expr_qual(kw.value, found.module, set()) or "")
                if isinstance(meta, _Def):
                    yield _method(meta, "__call__")
    elif isinstance(node, ast.Call):  # a module-level instance: calling it runs its class's __call__
        yield found  # (and what the expression names: partial(os.system, ...))
        cls = _lookup(_expr_qual(node.func, found.module, set()) or "")
        if isinstance(cls, _Def):
            yield _method(cls, "__call__")
        elif isinstance(cls, str):
            yield f"{cls}.__call__"


def _locals(func: ast.AST) -> set[str]:
    out: set[str] = set()
    if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        a = func.args
        out |= {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
        out |= {x.arg for x in (a.vararg, a.kwarg) if x is not None}
    for node in ast.walk(func):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not func:
            out.add(node.name)
    return out


def _class_of(found: _Def) -> Optional[_Def]:
    """The class a method was found in (for `self.x()` and `super()`)."""
    qual = found.qual.rpartition(".")[0]
    owner = _lookup(qual)
    return owner if isinstance(owner, _Def) and isinstance(owner.node, ast.ClassDef) else None


def _function_scope(func: ast.AST, mod: _Module, local: set[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The names a function imports in its body, and its variables bound to a constructor call (name -> class)."""
    package = mod.name if mod.is_package else mod.name.rpartition(".")[0]
    imported: dict[str, str] = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Import):
            for alias in node.names:
                imported[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            imported.update({a.asname or a.name: f"{base}.{a.name}" for a in node.names if a.name != "*"})
    types: dict[str, str] = {}
    for node in ast.walk(func):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Call)
        ):
            qual = _expr_qual(node.value.func, mod, local, imported)
            if qual:
                types[node.targets[0].id] = qual
    return imported, types


def _on_instance(class_qual: str, attr: str) -> Target:
    """`attr` of an instance of the class `class_qual` names."""
    cls = _lookup(class_qual) if class_qual else None
    if isinstance(cls, _Def) and isinstance(cls.node, ast.ClassDef):
        return _method(cls, attr)
    return None


def _callees(found: _Def, judged: Optional[_Def]) -> Iterator[tuple[Target, str, Optional[ast.Call]]]:
    """(target, qualified name, call) for every global this function calls or refers to."""
    func, mod = found.node, found.module
    local = _locals(func)
    imported, types = _function_scope(func, mod, local)
    owner = _class_of(found)
    self_names = set()
    if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) and func.args.args and owner is not None:
        self_names = {func.args.args[0].arg}
    calls = {id(n.func): n for n in ast.walk(func) if isinstance(n, ast.Call)}
    for node in ast.walk(func):
        if not isinstance(node, (ast.Name, ast.Attribute)) or not isinstance(node.ctx, ast.Load):
            continue
        call = calls.get(id(node))
        if isinstance(node, ast.Attribute):
            base = node.value
            hit: Target = None
            if isinstance(base, ast.Name) and base.id in self_names:  # self.method(...) on the judged class
                cls = judged if judged is not None and isinstance(judged.node, ast.ClassDef) else owner
                if cls is not None and call is not None:
                    hit = _method(cls, node.attr)
            elif isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
                if owner is not None and call is not None and isinstance(owner.node, ast.ClassDef):
                    for b in owner.node.bases:
                        bq = _expr_qual(b, owner.module, set())
                        target = _lookup(bq) if bq else None
                        hit = (
                            _method(target, node.attr)
                            if isinstance(target, _Def)
                            else (f"{target}.{node.attr}" if isinstance(target, str) else None)
                        )
                        if hit is not None:
                            break
            elif call is not None and isinstance(base, ast.Name) and base.id in types:  # x = Cls(...); x.m()
                hit = _on_instance(types[base.id], node.attr)
            elif call is not None and isinstance(base, ast.Call):  # Cls(...).m()
                hit = _on_instance(_expr_qual(base.func, mod, local, imported), node.attr)
            if hit is not None:
                yield hit, hit.qual if isinstance(hit, _Def) else hit, call
                continue
            if call is not None and node.attr in _SINK_METHODS and not _expr_qual(node, mod, local, imported):
                yield None, f"<object>.{node.attr}", call
        qual = _expr_qual(node, mod, local, imported)
        if not qual or (isinstance(node, ast.Name) and qual.startswith("builtins.") and call is None):
            continue
        if call is None and not (SINKS.get(qual) and isinstance(node, ast.Attribute)):
            continue  # a reference is followed only when it names a sink outright (functools.partial(os.system, …))
        yield None, qual, call
    for call in calls.values():  # TABLE[key](...): a call of any callable a module-level table holds
        if isinstance(call.func, ast.Subscript):
            table = _lookup(_expr_qual(call.func.value, mod, local, imported) or "")
            if isinstance(table, _Def):
                for value in _table_values(table.node, table.module):
                    yield None, value, call


def _table_values(expr: ast.AST, mod: _Module, depth: int = 0) -> Iterator[str]:
    """The callables a module-level table holds: the values of a dict display or a dict/defaultdict call
    (`**other_table` followed), and what a defaultdict's factory returns (`defaultdict(lambda: open, ...)`)."""
    if depth > 3:
        return
    values: list[ast.expr] = []
    if isinstance(expr, ast.Dict):
        values = [v for k, v in zip(expr.keys, expr.values) if k is not None]
        spread = [v for k, v in zip(expr.keys, expr.values) if k is None]
    elif isinstance(expr, ast.Call) and _expr_qual(expr.func, mod, set()) in _TABLE_TYPES:
        args = list(expr.args)
        factory = args[0] if args else None
        if isinstance(factory, ast.Lambda) and _expr_qual(expr.func, mod, set()) == "collections.defaultdict":
            values.append(factory.body)
            args = args[1:]
        values += [kw.value for kw in expr.keywords if kw.arg is not None]
        spread = [kw.value for kw in expr.keywords if kw.arg is None] + args
    else:
        return
    for value in values:
        qual = _expr_qual(value, mod, set())
        if qual:
            yield qual
    for other in spread:
        found = (
            _lookup(_expr_qual(other, mod, set()) or "") if not isinstance(other, ast.Dict) else _Def("", other, mod)
        )
        if isinstance(found, _Def):
            yield from _table_values(found.node, found.module, depth + 1)


_TABLE_TYPES = ("builtins.dict", "collections.defaultdict", "collections.OrderedDict")
Bindings = tuple[tuple[str, Any], ...]


def _bind(target: _Def, call: Optional[ast.Call]) -> Bindings:
    """The constants a call passes to a module-level function's parameters (its constant defaults where the call
    passes nothing), for parameters the function never rebinds: `open_file(1, mode="rb")` reads, "wb" writes."""
    func = target.node
    if (
        call is None
        or not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef))
        or target.module.defs.get(target.qual.rpartition(".")[2]) is not func
        or any(isinstance(a, ast.Starred) for a in call.args)
        or any(kw.arg is None for kw in call.keywords)
    ):
        return ()
    a = func.args
    positional = a.posonlyargs + a.args
    values: dict[str, ast.expr] = dict(
        zip((p.arg for p in positional[len(positional) - len(a.defaults) :]), a.defaults)
    )
    values.update({p.arg: d for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None})
    values.update({p.arg: v for p, v in zip(positional, call.args)})
    values.update({kw.arg: kw.value for kw in call.keywords if kw.arg is not None})
    rebound = {n.id for n in ast.walk(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for inner in ast.walk(func):
        if inner is not func and isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            rebound |= _locals(inner)
    return tuple(sorted((k, v.value) for k, v in values.items() if isinstance(v, ast.Constant) and k not in rebound))


def _bound_call(call: Optional[ast.Call], bindings: Bindings) -> Optional[ast.Call]:
    """`call` with the arguments that name a bound parameter replaced by its constant."""
    if call is None or not bindings:
        return call
    known = dict(bindings)

    def value(expr: ast.expr) -> ast.expr:
        return ast.Constant(known[expr.id]) if isinstance(expr, ast.Name) and expr.id in known else expr

    return ast.Call(
        call.func, [value(x) for x in call.args], [ast.keyword(k.arg, value(k.value)) for k in call.keywords]
    )


_main: Optional[_Module] = None  # while a `__main__` global is judged: the script read as the loading program
_MAIN = (
    "`__main__` is the program that loads the file: `__main__.{name}` is whatever that program defines or imports "
    "as {name} (a script's `from os import system` makes `__main__.system` os.system)"
)
_MAX_SCRIPTS = 2000  # Python files read under the working directory for a `__main__` global (first 1 MB each)
_MAX_ENTRIES = 50_000  # folder entries walked there (a data folder of many files ends the search)
_NOT_PROJECT = ("site-packages", "node_modules", "__pycache__")


def _scripts_defining(name: str, root: str) -> list[_Module]:
    """The Python files under `root` (the working directory: the user's project; hidden folders, virtual
    environments and site-packages skipped; bounded by `_MAX_SCRIPTS` and `_MAX_ENTRIES`) that define or import
    `name` at module level, each read as `__main__`."""
    found: list[_Module] = []
    word = name.encode()
    looked = entries = 0
    for folder, dirs, files in os.walk(root):
        entries += len(dirs) + len(files)
        if entries > _MAX_ENTRIES:
            return found
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".")
            and d not in _NOT_PROJECT
            and not os.path.exists(os.path.join(folder, d, "pyvenv.cfg"))
        )
        for file in sorted(f for f in files if f.endswith(".py")):
            looked += 1
            if looked > _MAX_SCRIPTS:
                return found
            path = os.path.join(folder, file)
            try:
                with open(path, "rb") as f:
                    if word not in f.read(1 << 20):
                        continue
            except OSError:
                continue
            mod = _parse("__main__", path, False)
            if mod is not None and (name in mod.defs or name in mod.imports):
                found.append(mod)
    return found


def _judge_main(name: str, use: Use) -> Reach:
    """A global of `__main__`: judged as each script of the working directory that defines it would run it (the
    loading program is most likely one of them); not inspected when none does."""
    global _main
    root = f"__main__.{name}"
    scripts = _scripts_defining(name.split(".")[0], os.getcwd())
    if not scripts:
        note = f"{_MAIN.format(name=name)}; no Python file under {os.getcwd()} defines or imports it"
        return Reach((root,), inspected=False, note=note)
    where = ", ".join(os.path.relpath(m.path) for m in scripts[:3]) + (" …" if len(scripts) > 3 else "")
    for script in scripts:
        _main = script
        try:
            found = _follow(root, use)
        finally:
            _main = None
        if found.dangerous or not found.inspected:
            note = "; ".join(filter(None, (found.note, f"as {os.path.relpath(script.path)} defines it")))
            return Reach(found.path, found.what, found.inspected, note)
    return Reach((root,), note=f"as {where} under the working directory define{'s' * (len(scripts) == 1)} it")


def judge_uncached(module: str, name: str, use: Use) -> Reach:
    """Follow what loading runs of `module`.`name` (used as `use`) to the first sink, without the cache."""
    root = f"{module}.{name}"
    direct = sink(root) if use is Use.CALLED else ""
    if direct:
        return Reach((root,), direct)
    if module == "__main__":
        return _judge_main(name, use)
    return _follow(root, use)


def _follow(root: str, use: Use) -> Reach:
    """`judge_uncached` of the global `root` once it is known not to be a sink by name."""
    module, _, name = root.rpartition(".")
    start = _lookup(root)
    if start is None:
        return Reach(
            (root,),
            inspected=False,
            note=f"no definition of {name} in the installed {module}"
            if _spec(module)
            else f"module {module} is not installed here",
        )
    if isinstance(start, str):
        if start != root and sink(start):  # an alias of a sink: `from os import system` in the loading script
            return Reach((root, start), sink(start))
        return Reach((root,), inspected=False, note=f"{root} is compiled or built at run time; no Python source")
    top = module.split(".")[0]
    max_depth = _VETTED_DEPTH if top in _NOT_FOLLOWED else _MAX_DEPTH
    judged = start if isinstance(start.node, ast.ClassDef) else None
    queue: deque[tuple[_Def, tuple[str, ...], Bindings]] = deque()
    seen: set[tuple[str, Bindings]] = set()  # definitions queued (with the constants bound to their parameters)
    called: set[tuple[str, str]] = set()  # callees already looked at, with the constants passed to them
    for entry in _entry_points(start, use):
        if entry is None:
            continue
        name = entry if isinstance(entry, str) else entry.qual
        if sink(name):
            return Reach((root, name), sink(name))
        if isinstance(entry, _Def) and (entry.qual, ()) not in seen:
            seen.add((entry.qual, ()))
            queue.append((entry, (root,) if entry.qual == root else (root, entry.qual), ()))
    read = 0
    while queue and read < _MAX_FUNCTIONS:
        found, path, bindings = queue.popleft()
        read += 1
        for target, qual, call in _callees(found, judged):
            call = _bound_call(call, bindings)
            what = sink(qual, call)
            if what:
                return Reach(path + (qual,), what)
            passed = (
                repr([x.value for x in call.args + [k.value for k in call.keywords] if isinstance(x, ast.Constant)])
                if call
                else ""
            )
            if len(path) >= max_depth or (qual, passed) in called:
                continue
            called.add((qual, passed))
            if target is None:
                callee_top = qual.split(".")[0]
                if callee_top in _NOT_FOLLOWED and callee_top != top:
                    continue
                target = _lookup(qual)
            if isinstance(target, str):
                if sink(target, call):
                    return Reach(path + (target,), sink(target, call))
                continue
            if target is None or (
                target.module.name.split(".")[0] in _NOT_FOLLOWED and target.module.name.split(".")[0] != top
            ):
                continue
            for entry in _entry_points(target, Use.CALLED):
                step = path + (
                    (target.qual,)
                    if entry is target or entry is None
                    else (target.qual, entry if isinstance(entry, str) else entry.qual)
                )
                if isinstance(entry, str) or isinstance(entry, _Def) and sink(entry.qual):
                    what = sink(entry if isinstance(entry, str) else entry.qual)
                    if what:
                        return Reach(step, what)
                elif isinstance(entry, _Def):
                    bound = _bind(entry, call) if entry is target else ()
                    if (entry.qual, bound) not in seen:
                        seen.add((entry.qual, bound))
                        queue.append((entry, step, bound))
    return Reach((root,))


# -- the cache ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    import importlib.metadata

    try:
        return dict(importlib.metadata.packages_distributions())
    except Exception:  # a broken distribution's metadata only costs the cache
        return {}


def _version_key(module: str) -> str:
    """`_distribution_key`, remembered in the cache next to the verdicts, keyed by where the package's source
    is and when it was written (reading distribution metadata costs more than the cached verdict saves)."""
    top = module.split(".")[0]
    if top == "__main__":
        return ""  # the loading program, judged from the working directory's scripts: never cached
    spec = _spec(top)
    origin = spec.origin if spec is not None else None
    if not origin or not os.path.exists(origin):
        return _distribution_key(module)
    from torchdoctor.settings import cache_dir

    stamp = f"{origin}:{os.stat(origin).st_mtime_ns}"
    path = os.path.join(cache_dir(), "ckpt-reach", f"{_ANALYSIS}-distributions.json")
    try:
        with open(path, encoding="utf-8") as f:
            known = json.load(f).get(top)
        if isinstance(known, list) and len(known) == 2 and known[0] == stamp:
            return str(known[1])
    except (OSError, ValueError, AttributeError):
        pass
    key = _distribution_key(module)
    _store(path, top, [stamp, key])
    return key


def _distribution_key(module: str) -> str:
    """ "dist==version" of the package `module` belongs to (the Python version for the standard library);
    "" when it belongs to no installed distribution (a user's own module: never cached)."""
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top == "builtins":
        return f"python=={sys.version.split()[0]}"
    import importlib.metadata

    for guess in dict.fromkeys((top, top.replace("_", "-"))):  # most distributions are named as they import
        try:
            dist = importlib.metadata.distribution(guess)
        except importlib.metadata.PackageNotFoundError:
            continue
        if top in (dist.read_text("top_level.txt") or top).split():
            return f"{dist.metadata['Name']}=={dist.version}"
    dists = _distributions().get(top)  # reads every distribution's metadata: only for the others (yaml: PyYAML)
    if not dists:
        return ""
    try:
        return f"{dists[0]}=={importlib.metadata.version(dists[0])}"
    except importlib.metadata.PackageNotFoundError:
        return ""


_memory: dict[tuple[str, str, Use, str], Reach] = {}  # (module, name, use, the working directory for `__main__`)


def _unchanged(depends: object) -> bool:
    """Whether every module a cached verdict looked for still resolves as it did then."""
    return isinstance(depends, list) and all(
        isinstance(row, list) and len(row) == 2 and _stamp(_find(str(row[0]))) == row[1] for row in depends
    )


def _judge_recording(module: str, name: str, use: Use) -> tuple[Reach, list[list[str]]]:
    """`judge_uncached` and the modules it looked for, each with its stamp."""
    global _consulted
    _consulted = {}
    try:
        result = judge_uncached(module, name, use)
    except RecursionError:
        result = Reach((f"{module}.{name}",), inspected=False, note="its source is too deeply nested to read")
    finally:
        consulted, _consulted = _consulted, None
    return result, [[m, stamp] for m, stamp in sorted(consulted.items())]


def judge(module: str, name: str, use: Use) -> Reach:
    """`judge_uncached`, remembered in the per-user cache (best effort) per distribution version of the global's
    package, and reused while every module the analysis looked for resolves as it did (`_unchanged`)."""
    key = (module, name, use, os.getcwd() if module == "__main__" else "")
    if key in _memory:
        return _memory[key]
    version = _version_key(module)
    path = ""
    entry = f"{module}:{name}:{use}"
    if version:
        from torchdoctor.settings import cache_dir

        safe = "".join(c if c.isalnum() or c in "=.-_" else "_" for c in version)
        path = os.path.join(cache_dir(), "ckpt-reach", f"{_ANALYSIS}-{safe}.json")
        try:
            with open(path, encoding="utf-8") as f:
                known = json.load(f).get(entry)
            if isinstance(known, list) and len(known) == 5 and _unchanged(known[4]):
                _memory[key] = Reach(tuple(known[0]), str(known[1]), bool(known[2]), str(known[3]))
                return _memory[key]
        except (OSError, ValueError, TypeError, AttributeError):
            pass
    result, depends = _judge_recording(module, name, use)
    _memory[key] = result
    if path:
        _store(path, entry, [list(result.path), result.what, result.inspected, result.note, depends])
    return result


def _store(path: str, entry: str, value: object) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            if not isinstance(data, dict):
                data = {}
        except (OSError, ValueError):
            data = {}
        data[entry] = value
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError:
        pass


def verdict(module: str, name: str, use: Use, calls: Sequence[tuple[str, Any]] = ()) -> tuple[Verdict, str]:
    """The verdict on a global the pickle uses as `use` (`calls`: the pickle's first calls of it) and why.

    The exact allowlists and the name rules of `policy.classify` come first. What is left — third-party or
    user code, and standard-library/torch/numpy classes the pickle only instantiates — is judged by what its
    source reaches: reaching a sink is dangerous; code that cannot be inspected is dangerous when the pickle
    calls it and needs that code otherwise. A global only named is judged as if called (the object it reaches
    may call it).
    """
    found = classify(module, name, use)
    if found is Verdict.DANGEROUS:
        return found, dangerous_reason(module, name, use)
    if found is not Verdict.UNKNOWN:
        return found, ""
    qual = f"{module}.{name}"
    for _, args in calls if use is Use.CALLED else ():
        what = sink_with_arguments(qual, args)
        if what:
            return Verdict.DANGEROUS, f"with the arguments the pickle passes it reaches {what}: {qual}"
    vetted = module.split(".")[0] in VETTED_ROOTS
    if vetted and use is not Use.NEW:
        return found, ""
    reach = judge(module, name, Use.CALLED if use is Use.NAMED else use)
    if reach.dangerous or (use is Use.CALLED and not reach.inspected):
        return Verdict.DANGEROUS, reach.reason()
    return found, reach.reason()
