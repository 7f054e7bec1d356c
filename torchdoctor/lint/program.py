"""The program model behind cross-function and cross-file lint questions.

Modules are read from disk on demand (the project root is found as ruff finds it: the nearest folder
upward with a pyproject.toml, setup.py, setup.cfg or .git), so the answer for one file never depends on
which other files a run was given. Per module: the import table (relative and absolute imports resolved to
project files, else installed libraries' source) and the functions it defines; per function: the facts rules
declare (torchdoctor.lint.facts), each computed once. Calls resolve through closures, methods (the class
hierarchy, `__call__`), imports and re-exports, into installed libraries too.
"""

from __future__ import annotations

import ast
import hashlib
import os
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, TypeVar, Union, cast

from torchdoctor.lint import import_roots
from torchdoctor.lint.facts import DEPTH, Fact, Function
from torchdoctor.lint.files import SKIPPED_DIRS
from torchdoctor.lint.index import CallSite, FunctionScope, ModuleIndex, build_index, last, resolve
from torchdoctor.lint.libraries import MISSING, LibraryFacts
from torchdoctor.lint.stubs import LibraryModule, LibraryScope, describe
from torchdoctor.pysource import parse_quietly

ROOT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
_GRAD_OFF = ("no_grad", "inference_mode")
_MAX_MODULE_BYTES = 2_000_000  # larger files are not parsed to answer questions about other files
T = TypeVar("T")
_MISSING = object()
# Imports never resolved against the project (the commonest library roots, to save the file look-ups).
_EXTERNAL = frozenset(
    {
        "torch",
        "torchvision",
        "numpy",
        "typing",
        "os",
        "sys",
        "collections",
        "__future__",
        "dataclasses",
        "functools",
        "pathlib",
        "math",
        "time",
        "json",
        "argparse",
        "logging",
        "re",
        "random",
        "itertools",
        "abc",
        "copy",
        "warnings",
        "subprocess",
        "shutil",
    }
)


