"""The lint results cache: unchanged files are not checked again, and a cached result is never stale."""

import json
import os
import textwrap

from click.testing import CliRunner
from conftest import ENGINE_CHECKS
from pitfall_factory import make_pitfall

from torchdoctor.cli import cli
from torchdoctor.lint.cache import LintCache
from torchdoctor.lint.runner import lint_paths
from torchdoctor.settings import cache_dir as default_cache_dir

CHECKS = ENGINE_CHECKS
LEAKY = textwrap.dedent("""
    def train(model, loader, optimizer, criterion):
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss
""")
SAMPLER = textwrap.dedent("""
    from torch.utils.data import DataLoader, DistributedSampler

    def fit(model, data, epochs):
        sampler = DistributedSampler(data)
        loader = DataLoader(data, sampler=sampler)
        for epoch in range(epochs):
            for batch in loader:
                model(batch)
""")


def lint(root, cache_dir, checks=CHECKS):
    return lint_paths([str(root)], checks, cwd=str(root), jobs=1, cache=LintCache(str(cache_dir), str(root), checks))


def found(result):
    return [(f.location.file, f.location.line, f.name, f.message) for f in result.findings]


def test_a_second_run_reuses_every_result_and_finds_the_same(tmp_path):
    (tmp_path / "src").mkdir()
    for i in range(5):
        (tmp_path / "src" / f"t{i}.py").write_text(LEAKY if i % 2 else "x = 1\n", encoding="utf-8")
    first = lint(tmp_path / "src", tmp_path / "cache")
    second = lint(tmp_path / "src", tmp_path / "cache")
    assert (first.checked, second.checked) == (5, 0)
    assert found(second) == found(first) and len(found(first)) == 2
    assert [f.severity for f in second.findings] == [f.severity for f in first.findings]


