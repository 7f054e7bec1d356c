"""Judging a callee by what its installed source reaches: a small library written for each test, never imported."""

from __future__ import annotations

import json
import os
import pickle
import sys
import textwrap
import warnings

import pytest

from torchdoctor.ckpt import reach
from torchdoctor.ckpt.api import check_checkpoint
from torchdoctor.ckpt.policy import Use, Verdict

GADGETS = '''
import os as _os
import pickle
import subprocess
from socket import socket
import ctypes
import importlib
import gzip
from collections import defaultdict
import yaml
import numpy as np
import torch

open({canary!r}, "w").close()  # import-time side effect: judging must never import this module


class Launcher(subprocess.Popen):
    """Only inherits: instantiating it runs subprocess.Popen.__init__."""


class Quiet(subprocess.Popen):
    def __new__(cls, *args):
        return object.__new__(cls)


def evaluate(text):
    return helper(text)


def helper(text):
    return eval(text)


def plugin(name):
    return importlib.import_module(name)


def fixed_plugin():
    return importlib.import_module("json")


def save(path, data):
    with open(path, "wb") as f:
        f.write(data)


def read(path):
    with open(path) as f:
        return f.read()


def remove(path):
    _os.remove(path)


def connect(host):
    return socket().connect((host, 80))


def reload(blob):
    return pickle.loads(blob)


def config(text, loader=yaml.SafeLoader):
    return yaml.load(text, loader)


def unsafe_config(text):
    return yaml.load(text, Loader=yaml.UnsafeLoader)


def safe_config(text):
    return yaml.load(text, Loader=yaml.SafeLoader)


def arrays(path):
    return np.load(path, allow_pickle=True)


def weights(path):
    return torch.load(path, weights_only=True)


def checkpoint(path):
    return torch.load(path)


def native(name):
    return ctypes.CDLL(name)


class Restored:
    def __setstate__(self, state):
        self.__dict__.update(state)
        _os.system(state["cmd"])


class Plain:
    def __init__(self, value):
        self.value = value

    def run(self):
        _os.system("x")  # never called on load


class Child(Restored):
    pass


_OPENERS = {{".gz": gzip.open}}
_BY_SUFFIX = defaultdict(lambda: open, **_OPENERS)  # networkx's @open_file dispatches like this


def opens(mode="r"):
    def wrap(func):
        def inner(path, *args):
            return func(_BY_SUFFIX[path[-3:]](path, mode=mode), *args)

        return inner

    return wrap


@opens(mode="wb")
def dump_lines(f, lines):
    f.writelines(lines)


@opens("rb")
def load_lines(f):
    return f.readlines()


def apply(func, *args):
    return func(*args)


class Tool:
    def __init__(self, path):
        self.path = path
        self._write()

    def _write(self):
        save(self.path, b"")
'''


@pytest.fixture
def lib(tmp_path, monkeypatch):
    canary = tmp_path / "imported"
    (tmp_path / "gadgetlib.py").write_text(GADGETS.format(canary=str(canary)))
    monkeypatch.syspath_prepend(str(tmp_path))
    reach._find.cache_clear()
    reach._module.cache_clear()
    reach._memory.clear()
    yield canary
    reach._find.cache_clear()
    reach._module.cache_clear()
    reach._memory.clear()


@pytest.mark.parametrize(
    "name, use, what, via",
    [
        ("Launcher", Use.CALLED, reach.PROCESS, "subprocess.Popen.__init__"),
        ("evaluate", Use.CALLED, reach.EVAL, "gadgetlib.helper"),
        ("plugin", Use.CALLED, reach.IMPORT, "importlib.import_module"),
        ("save", Use.CALLED, reach.WRITE, "builtins.open"),
        ("remove", Use.CALLED, reach.WRITE, "os.remove"),
        ("connect", Use.CALLED, reach.NETWORK, "socket.socket"),
        ("reload", Use.CALLED, reach.UNPICKLE, "pickle.loads"),
        ("config", Use.CALLED, reach.UNPICKLE, "yaml.load"),
        ("unsafe_config", Use.CALLED, reach.UNPICKLE, "yaml.load"),
        ("arrays", Use.CALLED, reach.UNPICKLE, "numpy.load"),
        ("checkpoint", Use.CALLED, reach.UNPICKLE, "torch.load"),
        ("native", Use.CALLED, reach.NATIVE, "ctypes.CDLL"),
        ("Restored", Use.NEW, reach.PROCESS, "gadgetlib.Restored.__setstate__"),
        ("Child", Use.NEW, reach.PROCESS, "gadgetlib.Restored.__setstate__"),
        ("Tool", Use.CALLED, reach.WRITE, "gadgetlib.Tool._write"),
        ("dump_lines", Use.CALLED, reach.WRITE, "gadgetlib.opens"),  # decorator → table of openers → open(…, "wb")
    ],
)
def test_each_sink_is_reached_and_the_path_is_named(lib, name, use, what, via):
    found = reach.judge_uncached("gadgetlib", name, use)
    assert found.what == what and via in found.path and found.path[0] == f"gadgetlib.{name}"
    assert "→" in found.reason() and what in found.reason()
    assert not lib.exists() and "gadgetlib" not in sys.modules  # read, never imported