def stamp(path: str) -> str:
    """A file's modification stamp (what a cached result depending on it records); '' when it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return ""
    return f"{st.st_mtime_ns}:{st.st_size}"


def find_root(folder: str) -> str:
    """The nearest folder at or above `folder` with a pyproject.toml, setup.py, setup.cfg or .git (as ruff finds
    a project); `folder` itself when there is none."""
    current = os.path.abspath(folder)
    while True:
        if any(os.path.exists(os.path.join(current, m)) for m in ROOT_MARKERS):
            return current
        parent = os.path.dirname(current)
        if parent == current:
            return os.path.abspath(folder)
        current = parent


@dataclass
class Module:
    """One parsed project module: its index, import table and function definitions."""

    path: str
    tree: ast.Module
    index: ModuleIndex
    _imports: Optional[dict[str, tuple[Optional[str], Optional[str]]]] = None  # name -> (file, attr); see imports
    functions: dict[str, FunctionScope] = field(default_factory=dict)  # top-level functions
    methods: dict[tuple[str, str], FunctionScope] = field(default_factory=dict)  # (class, name) -> method
    parents: dict[int, FunctionScope] = field(default_factory=dict)  # id(def node) -> enclosing function
    local_defs: dict[int, dict[str, FunctionScope]] = field(default_factory=dict)  # id(function) -> its defs
    callable_classes: set[str] = field(default_factory=set)  # classes with a top-level `__call__` method
    data: Optional[bytes] = None  # the bytes read to parse it, until the run lints the file (see `take_data`)

    def take_data(self) -> Optional[bytes]:
        """The bytes this module was parsed from, handed over once (linting the file needs not read it again)."""
        data, self.data = self.data, None
        return data

    def imports(self, program: "Program") -> dict[str, tuple[Optional[str], Optional[str]]]:
        """The import table, resolved to project files on first use: name -> (file, attribute or None for a
        module). Imports resolving outside the project map to (None, ...)."""
        if self._imports is None:
            self._imports = _import_table(self, program)
        return self._imports

    def mentions(self, text: str) -> bool:
        """Whether a string constant of the module is `text` (e.g. an environment variable it reads)."""
        return any(isinstance(n, ast.Constant) and n.value == text for n in ast.walk(self.tree))


class Program:
    """The project model of one lint run: modules parsed on demand and cached, summaries cached per function."""

    def __init__(self) -> None:
        self._roots: dict[str, str] = {}
        self._modules: dict[str, Optional[Module]] = {}
        self._facts: dict[tuple[str, int, Fact], object] = {}  # (file, id(def node), fact) -> value
        self._fact_files: dict[tuple[str, int, Fact], frozenset[str]] = {}  # the modules each answer read
        self._working: list[tuple[str, int, Fact]] = []  # the facts being worked out, outermost first
        self._partial: set[tuple[str, int, Fact]] = set()  # answers that met a recursive call (order-dependent)
        self._resolved: dict[tuple[str, int], list[tuple[CallSite, tuple[Module, FunctionScope]]]] = {}
        self._resolved_files: dict[tuple[str, int], frozenset[str]] = {}
        self._trees: dict[str, list[str]] = {}
        self._tree_stamps: dict[str, str] = {}
        self._found: dict[tuple[str, str, int], Optional[str]] = {}
        self._keys: dict[str, list[tuple]] = {}  # file -> the keys of its answers above (to forget them with it)
        self._callers: dict[tuple[str, str], _Calls] = {}  # (root, name) -> the calls `name(...)` found there
        self._file_ranks: dict[str, dict[str, int]] = {}
        self._roots_of_imports: dict[str, bool] = {}  # file -> whether it may import a project module
        self._project_names: dict[tuple[str, str], bool] = {}  # (folder, name) -> a project module may be `name`
        self._read: dict[str, bytes] = {}  # files the callers search read and did not parse, until linted
        self._linting: Optional[str] = None  # the file the run is checking now
        self._packages: dict[str, bool] = {}  # folder -> whether it has an __init__.py
        self._shared: set[str] = set()  # modules read to answer another file's question (kept to the release)
        self.touched: set[str] = set()  # modules consulted since the caller last cleared this
        self._libraries: dict[str, Optional[str]] = {}  # dotted module -> its source in site-packages
        self._library_paths: Optional[list[str]] = None
        self.libraries: Optional[LibraryFacts] = None  # installed libraries' facts kept per version (see libraries)
        self._stubs: dict[tuple[str, Optional[str], str, int], LibraryScope] = {}  # kept resolutions' functions
        self._stub_modules: dict[str, LibraryModule] = {}

    # ---- files and modules -------------------------------------------------------------------------------
    def root_of(self, path: str) -> str:
        """The project root of the file at absolute `path` (its own folder when no marker is found)."""
        folder = os.path.dirname(path)
        found = self._roots.get(folder)
        if found is None:
            found = self._roots[folder] = _searchable_root(find_root(folder), folder)
        return found

    def release(self, root: str) -> None:
        """Forget the modules under `root` and the answers keyed by their nodes: the run has linted that project
        and moves on, so memory holds one project's trees at a time (a later question parses them again)."""
        prefix = os.path.join(root, "")
        self._read = {path: data for path, data in self._read.items() if not path.startswith(prefix)}
        gone = [path for path in self._modules if path.startswith(prefix)]
        if not gone:
            return
        self._callers = {}  # keyed by the ids of functions that may be among the freed ones: found again on demand
        for path in gone:
            self._forget(path)
            self._shared.discard(path)

    def checking(self, path: Optional[str]) -> None:
        """The run starts checking the file at absolute `path` (None: it is done with it). A script that imports
        nothing of its project, lies in no package and that no other file's question read is forgotten once
        checked, its tree freed while it is still in the caches: no other file's callers can be in it, few other
        files import it, and holding every such script's tree to the project's end made a run an eighth slower
        (a later question about a forgotten file parses it again)."""
        done = self._linting
        self._linting = path
        if done is None or done in self._shared or self._in_package(done):
            return
        module = self._modules.get(done)
        if module is None or not self._may_import_project(done, module):
            self._forget(done)

    def _in_package(self, path: str) -> bool:
        folder = os.path.dirname(path)
        found = self._packages.get(folder)
        if found is None:
            found = self._packages[folder] = os.path.isfile(os.path.join(folder, "__init__.py"))
        return found

    def _forget(self, path: str) -> None:
        """Drop one module and every answer keyed by its nodes (their ids are free for new objects once the tree
        is gone)."""
        self._modules.pop(path, None)
        self._read.pop(path, None)
        for key in self._keys.pop(path, ()):
            self._facts.pop(key, None)
            self._fact_files.pop(key, None)
            self._partial.discard(key)
            self._resolved.pop(key, None)
            self._resolved_files.pop(key, None)
        for calls in self._callers.values():
            calls.forget(path)

    def add(self, path: str, tree: ast.Module, index: ModuleIndex) -> Module:
        """Register a module already parsed by the run (so it is not parsed twice)."""
        module = self._modules.get(path)
        if module is None or module.tree is not tree:
            module = self._modules[path] = _module(path, tree, index, self)
        return module

    def module(self, path: str, data: Optional[bytes] = None) -> Optional[Module]:
        """The module at absolute `path` (whose bytes are `data` when the caller read them already), parsed once;
        None when it cannot be read or parsed."""
        self.touched.add(path)
        if path != self._linting:
            self._shared.add(path)
        if path in self._modules:
            return self._modules[path]
        module = None
        try:
            if data is None and os.path.getsize(path) <= _MAX_MODULE_BYTES:
                with open(path, "rb") as fh:
                    data = fh.read()
            if data is not None and len(data) <= _MAX_MODULE_BYTES:
                tree = parse_quietly(data, path)
                module = _module(path, tree, build_index(tree), self)
                module.data = data
        except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
            module = None
        self._modules[path] = module
        return module

    def module_or_empty(self, path: str) -> Module:
        """The module at `path`, or one with nothing in it when it cannot be parsed (a library file a kept
        resolution named that changed in place since)."""
        found = self.module(path)
        if found is None:
            tree = ast.Module(body=[], type_ignores=[])
            found = _module(path, tree, build_index(tree), self)
        return found

    def find_module(self, importer: str, dotted: str, level: int) -> Optional[str]:
        """The project file an import names: relative to the importer's package, else from the project root or
        the importer's folder (a script's own folder is first on sys.path); None for anything outside."""
        key = (os.path.dirname(importer), dotted, level)
        if key not in self._found:
            self._found[key] = self._find_module(importer, dotted, level)
        return self._found[key]

    def find_library(self, dotted: str) -> Optional[str]:
        """The source file of module `dotted` of an installed library (found file by file in site-packages, as
        the import system would, without importing anything); None when absent or compiled only. Its functions
        are then summarised like the project's, so a call into `timm.utils` has a real answer."""
        if not dotted:
            return None
        found = self._libraries.get(dotted)
        if found is None and dotted not in self._libraries:
            parts = dotted.split(".")
            for base in self.library_folders():
                target = os.path.join(base, *parts)
                for candidate in (target + ".py", os.path.join(target, "__init__.py")):
                    if os.path.isfile(candidate):
                        found = candidate
                        break
                if found is not None:
                    break
            self._libraries[dotted] = found
        return found

    def library_folders(self) -> list[str]:
        if self._library_paths is None:
            self._library_paths = _library_folders()
        return self._library_paths

    def _find_module(self, importer: str, dotted: str, level: int) -> Optional[str]:
        parts = dotted.split(".") if dotted else []
        if level:
            base = os.path.dirname(importer)
            for _ in range(level - 1):
                base = os.path.dirname(base)
            bases = [base]
        else:
            bases = self._import_bases(importer)
        for base in bases:
            target = os.path.join(base, *parts)
            for candidate in (target + ".py", os.path.join(target, "__init__.py")):
                if os.path.isfile(candidate):
                    return candidate
        return None

    # ---- resolution ---------------------------------------------------------------------------------------
    def lookup(self, module: Module, name: str, hops: int = 0) -> Optional[tuple[Module, FunctionScope]]:
        """The function `name` means at the top level of `module` (following imports and re-exports)."""
        if name in module.functions:
            return module, module.functions[name]
        target = module.imports(self).get(name)
        if target is None or target[0] is None or target[1] is None or hops > 3:
            return None
        self.touched.add(target[0])
        attr = target[1]
        return self._into_library(
            "lookup", target[0], (attr, hops + 1), lambda other: self.lookup(other, attr, hops + 1)
        )

    def resolve_call(
        self, module: Module, scope: FunctionScope, call: CallSite
    ) -> Optional[tuple[Module, FunctionScope]]:
        """The function a call runs, when the project defines it: a closure or local def, a method of the same
        class (`self.f()`) or of an instance's class (`box = Box(); box.f()`), a module function, or an imported one
        (`f()`, `mod.f()`). The answer depends only on
        `scope` and the callee's name (`f` or `x.f`), which is what callers may memoise it by."""
        func = call.node.func
        if type(func) is ast.Name:
            inner: Optional[FunctionScope] = scope
            local_defs = module.local_defs
            while inner is not None and type(inner.node) is not ast.Module:  # closures, innermost first
                defs = local_defs.get(id(inner.node))
                local = defs.get(func.id) if defs is not None else None
                if local is not None:
                    return module, local
                inner = module.parents.get(id(inner.node))
            instance = self._instance_call(module, scope, func.id) if module.callable_classes else None
            if instance is None:
                instance = self.lookup(module, func.id)
            return instance if instance is not None else self._imported_instance_call(module, scope, func.id)
        if type(func) is ast.Attribute and type(func.value) is ast.Name:
            if func.value.id in ("self", "cls") and scope.class_name is not None:
                return self.method(module, scope.class_name, func.attr)
            alias = module.index.aliases.get(func.value.id)
            if alias is not None and alias.split(".", 1)[0] in _EXTERNAL:
                return None  # `torch.zeros(...)`, `np.mean(...)`: never a project or followed library function
            target = module.imports(self).get(func.value.id)
            if target is not None and target[0] is not None and target[1] is None:  # a project module
                self.touched.add(target[0])
                attr = func.attr
                return self._into_library("lookup", target[0], (attr, 0), lambda other: self.lookup(other, attr))
            return self.instance_method(module, scope, func.value.id, func.attr)  # `meter = Meter(); meter.f()`
        return None

    def method(
        self, module: Module, class_name: str, name: str, hops: int = 0
    ) -> Optional[tuple[Module, FunctionScope]]:
        """The method `name` of class `class_name` of `module` as Python finds it: the class's own, else its
        bases' in order (project classes of this module or imported ones), else, for a method the class only
        calls, the one subclass in this module that defines it (a base's `train()` calling `self.run_step()`)."""
        own = module.methods.get((class_name, name))
        if own is not None and not _abstract(own.node):
            return module, own
        if hops > 4:
            return None
        for base in module.index.classes.get(class_name, []):
            found = self._base_method(module, base, name, hops)
            if found is not None:
                return found
        if hops == 0:
            subclasses = [
                c for c, bases in module.index.classes.items() if class_name in bases and (c, name) in module.methods
            ]
            if len(subclasses) == 1:
                return module, module.methods[(subclasses[0], name)]
        return (module, own) if own is not None else None

    def instance_method(
        self, module: Module, scope: FunctionScope, receiver: str, name: str
    ) -> Optional[tuple[Module, FunctionScope]]:
        """The method `name` of the project class `receiver` is an instance of: `receiver` is bound (only) to
        `Cls(...)` in this function or at module level, `Cls` a class of this module or one it imports."""
        top = module.index.scopes[0]
        value: Optional[ast.expr] = None
        for where in (scope,) if scope is top else (scope, top):
            for b in where.bindings_of(receiver):
                if b.value is not None:
                    if value is not None:
                        return None  # bound more than once: which instance is unknown
                    value = b.value
        if type(value) is not ast.Call or type(value.func) is not ast.Name:
            return None
        cls = value.func.id
        if cls in module.index.classes:
            return self.method(module, cls, name)
        target = module.imports(self).get(cls)
        if target is None or target[0] is None or target[1] is None:
            return None
        self.touched.add(target[0])
        imported = target[1]
        return self._into_library(
            "instance-method", target[0], (imported, name), lambda other: self._class_method(other, imported, name)
        )

    def _class_method(self, other: Module, cls: str, name: str) -> Optional[tuple[Module, FunctionScope]]:
        """The method `name` of class `cls` that module `other` defines or re-exports."""
        if cls not in other.index.classes:  # re-exported: `from .cuda import NativeScaler`
            again = other.imports(self).get(cls)
            if again is None or again[0] is None or not again[1]:
                return None
            defined = again[1]
            return self._into_library(
                "class-method",
                again[0],
                (defined, name),
                lambda found: self.method(found, defined, name) if defined in found.index.classes else None,
            )
        return self.method(other, cls, name)

    def _base_method(self, module: Module, base: str, name: str, hops: int) -> Optional[tuple[Module, FunctionScope]]:
        """The method `name` found in base class `base` (a dotted name as the module writes it) or its bases."""
        if base in module.index.classes:
            return self.method(module, base, name, hops + 1)
        # the class names are stored with import aliases resolved: find the local name the import bound
        local = next((k for k, v in module.index.aliases.items() if v == base), None)
        if local is not None:
            head, rest = local, ""
        else:
            head = next((k for k, v in module.index.aliases.items() if base.startswith(v + ".")), "")
            rest = base[len(module.index.aliases[head]) + 1 :] if head else ""
        target = module.imports(self).get(head) if head else None
        if target is None or target[0] is None:
            return None
        self.touched.add(target[0])
        cls = rest if target[1] is None else target[1] if not rest else None
        if cls is None or "." in cls:
            return None
        found = cls
        return self._into_library(
            "base-method",
            target[0],
            (found, name, hops),
            lambda other: self._base_class_method(other, found, name, hops),
        )

    def _base_class_method(
        self, other: Module, cls: str, name: str, hops: int
    ) -> Optional[tuple[Module, FunctionScope]]:
        """The method `name` of base class `cls`, defined or re-exported by module `other`, or of its bases."""
        if cls not in other.index.classes:  # re-exported: `from .trainer import Trainer` in a package
            again = other.imports(self).get(cls)
            if again is None or again[0] is None or again[1] is None or hops > 3:
                return None
            defined = again[1]
            return self._into_library(
                "base-class-method",
                again[0],
                (defined, name, hops),
                lambda found: self.method(found, defined, name, hops + 1),
            )
        return self.method(other, cls, name, hops + 1)

    def _into_library(
        self,
        kind: str,
        path: str,
        args: tuple,
        answer: Callable[[Module], Optional[tuple[Module, FunctionScope]]],
    ) -> Optional[tuple[Module, FunctionScope]]:
        """`answer(module at path)`: a resolution that continues in the module at `path`. When that is an installed
        library's module not parsed in this run, the answer an earlier run kept for its distribution version is
        used (the function it found, as a `LibraryScope`: nothing parsed); otherwise it is worked out and kept."""
        libraries = self.libraries
        if libraries is None or not libraries.keeps(path):  # a project module (or no cache): as it is
            other = self.module(path)
            return answer(other) if other is not None else None
        kept = libraries.resolution(path, kind, args)
        if kept is not MISSING:
            found = self._kept_resolution(kept)
            if found is not MISSING:
                return cast(Optional[tuple[Module, FunctionScope]], found)
        asker, self.touched = self.touched, set()
        try:
            other = self.module(path)
            found = answer(other) if other is not None else None
        finally:
            read, self.touched = self.touched, asker
            asker |= read
        described = None
        if found is not None:
            scope = found[1]
            if isinstance(scope, LibraryScope) and scope.pending:  # itself from a kept resolution: as kept
                params, keywords, bound = scope.params, sorted(scope.keywords), sorted(scope.locals)
                line = scope.lineno
            else:
                params, keywords, bound = describe(scope)
                line = getattr(scope.node, "lineno", 0)
            described = (found[0].path, scope.class_name, scope.name, line, params, keywords, bound)
        libraries.keep_resolution(path, kind, args, described, read | {path})
        return found

    def _kept_resolution(self, kept: object) -> object:
        """The function a kept resolution names (None: it found none); MISSING when a file it read is gone."""
        libraries = self.libraries
        assert libraries is not None and isinstance(kept, dict)
        files = [libraries.locate(rel) for rel in kept["read"]]
        if any(f is None for f in files):
            return MISSING
        self.touched.update(cast(list[str], files))  # what the answer read: a cached result depends on it all the same
        found = kept["found"]
        if found is None:
            return None
        path = libraries.locate(found["module"])
        if path is None:
            return MISSING
        key = (path, found["class"], found["name"], found["line"])
        stub = self._stubs.get(key)
        if stub is None:
            module = self._stub_modules.get(path)
            if module is None:
                module = self._stub_modules[path] = LibraryModule(path, self)
            stub = self._stubs[key] = LibraryScope(
                module,
                found["class"],
                found["name"],
                found["line"],
                tuple(found["params"]),
                frozenset(found["keywords"]),
                frozenset(found["bound"]),
            )
        if not stub.pending or path in self._modules:  # parsed in this run after all: the real function
            return stub.real()
        return stub.module, stub

    def _instance_call(self, module: Module, scope: FunctionScope, name: str) -> Optional[tuple[Module, FunctionScope]]:
        """`name(...)` where `name` is bound here to an instance of a class of this module: its `__call__`."""
        for b in scope.bindings_of(name):
            if isinstance(b.value, ast.Call) and isinstance(b.value.func, ast.Name):
                method = module.methods.get((b.value.func.id, "__call__"))
                if method is not None:
                    return module, method
        return None

    def _imported_instance_call(
        self, module: Module, scope: FunctionScope, name: str
    ) -> Optional[tuple[Module, FunctionScope]]:
        """`name(...)` where `name` is bound to an instance of an imported class (project or library): its
        `__call__` (`loss_scaler = NativeScaler()` ... `loss_scaler(loss, optimizer)`)."""
        if not any(
            isinstance(b.value, ast.Call)
            and isinstance(b.value.func, ast.Name)
            and b.value.func.id in module.index.imported
            for b in scope.bindings_of(name)
        ):
            return None
        return self.instance_method(module, scope, name, "__call__")

    # ---- facts --------------------------------------------------------------------------------------------
    def fact(self, module: Module, scope: FunctionScope, fact: Fact[T], depth: int = 0) -> T:
        """A rule's declared fact of one function (see torchdoctor.lint.facts), computed once per function and
        run: its local predicate, joined (when the fact propagates) with the facts of the functions its calls
        resolve to, up to `DEPTH` calls deep from where it was first asked. A call that resolves to nothing is
        unknown and adds nothing; a recursive call sees `fact.empty`."""
        libraries = self.libraries
        if isinstance(scope, LibraryScope):  # known from a kept resolution: its kept fact, else parse it now
            if scope.pending and libraries is not None:
                kept = libraries.get(module.path, scope, fact, depth)
                if kept is not MISSING:
                    return cast(T, kept)
            module, scope = scope.real()
        key = (module.path, id(scope.node), fact)
        cached = self._facts.get(key, _MISSING)
        if cached is not _MISSING:
            if key in self._working:  # a recursive call: every answer on the way back rests on a partial one
                self._partial.update(self._working[self._working.index(key) + 1 :])
            files = self._fact_files.get(key)
            if files:
                self.touched |= files  # the answer read those modules: whoever asks depends on them too
            return cast(T, cached)
        if libraries is not None:
            kept = libraries.get(module.path, scope, fact, depth)
            if kept is not MISSING:
                self._facts[key] = kept
                self._keys.setdefault(module.path, []).append(key)
                return cast(T, kept)
        asker, self.touched = self.touched, set()
        self._facts[key] = fact.empty  # while it is worked out
        self._keys.setdefault(module.path, []).append(key)
        self._working.append(key)
        try:
            fn = Function(self, module, scope, depth)
            value = fact.local(fn)
            join, final = fact.join, fact.final
            if join is not None and depth < DEPTH and not (final is not None and final(value)):
                for call, found in self._resolved_calls(module, scope):
                    callee = Function(self, found[0], found[1], depth + 1)
                    got = callee.fact(fact)
                    if fact.through is not None:
                        got = fact.through(got, fn, call, callee)
                    value = join(value, got)
                    if final is not None and final(value):
                        break
        except BaseException:
            del self._facts[key]  # a predicate that failed leaves no answer behind (its rule reports the error)
            raise
        finally:
            self._working.pop()
            read, self.touched = self.touched, asker
            asker |= read
        self._facts[key] = value
        if read:
            self._fact_files[key] = frozenset(read)
        if libraries is not None and key not in self._partial:  # kept only when asking again gives the same
            libraries.put(module.path, scope, fact, depth, value)
        return value

    def _resolved_calls(
        self, module: Module, scope: FunctionScope
    ) -> list[tuple[CallSite, tuple[Module, FunctionScope]]]:
        """The function's calls that run a known function other than itself, with that function, resolved once for
        all the facts that follow them (an unknown call adds nothing to a fact, nor does recursion into itself); the
        modules the resolution read are recorded with it, as a fact's are."""
        key = (module.path, id(scope.node))
        found = self._resolved.get(key)
        if found is None:
            asker, self.touched = self.touched, set()
            try:
                resolve = self.resolve_call
                found = self._resolved[key] = [
                    (call, target)
                    for call in scope.calls
                    if (target := resolve(module, scope, call)) is not None and target[1] is not scope
                ]
                self._keys.setdefault(module.path, []).append(key)
            finally:
                read, self.touched = self.touched, asker
                asker |= read
            if read:
                self._resolved_files[key] = frozenset(read)
        else:
            self.touched |= self._resolved_files.get(key, frozenset())
        return found

    def unknown_decorators(self, module: Module, scope: FunctionScope) -> list[ast.expr]:
        """Decorators of the function that the project does not define and that are not known to leave autograd
        alone (`staticmethod`, `functools.wraps(...)`, `torch.jit.*`...): what they do is unknown."""
        if isinstance(scope.node, ast.Module):
            return []
        out = []
        parent = module.parents.get(id(scope.node)) or module.index.scopes[0]
        for d in scope.node.decorator_list:
            name = d.func if isinstance(d, ast.Call) else d
            qual = resolve(name, module.index.aliases) if isinstance(name, (ast.Name, ast.Attribute)) else ""
            if (
                not qual
                or qual in _HARMLESS_DECORATORS
                or qual.startswith(_HARMLESS_DECORATOR_PREFIXES)
                or last(qual) in _GRAD_OFF
                or last(qual) in ("setter", "getter", "deleter")
            ):
                continue
            fake = CallSite(ast.Call(func=name, args=[], keywords=[]), "", last(qual), None, None, False, (0, 0))
            if self.resolve_call(module, parent, fake) is None:
                out.append(d)
        return out

    # ---- callers -------------------------------------------------------------------------------------------
    def project_files(self, root: str) -> list[str]:
        """Every Python file under `root` (build outputs, virtual environments and VCS folders skipped)."""
        files = self._trees.get(root)
        if files is None:
            files = []
            for folder, dirs, names in os.walk(root):
                dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.startswith("."))
                files.extend(os.path.join(folder, n) for n in sorted(names) if n.endswith(".py"))
            self._trees[root] = files
        return files

    def tree_stamp(self, root: str) -> str:
        """Changes whenever a Python file under `root` is added, removed or changed (computed once per run)."""
        found = self._tree_stamps.get(root)
        if found is None:
            listing = "\n".join(f"{p} {stamp(p)}" for p in self.project_files(root))
            found = self._tree_stamps[root] = hashlib.blake2b(
                listing.encode("utf-8", "surrogatepass"), digest_size=16
            ).hexdigest()
        return found

    def callers(self, module: Module, scope: FunctionScope) -> list[tuple[Module, FunctionScope, CallSite]]:
        """Every call in the project that resolves to this function, in the project's file order (files that never
        name it, or import no project module and are not `module`, are not parsed)."""
        root = self.root_of(module.path)
        found = self._calls_named(root, scope.name, module).found.get(id(scope.node), [])
        if len(found) < 2:
            return found
        rank = self._ranks(root)
        return sorted(found, key=lambda entry: rank[entry[0].path])

    def _calls_named(self, root: str, name: str, module: Module) -> _Calls:
        """The calls `name(...)` or `x.name(...)` in the project under `root`, by the function each resolves to: in
        `module` and in every file that may import a project module (a file that imports none can only call its
        own functions); the project is searched once per run and name."""
        calls = self._callers.get((root, name))
        if calls is None:
            calls = self._callers[(root, name)] = _Calls()
            word = name.encode()
            for path in self.project_files(root):
                if path == module.path:
                    continue  # (searched below, whatever it imports)
                other = self._modules.get(path)
                if other is None and path not in self._modules:
                    if self._roots_of_imports.get(path) is False:
                        continue  # (known from an earlier question: not read again)
                    try:
                        with open(path, "rb") as fh:
                            data = fh.read()
                    except OSError:
                        continue
                    if word not in data or not self._may_import_project(path, data):
                        self._read[path] = data  # linting the file later needs not read it again
                        continue
                    other = self.module(path, data)
                elif other is None or not self._may_import_project(path, other):
                    continue
                if other is not None:
                    self._index_calls(other, name, calls)
        if module.path not in calls.searched and module.path in self._ranks(root):
            self._index_calls(module, name, calls)
        return calls

    def _index_calls(self, module: Module, name: str, calls: _Calls) -> None:
        calls.searched.add(module.path)
        for s in module.index.scopes:
            for call in s.calls if name in s.call_attrs else ():
                target = self.resolve_call(module, s, call) if call.attr == name else None
                if target is not None and not isinstance(target[1], LibraryScope):  # (a library's: never asked)
                    calls.found.setdefault(id(target[1].node), []).append((module, s, call))
                    calls.owners[id(target[1].node)] = target[0].path

    def _ranks(self, root: str) -> dict[str, int]:
        """Each project file's place in the project's file order."""
        ranks = self._file_ranks.get(root)
        if ranks is None:
            ranks = self._file_ranks[root] = {path: i for i, path in enumerate(self.project_files(root))}
        return ranks

    def _may_import_project(self, path: str, source: Union[bytes, Module]) -> bool:
        """Whether the file may import a module of its project (or itself): told from its import statements'
        first names (`from utils.io import load`: `utils`), which the project must have as a file or folder
        where the import would look; a relative import always may. From the bytes when it is not parsed."""
        found = self._roots_of_imports.get(path)
        if found is None:
            roots = import_roots.from_text(source) if isinstance(source, bytes) else source.index.import_roots
            found = roots is None or any(self._project_name(path, name) for name in roots)
            self._roots_of_imports[path] = found
        return found

    def _project_name(self, importer: str, name: str) -> bool:
        """Whether an absolute import starting with `name` in the file `importer` may find a project module (where
        `find_module` looks: the importer's folder, the project root, its `src`); a relative one always may."""
        if name == import_roots.RELATIVE:
            return True
        if name in _EXTERNAL:
            return False
        key = (os.path.dirname(importer), name)
        found = self._project_names.get(key)
        if found is None:
            found = self._project_names[key] = any(
                os.path.exists(os.path.join(base, name)) or os.path.exists(os.path.join(base, name + ".py"))
                for base in self._import_bases(importer)
            )
        return found

    def _import_bases(self, importer: str) -> list[str]:
        """The folders an absolute import in the file `importer` is looked for in: its own folder (a script's is
        first on sys.path), the project root and the root's `src`."""
        root = self.root_of(importer)
        return [os.path.dirname(importer), root, os.path.join(root, "src")]

    def take_read(self, path: str) -> Optional[bytes]:
        """The bytes of the file at `path` if this run read them already and has not handed them over (linting
        the file needs not read it again)."""
        known = self._modules.get(path)
        data = known.take_data() if known is not None else None
        return data if data is not None else self._read.pop(path, None)

    def parsed(self, path: str) -> Optional[Module]:
        """The module at `path` if this run has parsed it already (so linting it does not parse it again)."""
        return self._modules.get(path)


