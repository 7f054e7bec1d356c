"""Installed libraries' facts are kept per distribution version next to the lint results cache."""

import json
import sys
import textwrap

import pytest

from torchdoctor import registry
from torchdoctor.lint.cache import LintCache
from torchdoctor.lint.runner import lint_paths

SCALER = """
import torch

class NativeScaler:
    def __call__(self, loss, optimizer):
        self._scaler.scale(loss).backward()
        {clear}
        {step}
"""

TRAIN = """
from fakelib import NativeScaler

def train(model, loader, optimizer, criterion):
    loss_scaler = NativeScaler()
    for x, y in loader:
        loss = criterion(model(x), y)
        loss_scaler(loss, optimizer)
"""

CHECKS = [registry.get("missing-zero-grad")]


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site-packages folder on sys.path holding the distribution `fakelib`."""
    folder = tmp_path / "env" / "site-packages"
    (folder / "fakelib").mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [*sys.path, str(folder)])
    return folder


def install(site, version, clear="", step="self._scaler.step(optimizer)"):
    text = SCALER.format(clear=clear, step=step)
    (site / "fakelib" / "__init__.py").write_text(textwrap.dedent(text), encoding="utf-8")
    for old in site.glob("fakelib-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    info = site / f"fakelib-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fakelib\nVersion: {version}\n", encoding="utf-8")
    (info / "top_level.txt").write_text("fakelib\n", encoding="utf-8")


def lint_project(tmp_path, name):
    root = tmp_path / name
    root.mkdir()
    (root / "pyproject.toml").write_text("[project]\nname = 'demo'\n", encoding="utf-8")
    (root / "train.py").write_text(textwrap.dedent(TRAIN), encoding="utf-8")
    cache = LintCache(str(tmp_path / "cache"), str(root), CHECKS)
    result = lint_paths([str(root / "train.py")], CHECKS, cwd=str(root), jobs=1, cache=cache)
    return [f.location.line for f in result.findings]


def test_a_library_functions_facts_are_kept_per_version(tmp_path, site):
    install(site, "1.0")
    assert lint_project(tmp_path, "a") == [8]  # the scaler steps and never clears
    kept = json.loads((tmp_path / "cache" / "lint" / "libraries" / "fakelib==1.0.json").read_text(encoding="utf-8"))
    names = {key.split(":")[3] for key in kept["facts"]}
    assert {"runs-backward", "steps-optimizer", "clears-gradients"} <= names
    assert any(key.startswith("fakelib/__init__.py:NativeScaler.__call__:") for key in kept["facts"])

    # the same version: the kept facts are read back, not worked out again (an edit in place is not seen)
    install(site, "1.0", step="pass")
    assert lint_project(tmp_path, "b") == [8]
    # another version: worked out again from its source (it no longer steps)
    install(site, "1.1", step="pass")
    assert lint_project(tmp_path, "c") == []
    assert (tmp_path / "cache" / "lint" / "libraries" / "fakelib==1.1.json").exists()


def test_a_library_of_no_installed_distribution_is_followed_but_not_kept(tmp_path, site):
    text = SCALER.format(clear="", step="self._scaler.step(optimizer)")
    (site / "fakelib" / "__init__.py").write_text(textwrap.dedent(text), encoding="utf-8")
    assert lint_project(tmp_path, "a") == [8]
    assert not (tmp_path / "cache" / "lint" / "libraries").exists()


def test_an_answer_that_met_a_recursive_call_is_not_kept(tmp_path, site):
    # ping() is asked first: pong() is worked out while ping() is, sees it as empty, and so depends on the order
    # the questions came in; only ping()'s answer (complete) is kept on disk
    from torchdoctor.lint.facts import Effect, Fact
    from torchdoctor.lint.libraries import LibraryFacts
    from torchdoctor.lint.program import Program

    install(site, "1.0")
    (site / "fakelib" / "loop.py").write_text(
        "def ping(x):\n    pong(x)\n    x.touch()\n\ndef pong(x):\n    ping(x)\n", encoding="utf-8"
    )
    touches = Fact.effects(
        "touches", lambda fn: frozenset(Effect(str(c.receiver)) for c in fn.scope.calls if c.attr == "touch")
    )
    program = Program()
    program.libraries = LibraryFacts(str(tmp_path / "kept"), lambda: "fp", [str(site)])
    module = program.module(str(site / "fakelib" / "loop.py"))
    assert {e.receiver for e in program.fact(module, module.functions["ping"], touches)} == {"x"}
    program.libraries.save()
    kept = json.loads((tmp_path / "kept" / "fakelib==1.0.json").read_text(encoding="utf-8"))["facts"]
    assert [key.split(":")[1] for key in kept] == [".ping"]


@pytest.fixture
def parsed(monkeypatch, site):
    """The library files each lint run parses (read and `ast.parse`d to answer a question)."""
    from torchdoctor.lint.program import Program

    seen: list[str] = []
    module = Program.module

    def recording(self, path, data=None):
        if path not in self._modules and path.startswith(str(site)):
            seen.append(path[len(str(site)) + 1 :])
        return module(self, path, data)

    monkeypatch.setattr(Program, "module", recording)
    return seen


def test_a_library_warm_run_parses_no_library_file(tmp_path, site, parsed):
    # the call lands in fakelib/__init__.py, which re-exports the class from fakelib/scaling.py
    install(site, "1.0")
    (site / "fakelib" / "scaling.py").write_text((site / "fakelib" / "__init__.py").read_text(), encoding="utf-8")
    (site / "fakelib" / "__init__.py").write_text("from .scaling import NativeScaler\n", encoding="utf-8")
    assert lint_project(tmp_path, "a") == [8]
    assert sorted(parsed) == ["fakelib/__init__.py", "fakelib/scaling.py"]
    kept = json.loads((tmp_path / "cache" / "lint" / "libraries" / "fakelib==1.0.json").read_text(encoding="utf-8"))
    assert any(
        json.loads(key.split(":", 1)[1])[:2] == ["fakelib/__init__.py", "instance-method"]
        for key in kept["resolutions"]
    )

    parsed.clear()
    assert lint_project(tmp_path, "b") == [8]  # the same finding, from what the first run kept
    assert parsed == []


def test_a_kept_resolution_is_used_until_the_version_changes(tmp_path, site, parsed):
    install(site, "1.0")
    assert lint_project(tmp_path, "a") == [8]
    # edited in place, same version: the class is gone, but the kept resolution still names it
    (site / "fakelib" / "__init__.py").write_text("class Other:\n    pass\n", encoding="utf-8")
    assert lint_project(tmp_path, "b") == [8]
    # another version: resolved again from its source (the call is now unknown: nothing is assumed)
    install(site, "1.1")
    (site / "fakelib" / "__init__.py").write_text("class Other:\n    pass\n", encoding="utf-8")
    assert lint_project(tmp_path, "c") == []
    assert "fakelib/__init__.py" in parsed


def test_a_kept_function_whose_body_is_read_is_parsed_then(tmp_path, site):
    # a stub answers from what was kept; any other question about it reads the real source
    from torchdoctor.lint.libraries import LibraryFacts
    from torchdoctor.lint.program import Program
    from torchdoctor.lint.stubs import LibraryScope

    install(site, "1.0")
    (tmp_path / "proj").mkdir()
    user = tmp_path / "proj" / "train.py"
    user.write_text(textwrap.dedent(TRAIN), encoding="utf-8")
    for run in range(2):
        program = Program()
        program.libraries = LibraryFacts(str(tmp_path / "kept"), lambda: "fp", [str(site)])
        module = program.module(str(user))
        scope = module.functions["train"]
        call = next(c for c in scope.calls if c.attr == "loss_scaler")
        found = program.resolve_call(module, scope, call)
        assert found is not None and found[1].name == "__call__" and found[1].class_name == "NativeScaler"
        assert isinstance(found[1], LibraryScope) == (run == 1)
        program.libraries.save()
    assert found[1].pending and [a.arg for a in found[1].node.args.args] == ["self", "loss", "optimizer"]
    assert not found[1].pending and "backward" in found[1].call_attrs