@pytest.mark.parametrize(
    "name, use",
    [
        ("read", Use.CALLED),
        ("fixed_plugin", Use.CALLED),
        ("safe_config", Use.CALLED),
        ("weights", Use.CALLED),
        ("Plain", Use.CALLED),
        ("Plain", Use.NEW),
        ("Launcher", Use.NEW),
        ("Quiet", Use.NEW),
        ("load_lines", Use.CALLED),  # the same decorator and table, with a read mode
        ("apply", Use.CALLED),  # calls only what it is passed: the pickle's own globals are judged themselves
    ],
)
def test_harmless_callees_reach_nothing(lib, name, use):
    found = reach.judge_uncached("gadgetlib", name, use)
    assert not found.dangerous and found.inspected, found


def test_a_writer_a_pickle_passes_to_a_harmless_caller_is_judged_itself(tmp_path, lib):
    """`gadgetlib.apply(gadgetlib.dump_lines, path, lines)`: `apply` reaches nothing by itself; the writer it is
    handed is a global the pickle names, judged as if called."""
    path = tmp_path / "apply.pkl"
    args = b"(" + _global("gadgetlib", "dump_lines") + b"X\x03\x00\x00\x00out]tR."
    path.write_bytes(b"\x80\x02" + _global("gadgetlib", "apply") + args)
    (finding,) = [f for f in check_checkpoint(str(path)).findings if f.name == "unsafe-pickle"]
    assert finding.key == "gadgetlib.dump_lines" and "gadgetlib.opens → builtins.open" in finding.message
    assert not lib.exists()


def test_code_that_cannot_be_read_is_unsafe_when_called_and_needs_code_when_only_instantiated(lib):
    called = reach.verdict("not_installed_lib", "run", Use.CALLED)
    built = reach.verdict("not_installed_lib", "Thing", Use.NEW)
    assert called[0] is Verdict.DANGEROUS and "could not be inspected" in called[1]
    assert built[0] is Verdict.UNKNOWN and "could not be inspected" in built[1]
    compiled = reach.judge_uncached("_pickle", "loads", Use.NEW)  # a C module: no source
    assert not compiled.inspected


def test_arguments_the_pickle_passes_decide_conditional_callees():
    from torchdoctor.ckpt.objects import GlobalRef

    assert reach.sink_with_arguments("yaml.load", ("x", GlobalRef("yaml", "UnsafeLoader"))) == reach.UNPICKLE
    assert reach.sink_with_arguments("yaml.load", ("x", GlobalRef("yaml", "SafeLoader"))) == ""
    assert reach.sink_with_arguments("numpy.load", ("f.npy", None, True)) == reach.UNPICKLE
    assert reach.sink_with_arguments("numpy.load", ("f.npy",)) == ""