# Decorators known to leave autograd as it is (anything else the project does not define is unknown).
_HARMLESS_DECORATORS = frozenset(
    {
        "staticmethod",
        "classmethod",
        "property",
        "abstractmethod",
        "abc.abstractmethod",
        "override",
        "typing.override",
        "typing_extensions.override",
        "overload",
        "typing.overload",
        "dataclass",
        "dataclasses.dataclass",
        "contextmanager",
        "contextlib.contextmanager",
        "pytest.fixture",
        "torch.enable_grad",
        "torch.compile",
        "unittest.skip",
        "unittest.skipIf",
    }
)
_HARMLESS_DECORATOR_PREFIXES = (
    "functools.",
    "torch.jit.",
    "torch.compiler.",
    "torch._dynamo.",
    "pytest.mark.",
    "click.",
    "typing.",
    "lru_cache",
    "cache",
    "wraps",
    "torch.autocast",
    "torch.cuda.amp.",
    "torch.amp.",
)


@dataclass
class _Calls:
    """The calls of one name found in a project, by the function each runs (the id of its node)."""

    found: dict[int, list[tuple[Module, FunctionScope, CallSite]]] = field(default_factory=dict)
    owners: dict[int, str] = field(default_factory=dict)  # id of a called function's node -> its file
    searched: set[str] = field(default_factory=set)  # the files whose calls are in `found`

    def forget(self, path: str) -> None:
        """Drop what the module at `path` adds: its functions (their ids may be reused) and its calls."""
        for key in [key for key, owner in self.owners.items() if owner == path]:
            del self.found[key], self.owners[key]
        if path in self.searched:
            self.searched.discard(path)
            for key, entries in self.found.items():
                self.found[key] = [entry for entry in entries if entry[0].path != path]


