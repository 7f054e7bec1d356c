"""The registry: metadata rules, selection by name or code, and discovery of plug-ins by entry point."""
import sys
import textwrap

import pytest

from torchdoctor import registry
from torchdoctor.findings import Finding, Severity

PLUGIN = '''
from torchdoctor import check, Finding

@check(code="XP901", name="plugin-check", scope="env", severity="warning", summary="A third-party check.",
       docs="# plugin-check (XP901)\\n\\nShipped by myplug.\\n")
def plugin_check(facts):
    yield Finding("seen by a plug-in", fix="nothing")
'''


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
    make_distribution(tmp_path, "brokenplug", "bad = brokenplug_checks\n",
                      {"brokenplug_checks": "raise RuntimeError('plug-in bug')\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    info = registry.get("plugin-check")
    assert info.origin == "myplug" and info.code == "XP901" and info.scopes == [registry.Scope.ENV]
    assert info.docs_page().startswith("# plugin-check (XP901)")
    assert registry.get("cpu-only-build").origin == registry.BUILTIN_ORIGIN  # built-ins still load
    assert any("brokenplug" in e and "plug-in bug" in e for e in registry.load_errors())
    [finding] = registry.run_fact_checks([info], "env", facts=None)
    assert (finding.code, finding.name, finding.severity) == ("XP901", "plugin-check", Severity.WARNING)
    sys.modules.pop("myplug_checks", None)
    sys.modules.pop("brokenplug_checks", None)


def test_one_name_can_have_several_scopes_but_not_two_codes(fresh_registry):
    registry.load()
    first = registry.register(lambda f: [], code="ZZ1", name="shared-pitfall", scope="env", severity="info", summary="s")
    registry.register(lambda f: [], code="ZZ1", name="shared-pitfall", scope="source", severity="info", summary="s")
    assert first.scopes == [registry.Scope.ENV, registry.Scope.SOURCE]
    with pytest.raises(registry.RegistryError, match="registered as ZZ1"):
        registry.register(lambda f: [], code="ZZ2", name="shared-pitfall", scope="runtime", severity="info", summary="s")
    with pytest.raises(registry.RegistryError, match="already used"):
        registry.register(lambda f: [], code="ZZ1", name="other-pitfall", scope="env", severity="info", summary="s")
    with pytest.raises(registry.RegistryError, match="kebab-case"):
        registry.register(lambda f: [], code="ZZ3", name="Bad_Name", scope="env", severity="info", summary="s")


def test_a_check_may_override_its_default_severity():
    info = registry.get("cpu-only-build")
    assert info.complete(Finding("m", severity=Severity.INFO)).severity == Severity.INFO
    assert info.complete(Finding("m")).severity == Severity.ERROR


def test_listing_checks_does_not_import_torch():
    import subprocess

    code = ("import sys; from torchdoctor import registry; n = len(registry.all_checks()); "
            "print(n, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout.split()
    assert int(out[0]) >= 16 and out[1] == "False"