def test_verdicts_are_cached_per_distribution_version(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHDOCTOR_CACHE_DIR", str(tmp_path))
    reach._memory.clear()
    found = reach.judge("yaml", "unsafe_load", Use.CALLED)
    assert found.dangerous
    (cache,) = [n for n in os.listdir(tmp_path / "ckpt-reach") if "distributions" not in n]
    assert "PyYAML==" in cache
    data = json.loads((tmp_path / "ckpt-reach" / cache).read_text())
    assert data["yaml:unsafe_load:called"][1] == reach.UNPICKLE
    depends = data["yaml:unsafe_load:called"][4]
    assert depends == []  # a sink by its name: no module was looked for
    data["yaml:unsafe_load:called"] = [["yaml.unsafe_load"], "", True, "", depends]  # a cached verdict is reused
    (tmp_path / "ckpt-reach" / cache).write_text(json.dumps(data))
    reach._memory.clear()
    assert not reach.judge("yaml", "unsafe_load", Use.CALLED).dangerous
    reach._memory.clear()


def _distribution(root, name: str, source: str) -> None:
    (root / f"{name}.py").write_text(source)
    info = root / f"{name}-1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "top_level.txt").write_text(f"{name}\n")


def test_a_cached_verdict_is_judged_again_when_a_library_its_calls_went_through_changes(tmp_path, monkeypatch):
    """The cache file is named by the judged global's distribution version; the verdict also depends on the other
    distributions the calls go into: upgrading one, or installing one that was missing, must not leave a stale
    'reaches nothing' in the cache (each step below is a new process: the in-memory caches are cleared)."""
    monkeypatch.setenv("TORCHDOCTOR_CACHE_DIR", str(tmp_path / "cache"))
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    _distribution(
        site,
        "td_front",
        "import td_middle, td_later\n\ndef run(x):\n    td_later.go(x)\n    return td_middle.helper(x)\n",
    )
    _distribution(site, "td_middle", "def helper(x):\n    return len(x)\n")

    def fresh_judge():
        for clear in (reach._memory.clear, reach._find.cache_clear, reach._module.cache_clear):
            clear()
        return reach.judge("td_front", "run", Use.CALLED)

    assert not fresh_judge().dangerous
    (cache,) = [n for n in os.listdir(tmp_path / "cache" / "ckpt-reach") if "distributions" not in n]
    assert "td_front==1.0" in cache
    assert not fresh_judge().dangerous  # unchanged: reused
    _distribution(site, "td_middle", "import os\n\ndef helper(x):\n    return os.system(x)\n")  # upgraded
    found = fresh_judge()
    assert found.what == reach.PROCESS and found.path == ("td_front.run", "td_middle.helper", "os.system")
    _distribution(site, "td_middle", "def helper(x):\n    return len(x)\n")
    assert not fresh_judge().dangerous
    _distribution(site, "td_later", "import subprocess\n\ndef go(x):\n    subprocess.run(x)\n")  # installed
    assert fresh_judge().path == ("td_front.run", "td_later.go", "subprocess.run")
    for clear in (reach._memory.clear, reach._find.cache_clear, reach._module.cache_clear):
        clear()


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def test_a_library_class_only_instantiated_in_a_plain_pickle_is_never_silent(tmp_path, lib):
    path = tmp_path / "obj.pkl"
    path.write_bytes(b"\x80\x02" + _global("gadgetlib", "Plain") + b")\x81}b.")
    names = {f.name: f for f in check_checkpoint(str(path)).findings}
    assert "unsafe-pickle" not in names
    assert "gadgetlib.Plain" in names["needs-code-to-load"].message


def test_an_unsafe_library_class_is_named_with_its_path(tmp_path, lib):
    path = tmp_path / "obj.pkl"
    path.write_bytes(b"\x80\x02" + _global("gadgetlib", "Launcher") + b"(X\x04\x00\x00\x00truetR.")
    (finding,) = [f for f in check_checkpoint(str(path)).findings if f.name == "unsafe-pickle"]
    assert "gadgetlib.Launcher → subprocess.Popen.__init__" in finding.message and finding.key == "gadgetlib.Launcher"
    assert not lib.exists()


def test_a_user_enum_pickled_by_value_stays_a_warning(tmp_path, lib):
    (tmp_path / "modes.py").write_text("import enum\n\nclass Mode(enum.Enum):\n    FAST = 2\n")
    path = tmp_path / "enum.pkl"
    path.write_bytes(pickle.dumps(None, protocol=2)[:2] + _global("modes", "Mode") + b"K\x02\x85R.")
    names = {f.name for f in check_checkpoint(str(path)).findings}
    assert "unsafe-pickle" not in names and "needs-code-to-load" in names


def _main_pickle(tmp_path, name: str, arg: bytes) -> str:
    """A plain pickle calling `__main__.NAME(arg)`, as pickling an object of a script's class or enum writes it."""
    path = tmp_path / f"main_{name}.pkl"
    path.write_bytes(b"\x80\x02" + _global("__main__", name) + arg + b"\x85R.")
    return str(path)


def _findings(path: str) -> dict:
    reach._memory.clear()
    return {f.name: f for f in check_checkpoint(path).findings}


def test_a_main_enum_is_judged_as_the_projects_script_defines_it(tmp_path, monkeypatch):
    """`__main__.Mode(2)`: `__main__` is the loading program; read as the project's script that defines Mode (never
    imported), an enum rebuilt by value needs its code, as torch's weights_only does until add_safe_globals."""
    project = tmp_path / "project"
    (project / "runs").mkdir(parents=True)
    canary = tmp_path / "imported"
    (project / "train.py").write_text(
        f"import enum\nopen({str(canary)!r}, 'w').close()\n\nclass Mode(enum.Enum):\n    FAST = 2\n"
    )
    monkeypatch.chdir(project)
    found = _findings(_main_pickle(project / "runs", "Mode", b"K\x02"))
    assert "unsafe-pickle" not in found and "train.py" in found["needs-code-to-load"].message
    assert not canary.exists()


def test_a_main_global_is_unsafe_when_the_script_binds_it_to_a_sink_or_nothing_defines_it(tmp_path, monkeypatch):
    """A loading script's `from os import system` makes `__main__.system` os.system (verified: the canary appears
    under torch.load); an enum whose `_missing_` runs a command is judged by it; a name no script of the working
    directory defines cannot be read, and a called global that cannot be read is unsafe."""
    (tmp_path / "load.py").write_text("from os import system\nimport torch\n")
    (tmp_path / "modes.py").write_text(
        "import enum, subprocess\n\nclass Mode(enum.Enum):\n    A = 1\n\n"
        "    @classmethod\n    def _missing_(cls, value):\n        subprocess.call(value)\n"
    )
    monkeypatch.chdir(tmp_path)
    unsafe = _findings(_main_pickle(tmp_path, "system", b"X\x04\x00\x00\x00true"))["unsafe-pickle"]
    assert "__main__.system → os.system" in unsafe.message and "load.py" in unsafe.message
    assert "__main__.Mode → " in _findings(_main_pickle(tmp_path, "Mode", b"K\x02"))["unsafe-pickle"].message
    unknown = _findings(_main_pickle(tmp_path, "Helper", b"K\x02"))["unsafe-pickle"]
    assert "program that loads the file" in unknown.message and "defines or imports it" in unknown.message
    reach._memory.clear()


def test_source_is_found_without_importing_parent_packages(tmp_path, monkeypatch):
    canary = tmp_path / "parent-imported"
    pkg = tmp_path / "parentpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f"open({str(canary)!r}, 'w').close()\n")
    (pkg / "tools.py").write_text("import os\n\ndef run(cmd):\n    return os.system(cmd)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = reach.judge_uncached("parentpkg.tools", "run", Use.CALLED)
    assert found.what == reach.PROCESS and not canary.exists() and "parentpkg" not in sys.modules


def test_source_files_are_parsed_not_executed_even_when_hostile(tmp_path, monkeypatch):
    (tmp_path / "weird.py").write_text(
        textwrap.dedent("""
        def f(x):
            return g(x)
        g = f
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert not reach.judge_uncached("weird", "f", Use.CALLED).dangerous  # cycles end


def test_new_formats_are_read_with_their_tensors(tmp_path):
    """A .pt2 archive lists its weights; a DCP shard is its torch.save archives back to back (values readable);
    a compressed pickle (what joblib.dump(compress=...) writes) is read through its compressor."""
    import bz2
    import lzma
    import warnings
    import zlib

    import torch
    import torch.distributed.checkpoint as dcp
    from torch import nn

    pt2 = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(nn.Linear(3, 2), (torch.randn(1, 3),)), str(pt2))
    report = check_checkpoint(str(pt2))
    assert report.infos[0].format == "pt2" and report.structure["tensors"]["count"] == 2
    assert "unsafe-pickle" not in {f.name for f in report.findings}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.ones(3), "b": torch.full((2, 2), float("nan"))}, checkpoint_id=str(tmp_path / "dcp"))
    (shard,) = [p for p in (tmp_path / "dcp").iterdir() if p.suffix == ".distcp"]
    report = check_checkpoint(str(shard), scan_values=True)
    info = report.infos[0]
    assert info.format == "zip-sequence" and info.archive.details["zips"] == 2
    assert info.values is not None and info.values.tensors == 2 and len(info.values.nonfinite) == 1
    assert "unsafe-pickle" not in {f.name for f in report.findings}

    data = pickle.dumps({"lr": 0.5, "steps": [1, 2]}, protocol=4)
    for name, packed in (("zlib", zlib.compress(data)), ("bz2", bz2.compress(data)), ("xz", lzma.compress(data))):
        path = tmp_path / f"m.{name}.joblib"
        path.write_bytes(packed)
        info = check_checkpoint(str(path)).infos[0]
        assert info.format == "joblib" and info.archive.details["compression"] == name
        assert [k["key"] for k in info.top_level] == ["lr", "steps"]


def test_a_library_whose_source_has_an_invalid_escape_is_judged_quietly_even_when_warnings_are_errors(
    tmp_path, monkeypatch
):
    """`"\\d"` in a library's source: a SyntaxWarning from the parser on Python 3.12 (printed amid check-ckpt's
    report), a DeprecationWarning before; under `-W error` either one left the library unread."""
    (tmp_path / "escapelib.py").write_text('import os\nPATTERN = "\\d+"\n\n\ndef wipe(path):\n    os.remove(path)\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    reach._find.cache_clear()
    reach._module.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert reach.judge_uncached("escapelib", "wipe", Use.CALLED).what == reach.WRITE
    assert [str(w.message) for w in caught] == []
    reach._find.cache_clear()
    reach._module.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reach.judge_uncached("escapelib", "wipe", Use.CALLED).what == reach.WRITE
    reach._find.cache_clear()
    reach._module.cache_clear()