def test_an_edited_file_is_checked_again(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text(LEAKY, encoding="utf-8")
    (src / "b.py").write_text("x = 1\n", encoding="utf-8")
    assert [f.name for f in lint(src, tmp_path / "cache").findings] == ["graph-retention-leak"]
    (src / "a.py").write_text(LEAKY.replace("total += loss", "total += loss.item()"), encoding="utf-8")
    second = lint(src, tmp_path / "cache")
    assert second.checked == 1 and second.findings == []


def test_a_change_in_another_file_that_a_result_depends_on_invalidates_it(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    calls_helper = SAMPLER.replace(
        "        for batch in loader:", "        each_epoch(loader, epoch)\n        for batch in loader:"
    ).replace("\ndef fit", "from loop import each_epoch\n\ndef fit")
    (src / "train.py").write_text(calls_helper, encoding="utf-8")
    (src / "loop.py").write_text("def each_epoch(loader, epoch):\n    pass\n", encoding="utf-8")
    assert [f.name for f in lint(src, tmp_path / "cache").findings] == ["sampler-epoch-not-set"]
    (src / "loop.py").write_text(
        "def each_epoch(loader, epoch):\n    loader.sampler.set_epoch(epoch)\n", encoding="utf-8"
    )
    second = lint(src, tmp_path / "cache")
    assert second.findings == [] and second.checked == 2  # train.py is unchanged, but its answer changed
    (src / "other.py").write_text("x = 1\n", encoding="utf-8")
    assert lint(src, tmp_path / "cache").checked == 1  # a file train.py never consulted changes nothing
    (src / "loop.py").unlink()
    third = lint(src, tmp_path / "cache")
    assert [f.name for f in third.findings] == ["sampler-epoch-not-set"] and third.checked == 1


def test_cached_findings_name_the_file_as_this_run_shows_it(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "t.py").write_text(LEAKY, encoding="utf-8")
    lint(src, tmp_path / "cache")
    again = lint_paths(
        [str(src)], CHECKS, cwd=str(tmp_path), jobs=1, cache=LintCache(str(tmp_path / "cache"), str(src), CHECKS)
    )
    assert again.checked == 0 and again.findings[0].location.file == os.path.join("src", "t.py")


def test_another_selection_does_not_reuse_results(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "t.py").write_text(LEAKY, encoding="utf-8")
    lint(src, tmp_path / "cache")
    only_zero_grad = [c for c in CHECKS if c.name == "missing-zero-grad"]
    result = lint(src, tmp_path / "cache", only_zero_grad)
    assert result.checked == 1 and result.findings == []


def test_a_corrupt_or_unwritable_cache_only_costs_a_fresh_check(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "t.py").write_text(LEAKY, encoding="utf-8")
    cache = LintCache(str(tmp_path / "cache"), str(src), CHECKS)
    os.makedirs(os.path.dirname(cache.path))
    with open(cache.path, "w") as fh:
        fh.write('{"format": 1, "fingerprint": "' + cache.fingerprint + '", "files": {"x": ')
    result = lint(src, tmp_path / "cache")
    assert result.checked == 1 and [f.name for f in result.findings] == ["graph-retention-leak"]
    assert json.load(open(cache.path))["files"]  # rewritten whole
    path = str(src / "t.py")
    for bad in (5, {"digest": None}, {"digest": "x", "asked": 1, "findings": []}):
        with open(cache.path, "w") as fh:
            json.dump({"format": 1, "fingerprint": cache.fingerprint, "files": {path: bad}}, fh)
        assert lint(src, tmp_path / "cache").checked == 1
    entry = json.load(open(cache.path))["files"][path]
    for bad in ({"asked": [["no-such-question", True]]}, {"findings": [{"message": "x", "severity": "??"}]}):
        with open(cache.path, "w") as fh:
            json.dump({"format": 1, "fingerprint": cache.fingerprint, "files": {path: {**entry, **bad}}}, fh)
        result = lint(src, tmp_path / "cache")
        assert result.checked == 1 and [f.name for f in result.findings] == ["graph-retention-leak"]
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    result = lint(src, blocker)
    assert result.checked == 1 and [f.name for f in result.findings] == ["graph-retention-leak"]


def test_a_result_with_a_crashed_check_is_not_kept(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "t.py").write_text("x = 1\n", encoding="utf-8")

    def broken(src):
        raise RuntimeError("boom")

    checks = [make_pitfall("TD999", "broken-check", "source", broken, severity="error")]
    assert lint(src, tmp_path / "cache", checks).checked == 1
    assert lint(src, tmp_path / "cache", checks).checked == 1


def test_cli_uses_the_cache_and_no_cache_leaves_it_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(LEAKY, encoding="utf-8")
    runner = CliRunner()
    cold = runner.invoke(cli, ["lint", "--no-cache", "--format", "json"])
    assert not os.path.exists(os.path.join(default_cache_dir(), "lint"))
    first = runner.invoke(cli, ["lint", "--format", "json"])
    warm = runner.invoke(cli, ["lint", "--format", "json"])
    facts = [json.loads(r.output)["facts"] for r in (cold, first, warm)]
    assert [f["checked"] for f in facts] == [1, 1, 0]
    assert [json.loads(r.output)["findings"] for r in (cold, first)] == [json.loads(warm.output)["findings"]] * 2


def test_fix_and_diff_still_rewrite_when_every_result_is_cached(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(
        'import torch\nstate = torch.load("w.pt")\nmodel.load_state_dict(state)\n', encoding="utf-8"
    )
    runner = CliRunner()
    warm = runner.invoke(cli, ["lint", "--format", "json"])
    assert [f["name"] for f in json.loads(warm.output)["findings"]] == ["unsafe-torch-load"]
    diff = runner.invoke(cli, ["lint", "--diff"])
    assert diff.exit_code == 1 and "weights_only=True" in diff.output
    fixed = runner.invoke(cli, ["lint", "--fix", "--format", "json"])
    assert "weights_only=True" in (tmp_path / "train.py").read_text()
    assert json.loads(fixed.stdout)["findings"] == []  # the re-check after the rewrite is not served stale


def test_editing_a_check_module_invalidates_results(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    (src / "t.py").write_text("x = 1\n", encoding="utf-8")
    plugin = tmp_path / "td_cache_plugin.py"
    plugin.write_text("def rule(src):\n    return []\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    import td_cache_plugin

    checks = [make_pitfall("TD998", "plugin-rule", "source", td_cache_plugin.rule)]
    assert lint(src, tmp_path / "cache", checks).checked == 1
    assert lint(src, tmp_path / "cache", checks).checked == 0
    plugin.write_text("def rule(src):\n    return []  # edited\n", encoding="utf-8")
    assert lint(src, tmp_path / "cache", checks).checked == 1


def test_a_result_that_depends_on_the_callers_of_a_function_follows_them(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "evaluation.py").write_text(
        textwrap.dedent("""
        def evaluate(model, loader):
            model.eval()
            return [model(x) for x in loader]
    """),
        encoding="utf-8",
    )
    (src / "train.py").write_text("from evaluation import evaluate\nevaluate(model, val_loader)\n", encoding="utf-8")
    assert [f.name for f in lint(src, tmp_path / "cache").findings] == ["eval-without-no-grad"]
    (src / "train.py").write_text(
        "import torch\nfrom evaluation import evaluate\nwith torch.no_grad():\n    evaluate(model, val_loader)\n",
        encoding="utf-8",
    )
    second = lint(src, tmp_path / "cache")
    assert second.findings == [] and second.checked == 2  # evaluation.py is unchanged, its callers are not


def _settle(path, seconds_ago=3600):
    """Give a file a modification time in the past, as an unchanged file in a project has."""
    then = os.stat(path).st_mtime_ns - seconds_ago * 1_000_000_000
    os.utime(path, ns=(then, then))


def test_a_settled_unchanged_file_is_not_read_again(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    for name, text in (("a.py", LEAKY), ("b.py", "x = 1\n")):
        (src / name).write_text(text, encoding="utf-8")
        _settle(src / name)
    first = lint(src, tmp_path / "cache")

    def no_hashing(data):
        raise AssertionError("an unchanged settled file was read and hashed")

    cache = LintCache(str(tmp_path / "cache"), str(src), CHECKS)
    monkeypatch.setattr("torchdoctor.lint.cache.digest", no_hashing)
    second = lint_paths([str(src)], CHECKS, cwd=str(src), jobs=1, cache=cache)
    assert (first.checked, second.checked) == (2, 0)
    assert found(second) == found(first) and len(found(first)) == 1


def test_a_settled_file_that_is_edited_is_checked_again(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("x = 1\n", encoding="utf-8")
    _settle(src / "a.py")
    assert found(lint(src, tmp_path / "cache")) == []
    (src / "a.py").write_text(LEAKY, encoding="utf-8")
    second = lint(src, tmp_path / "cache")
    assert second.checked == 1 and [f[2] for f in found(second)] == ["graph-retention-leak"]


def test_a_recent_file_rewritten_with_the_same_size_and_time_is_read_again(tmp_path):
    # Within a coarse clock tick an edit can keep size and modification time: such a file is always hashed.
    src = tmp_path / "src"
    src.mkdir()
    path = src / "a.py"
    path.write_text(LEAKY, encoding="utf-8")
    assert len(found(lint(src, tmp_path / "cache"))) == 1
    before = os.stat(path)
    quiet = LEAKY.replace("total += loss", "total += 1.00")
    assert len(quiet) == len(LEAKY)
    path.write_text(quiet, encoding="utf-8")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    second = lint(src, tmp_path / "cache")
    assert second.checked == 1 and found(second) == []


def test_a_fact_shared_by_two_files_records_what_it_read_for_both(tmp_path):
    # a.py and b.py ask the same fact of engine.train_step, which follows reset() into helpers.py: the second
    # file gets the answer from the run's fact cache, and must depend on helpers.py all the same
    src = tmp_path / "src"
    src.mkdir()
    (src / "pyproject.toml").write_text("[project]\nname = 'demo'\n", encoding="utf-8")
    (src / "helpers.py").write_text("def reset(opt):\n    opt.zero_grad()\n", encoding="utf-8")
    (src / "engine.py").write_text(
        "from helpers import reset\n\n"
        "def train_step(model, x, opt):\n    reset(opt)\n    model(x).sum().backward()\n    opt.step()\n",
        encoding="utf-8",
    )
    loop = (
        "import torch\nfrom engine import train_step\n\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor x in loader:\n    train_step(model, x, opt)\n"
    )
    for name in ("a.py", "b.py"):
        (src / name).write_text(loop, encoding="utf-8")
    assert found(lint(src, tmp_path / "cache")) == []
    (src / "helpers.py").write_text("def reset(opt):\n    pass\n", encoding="utf-8")
    again = lint(src, tmp_path / "cache")
    assert [(f[0], f[2]) for f in found(again)] == [("a.py", "missing-zero-grad"), ("b.py", "missing-zero-grad")]
