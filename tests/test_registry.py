"""The registry: metadata rules, selection by name or code, and discovery of plug-ins by entry point."""

import os
import sys
import textwrap

import pytest
from pitfall_factory import make_pitfall

from torchdoctor import registry
from torchdoctor.findings import Finding, Severity
from torchdoctor.pitfall import PitfallError
from torchdoctor.watch.contract import RuntimeCheck

PLUGIN = """
from torchdoctor.sdk import Example, Finding, Pitfall

PLUGIN_CHECK = Pitfall(code="XP901", name="plugin-check", severity="warning", summary="A third-party check.",
                       why="Shipped by myplug.", fix="Nothing to do.", bad=Example("x", language="text"),
                       good=Example("y", language="text"))

@PLUGIN_CHECK.env
def plugin_check(facts):
    yield Finding("seen by a plug-in", fix="nothing")
"""


def make_distribution(root, name, entry_points, modules):
    info = root / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[torchdoctor.checks]\n" + entry_points)
    for mod, source in modules.items():
        (root / f"{mod}.py").write_text(textwrap.dedent(source))


@pytest.fixture
def fresh_registry(monkeypatch):
    registry._reset_for_tests()
    yield
    monkeypatch.undo()
    registry._reset_for_tests()
    registry.load()


def test_plugins_are_discovered_with_their_origin(tmp_path, monkeypatch, fresh_registry):
    make_distribution(tmp_path, "myplug", "mine = myplug_checks\n", {"myplug_checks": PLUGIN})
    make_distribution(
        tmp_path,
        "brokenplug",
        "bad = brokenplug_checks\n",
        {"brokenplug_checks": "raise RuntimeError('plug-in bug')\n"},
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    info = registry.get("plugin-check")
    assert info.origin == "myplug" and info.code == "XP901" and info.scopes == [registry.Scope.ENV]
    assert info.page().startswith("# plugin-check (XP901)") and "From: myplug" in info.page()
    assert registry.get("cpu-only-build").origin == registry.BUILTIN_ORIGIN  # built-ins still load
    assert any("brokenplug" in e and "plug-in bug" in e for e in registry.load_errors())
    [finding] = registry.run_fact_checks([info], "env", facts=None)
    assert (finding.code, finding.name, finding.severity) == ("XP901", "plugin-check", Severity.WARNING)
    sys.modules.pop("myplug_checks", None)
    sys.modules.pop("brokenplug_checks", None)


def test_a_pitfall_has_one_name_one_code_and_any_number_of_doors(fresh_registry):
    registry.load()
    shared = make_pitfall("ZZ1", "shared-pitfall", "env", lambda facts: [])
    shared.source(lambda src: [])
    assert registry.add(shared).scopes == [registry.Scope.ENV, registry.Scope.SOURCE]
    with pytest.raises(registry.RegistryError, match="already defined as ZZ1"):
        registry.add(make_pitfall("ZZ2", "shared-pitfall", "runtime", RuntimeCheck))
    with pytest.raises(registry.RegistryError, match="already used"):
        registry.add(make_pitfall("ZZ1", "other-pitfall", "env", lambda facts: []))
    with pytest.raises(PitfallError, match="kebab-case"):
        make_pitfall("ZZ3", "Bad_Name", "env", lambda facts: [])


def test_detectors_are_validated_for_their_door_when_attached():
    with pytest.raises(PitfallError, match="must be a RuntimeCheck subclass"):
        make_pitfall("ZZ4", "plugin-function", "runtime", lambda ctx: [])  # would crash watch() otherwise

    class Typo(RuntimeCheck):
        def on_stepp_pre(self, event):
            return None

    with pytest.raises(PitfallError, match=r"on_stepp_pre is not a watch event \(did you mean on_step_pre\?\)"):
        make_pitfall("ZZ5", "typo-event", "runtime", Typo)
    with pytest.raises(PitfallError, match="must be a function"):
        make_pitfall("ZZ6", "class-for-env", "env", Typo)
    with pytest.raises(PitfallError, match="exactly one argument"):
        make_pitfall("ZZ7", "two-args", "source", lambda src, extra: [])
    with pytest.raises(PitfallError, match="unknown scope"):
        make_pitfall("ZZ8", "no-such-door", "gpu", lambda facts: [])


def test_runtime_handlers_must_accept_what_the_session_passes():
    class NoEvent(RuntimeCheck):
        def on_step_pre(self):  # the session calls on_step_pre(event): this would raise inside training
            return None

    class ExtraArgument(RuntimeCheck):
        def on_stop(self, event):
            return None

    with pytest.raises(PitfallError, match=r"NoEvent.on_step_pre\(self\) must accept .*on_step_pre\(self, event"):
        make_pitfall("ZZ9", "no-event", "runtime", NoEvent)
    with pytest.raises(PitfallError, match="ExtraArgument.on_stop"):
        make_pitfall("ZZ10", "extra-argument", "runtime", ExtraArgument)

    class Flexible(RuntimeCheck):
        def on_step_pre(self, event, *rest, detail=None):
            return None

        def on_stop(self, *args):
            return None

    assert make_pitfall("ZZ11", "flexible-handlers", "runtime", Flexible).scopes == [registry.Scope.RUNTIME]


def test_a_broken_plugin_pitfall_is_a_load_error_not_a_crash(tmp_path, monkeypatch, fresh_registry):
    bad = PLUGIN.replace("def plugin_check(facts):", "def plugin_check(facts, extra):")
    make_distribution(tmp_path, "badshape", "mine = badshape_checks\n", {"badshape_checks": bad})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert [c for c in registry.all_checks() if c.origin == "badshape"] == []
    assert any("badshape" in e and "exactly one argument" in e for e in registry.load_errors())
    sys.modules.pop("badshape_checks", None)


def test_a_check_may_override_its_default_severity():
    info = registry.get("cpu-only-build")
    assert info.complete(Finding("m", severity=Severity.INFO)).severity == Severity.INFO
    assert info.complete(Finding("m")).severity == Severity.ERROR


def test_listing_checks_does_not_import_torch():
    import subprocess

    code = (
        "import sys; from torchdoctor import registry; n = len(registry.all_checks()); print(n, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout.split()
    assert int(out[0]) >= 16 and out[1] == "False"


def test_a_door_imports_only_its_own_check_modules(fresh_registry):
    door = registry.all_checks("checkpoint")
    loaded = {m for m in sys.modules if m.startswith("torchdoctor.checks.") and not m.rsplit(".", 1)[1].startswith("_")}
    assert "torchdoctor.checks.wrapper_prefix" in loaded and "torchdoctor.checks.missing_zero_grad" not in loaded
    assert registry.get("missing-zero-grad").code == "TD301"  # a lookup by name loads the rest
    assert [c.name for c in door] == [c.name for c in registry.all_checks() if registry.Scope.CHECKPOINT in c.scopes]


def test_plugin_discovery_is_cached_until_a_distribution_changes(tmp_path, monkeypatch):
    from torchdoctor import plugins

    make_distribution(tmp_path, "cachedplug", "one = cachedplug_checks\n", {})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert ("one", "cachedplug_checks", "cachedplug") in {(p.name, p.value, p.dist) for p in plugins.plugins()}
    discover = plugins._discover
    monkeypatch.setattr(plugins, "_discover", lambda: pytest.fail("nothing changed, yet the cache was not used"))
    assert "one" in {p.name for p in plugins.plugins()}
    entry_points = tmp_path / "cachedplug-1.0.dist-info" / "entry_points.txt"
    entry_points.write_text("[torchdoctor.checks]\none = cachedplug_checks\ntwo = cachedplug_checks:MORE\n")
    os.utime(entry_points, ns=(entry_points.stat().st_atime_ns, entry_points.stat().st_mtime_ns + 10**9))
    monkeypatch.setattr(plugins, "_discover", discover)
    assert ("two", "cachedplug_checks:MORE") in {(p.name, p.value) for p in plugins.plugins()}
    make_distribution(tmp_path, "laterplug", "three = laterplug_checks\n", {})
    assert "three" in {p.name for p in plugins.plugins()}


def test_a_cached_entry_point_loads_what_it_names():
    from torchdoctor.plugins import Plugin

    assert Plugin("x", "torchdoctor.registry:Scope.CHECKPOINT", "").load() is registry.Scope.CHECKPOINT
    assert Plugin("x", "torchdoctor.registry [extra]", "").load() is registry


def test_alternating_search_paths_keep_their_cached_answers(tmp_path, monkeypatch):
    from torchdoctor import plugins

    make_distribution(tmp_path, "altplug", "alt = altplug_checks\n", {})
    before = list(sys.path)
    plugins.plugins()
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "alt" in {p.name for p in plugins.plugins()}
    monkeypatch.setattr(plugins, "_discover", lambda: pytest.fail("this search path was answered before"))
    monkeypatch.setattr(sys, "path", before)
    assert "alt" not in {p.name for p in plugins.plugins()}
    monkeypatch.setattr(sys, "path", [str(tmp_path), *before])
    assert "alt" in {p.name for p in plugins.plugins()}


def test_without_a_declared_plug_in_no_metadata_is_read_and_files_beside_dists_change_nothing(tmp_path, monkeypatch):
    """The survey of the search path: a distribution whose entry points name other groups is no plug-in, and
    neither `importlib.metadata` nor the cache is consulted; a file saved in a search-path folder (a checkpoint in
    the working directory) does not make the next run rediscover."""
    from torchdoctor import plugins

    other = tmp_path / "otherdist-1.0.dist-info"
    other.mkdir()
    (other / "entry_points.txt").write_text("[console_scripts]\nother = other:main\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    monkeypatch.setattr(plugins, "_discover", lambda: pytest.fail("no distribution declares the group"))
    monkeypatch.setattr(plugins, "cache_dir", lambda: pytest.fail("no plug-in: the cache is not needed"))
    assert plugins.plugins() == []
    monkeypatch.undo()
    make_distribution(tmp_path, "declplug", "decl = declplug_checks\n", {})
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert "decl" in {p.name for p in plugins.plugins()}
    (tmp_path / "model.pt").write_bytes(b"")
    monkeypatch.setattr(plugins, "_discover", lambda: pytest.fail("only a checkpoint was saved"))
    assert "decl" in {p.name for p in plugins.plugins()}


def test_a_finder_of_distributions_beyond_the_search_path_is_always_asked(monkeypatch):
    from torchdoctor import plugins

    class Finder:
        @staticmethod
        def find_distributions(context=None):
            return iter(())

    monkeypatch.setattr(sys, "path", [])
    assert plugins._survey()[1] is False
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, Finder])
    assert plugins._survey()[1] is True