def _abstract(node: ast.AST) -> bool:
    """A method whose body only raises NotImplementedError, passes or is `...` (a docstring aside)."""
    body = [
        stmt
        for stmt in getattr(node, "body", [])
        if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant))
    ]
    return all(
        isinstance(stmt, ast.Pass) or isinstance(stmt, ast.Raise) and "NotImplementedError" in ast.dump(stmt)
        for stmt in body
    )


def _searchable_root(root: str, folder: str) -> str:
    """The root whose files are searched for callers: `root`, unless `folder` lies in a dot-folder below it (a
    project kept in `~/.jobs/proj` of a home-folder repository), which the search would skip: then that folder."""
    rel = os.path.relpath(folder, root)
    if rel == "." or rel.startswith(".."):
        return root
    parts = rel.split(os.sep)
    hidden = [i for i, part in enumerate(parts) if part.startswith(".") and part not in SKIPPED_DIRS]
    return os.path.join(root, *parts[: hidden[-1] + 1]) if hidden else root


def _module(path: str, tree: ast.Module, index: ModuleIndex, program: Program) -> Module:
    """Build the import table, function table and closure parents of a parsed module."""
    module = Module(path, tree, index)
    for inner in index.scopes:
        scope = inner.parent
        if scope is None:
            continue
        if isinstance(scope.node, ast.Module):
            if inner.class_name is None:
                module.functions[inner.name] = inner
            else:
                module.methods[(inner.class_name, inner.name)] = inner
                if inner.name == "__call__":
                    module.callable_classes.add(inner.class_name)
        else:
            module.parents[id(inner.node)] = scope
            module.local_defs.setdefault(id(scope.node), {})[inner.name] = inner
    return module


def _import_table(module: Module, program: Program) -> dict[str, tuple[Optional[str], Optional[str]]]:
    table: dict[str, tuple[Optional[str], Optional[str]]] = {}
    path = module.path

    def find(dotted: str, level: int) -> Optional[str]:
        """A project module, else (absolute imports) an installed library's source file."""
        return program.find_module(path, dotted, level) or (program.find_library(dotted) if not level else None)

    body = module.tree.body
    top = [stmt for stmt in body if type(stmt) is ast.Import or type(stmt) is ast.ImportFrom]
    for stmt in top if len(top) == module.index.imports else _statements(body):
        if isinstance(stmt, ast.Import):
            for a in stmt.names:
                if (a.asname or "." not in a.name) and a.name.split(".")[0] not in _EXTERNAL:
                    table.setdefault(a.asname or a.name, (find(a.name, 0), None))
        elif isinstance(stmt, ast.ImportFrom) and (stmt.level or (stmt.module or "").split(".")[0] not in _EXTERNAL):
            source = find(stmt.module or "", stmt.level)
            for a in stmt.names:
                if a.name == "*":
                    continue
                sub = find(f"{stmt.module}.{a.name}" if stmt.module else a.name, stmt.level)
                table.setdefault(a.asname or a.name, (sub, None) if sub else (source, a.name))
    return table


def _library_folders() -> list[str]:
    """The folders of installed distributions on this interpreter's path (site-packages / dist-packages): the
    environment lint runs in. The working directory and the project's own folders are not among them."""
    import sys

    return [p for p in sys.path if p and os.path.basename(p.rstrip(os.sep)) in ("site-packages", "dist-packages")]


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement, nested ones included (not the expressions: imports are statements)."""
    stack = list(reversed(body))
    while stack:
        stmt = stack.pop()
        yield stmt
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            block = getattr(stmt, name, None)
            if block:
                stack.extend(reversed(block))
