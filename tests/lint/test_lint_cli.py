"""`torchdoctor lint` end to end through click: discovery, formats, ignore comments, config, --fix/--diff."""

import json
import os
import re
import textwrap

import pytest
from click.testing import CliRunner

from torchdoctor import selection
from torchdoctor.cli import cli
from torchdoctor.settings import load_settings

LEAKY = textwrap.dedent("""
    def train(model, loader, optimizer, criterion):
        total = 0
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss
        return total
""")
LINE = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+):(?P<col>\d+): (?P<code>TD\d+) (?P<name>[a-z-]+) \S")


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(*args):
    return CliRunner().invoke(cli, ["lint", *args])


def write(root, rel, text, encoding="utf-8"):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(textwrap.dedent(text), encoding=encoding)
    return path


def test_text_lines_are_clickable_and_exit_code_follows_fail_on(project):
    write(project, "train.py", LEAKY)
    result = run("--format", "text")
    assert result.exit_code == 1
    lines = result.output.splitlines()
    heads = [line for line in lines if not line.startswith(" ")]  # each finding's fix follows it, indented
    assert [LINE.match(line).group("code", "line", "col") for line in heads] == [
        ("TD301", "7", "9"),
        ("TD308", "8", "9"),
    ]
    assert lines[0].startswith("train.py:7:9: TD301 missing-zero-grad `optimizer.step()`")
    assert lines[1:4] == [
        "    fix: Clear the gradients once per optimizer step:",
        "        for x, y in loader:",
        "            optimizer.zero_grad(set_to_none=True)",
    ]
    assert run("--format", "text", "--fail-on", "never").exit_code == 0


def test_discovery_respects_gitignore_exclude_and_skipped_dirs(project):
    (project / ".git").mkdir()
    write(project, ".gitignore", "build/\n*_pb2.py\n!keep_pb2.py\n")
    for rel in (
        "src/a.py",
        "build/b.py",
        "src/gen_pb2.py",
        "src/keep_pb2.py",
        ".venv/lib/c.py",
        "legacy/old.py",
        "src/nested/d.py",
        "notes.txt",
    ):
        write(project, rel, LEAKY)
    write(project, "src/nested/.gitignore", "d.py\n")
    (project / "src" / "loop").symlink_to(project, target_is_directory=True)
    result = run("--format", "json", "--exclude", "legacy/")
    files = {f["location"]["file"] for f in json.loads(result.output)["findings"]}
    assert files == {"src/a.py", "src/keep_pb2.py"}
    # a file named on the command line is read even when .gitignore would skip it
    assert "build/b.py" in run("--format", "text", "build/b.py").output


def test_unreadable_files_are_one_finding_each_and_the_rest_is_checked(project):
    write(project, "broken.py", "def train(model, loader:\n    pass\n")
    write(project, "latin.py", b"# caf\xe9\nx = 1\n")
    write(project, "declared.py", b"# -*- coding: latin-1 -*-\nname = 'caf\xe9'\n")
    write(project, "train.py", LEAKY)
    result = run("--format", "text")
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.output.splitlines()
    unreadable = [line for line in lines if "source-unreadable" in line]
    assert sorted(line.split(":")[0] for line in unreadable) == ["broken.py", "latin.py"]
    assert "latin.py:1:1: TD507" in result.output and "not UTF-8" in result.output
    assert any("train.py" in line for line in lines) and "Traceback" not in result.output


def test_a_file_that_cannot_be_read_is_never_reported_clean(project):
    write(project, "bad.py", "x = = 1  # torchdoctor: ignore\n")
    refused = run("--ignore", "source-unreadable", "bad.py")
    assert refused.exit_code == 2 and "No problems found" not in refused.output
    assert refused.output.splitlines()[-1] == (
        "Error: source-unreadable cannot be ignored in torchdoctor lint: a file that cannot be read is never "
        "reported clean; exclude the file instead"
    )
    for _ in range(2):  # checked, then from the cache
        doc = json.loads(run("--format", "json", "--select", "missing-zero-grad", "bad.py").output)
        assert [f["name"] for f in doc["findings"]] == ["source-unreadable"]  # the ignore comment does not count
        assert doc["facts"]["unreadable"] == ["bad.py"]
    assert "No problems found" not in run("--select", "missing-zero-grad", "bad.py").output
    assert run("--exclude", "bad.py").output.rstrip().endswith("No Python files found under .: nothing was checked.")


def test_json_and_sarif(project):
    write(project, "train.py", LEAKY)
    doc = json.loads(run("--format", "json").output)
    assert doc["scope"] == "source" and doc["facts"]["files"] == 1
    assert {f["name"] for f in doc["findings"]} == {"missing-zero-grad", "graph-retention-leak"}
    assert set(doc["findings"][0]) == {"code", "name", "severity", "message", "fix", "location", "count", "key"}
    sarif = json.loads(run("--format", "sarif").output)
    assert sarif["version"] == "2.1.0"
    sarif_run = sarif["runs"][0]
    rules = sarif_run["tool"]["driver"]["rules"]
    result = sarif_run["results"][0]
    assert rules[result["ruleIndex"]]["id"] == result["ruleId"] == "TD301"
    assert result["level"] == "error"
    assert result["locations"][0]["physicalLocation"] == {
        "artifactLocation": {"uri": "train.py", "uriBaseId": "%SRCROOT%"},
        "region": {"startLine": 7, "startColumn": 9},
    }
    assert sarif_run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == project.as_uri() + "/"


def test_sarif_uris_are_percent_encoded_and_relative_to_the_project_root(project, tmp_path_factory):
    (project / "pyproject.toml").write_text("[tool.torchdoctor]\n", encoding="utf-8")
    write(project, "my scripts/train #1.py", LEAKY)
    (project / "sub").mkdir()
    outside = tmp_path_factory.mktemp("elsewhere") / "a b.py"
    outside.write_text(textwrap.dedent(LEAKY), encoding="utf-8")
    os.chdir(project / "sub")
    sarif = json.loads(run("--format", "sarif", "..", str(outside)).output)["runs"][0]
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in sarif["results"]}
    assert uris == {"my%20scripts/train%20%231.py", outside.as_uri()}
    assert sarif["originalUriBaseIds"]["%SRCROOT%"]["uri"] == project.as_uri() + "/"


@pytest.mark.parametrize(
    "prefix, encoding",
    [(b"", "utf-8"), (b"\xef\xbb\xbf", "utf-8-sig"), (b"# -*- coding: latin-1 -*-\r\n# caf\xe9\r\n", "latin-1")],
)
def test_fix_keeps_line_endings_and_encoding(project, prefix, encoding):
    body = (
        b'import argparse\r\np = argparse.ArgumentParser()\r\np.add_argument("--local_rank", type=int, default=0)\r\n'
    )
    path = write(project, "launch.py", prefix + body)
    run("--fix")
    data = path.read_bytes()
    assert data.startswith(prefix) and b"--local-rank" in data and b"import os\r\n" in data
    assert data.count(b"\n") == data.count(b"\r\n")  # every line still ends in CRLF
    data.decode(encoding)


def test_console_report(project):
    write(project, "train.py", LEAKY)
    out = run().output
    assert "missing-zero-grad" in out and "train.py:7:9" in out and "Checked 1 Python file in" in out


def test_ignore_comments_by_name_or_code_only_on_their_line(project):
    code = LEAKY.replace("optimizer.step()", "optimizer.step()  # torchdoctor: ignore[missing-zero-grad]")
    code = code.replace("total += loss", "total += loss  # torchdoctor: ignore[TD301]")
    write(project, "train.py", code)
    out = run("--format", "text").output
    assert "TD301" not in out and "TD308" in out
    write(project, "train.py", LEAKY.replace("total += loss", "total += loss  # torchdoctor: ignore"))
    assert "TD308" not in run("--format", "text").output
    write(project, "train.py", LEAKY.replace("total += loss", "total += loss; s = '# torchdoctor: ignore'"))
    assert "TD308" in run("--format", "text").output


def test_select_and_ignore(project):
    write(project, "train.py", LEAKY)
    assert "TD308" not in run("--format", "text", "--select", "missing-zero-grad").output
    assert "TD301" not in run("--format", "text", "--ignore", "TD301").output
    bad = run("--select", "no-such-check")
    assert bad.exit_code == 2 and "unknown check" in bad.output


def test_pyproject_defaults_apply_and_the_command_line_wins(project, monkeypatch):
    monkeypatch.delenv("TORCHDOCTOR_SELECT")  # the project's select is what this test is about
    write(
        project,
        "pyproject.toml",
        """
        [tool.torchdoctor]
        ignore = ["missing-zero-grad"]
        fail-on = "never"
        select = ["graph-retention-leak", "missing-zero-grad", "cpu-only-build"]
        exclude = ["generated/"]
    """,
    )
    write(project, "train.py", LEAKY)
    write(project, "generated/x.py", LEAKY)
    result = run("--format", "text")
    heads = [line for line in result.output.splitlines() if not line.startswith(" ")]
    assert result.exit_code == 0 and len(heads) == 1 and heads[0].startswith("train.py") and "TD308" in heads[0]
    assert run("--format", "text", "--fail-on", "error").exit_code == 1
    # the table's exclude patterns are relative to the pyproject.toml, also when run from a subfolder
    monkeypatch.chdir(project / "generated")
    assert run("--format", "text", "--fail-on", "error", "..").exit_code == 1
    assert "x.py" not in run("--format", "text", "..").output
    # the project's select names lint checks: another front door keeps only its own
    assert [c.name for c in selection.select_checks(selection.ENV, load_settings())] == ["cpu-only-build"]


def test_bad_pyproject_is_a_one_line_input_error(project):
    write(project, "pyproject.toml", '[tool.torchdoctor]\nfail-on = "sometimes"\n')
    write(project, "train.py", LEAKY)
    result = run()
    assert result.exit_code == 2 and "fail-on must be one of" in result.output


def test_missing_path_is_an_input_error(project):
    result = run("nowhere.py")
    assert result.exit_code == 2 and "no such file or directory: nowhere.py" in result.output


FIXABLE = '''\
"""Train with DDP."""
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=0, help="set by the launcher")
args = parser.parse_args()
model.load_state_dict(torch.load("init.pt"))
ckpt = torch.load("dp.pt", map_location="cpu")
state = {k[7:]: v for k, v in ckpt.items()}
model.load_state_dict(state)
extra = torch.load("extra.pt")
print(extra.keys())
'''

FIXED = '''\
"""Train with DDP."""
import os
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", "--local-rank", type=int, default=int(os.environ["LOCAL_RANK"]) if "LOCAL_RANK" in os.environ else 0, help="set by the launcher")
args = parser.parse_args()
model.load_state_dict(torch.load("init.pt", weights_only=True))
ckpt = torch.load("dp.pt", map_location="cpu")
state = dict(ckpt)
torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state, "module.")
model.load_state_dict(state)
extra = torch.load("extra.pt")
print(extra.keys())
'''  # noqa: E501 - the fixture's own line


def test_diff_shows_the_safe_rewrites_and_changes_nothing(project):
    path = write(project, "train.py", FIXABLE)
    result = run("--diff")
    assert result.exit_code == 1
    assert '+parser.add_argument("--local_rank", "--local-rank", type=int' in result.output
    assert "+import os" in result.output and "--- a/train.py" in result.output
    assert path.read_text() == FIXABLE


def test_fix_rewrites_only_what_is_safe(project):
    path = write(project, "train.py", FIXABLE)
    result = run("--fix", "--format", "text")
    assert path.read_text() == FIXED
    remaining = [LINE.match(line).group("name") for line in result.output.splitlines() if LINE.match(line)]
    # `ckpt` is read as a whole dict by dict(ckpt): only a person can tell whether weights_only=True fits
    assert remaining == ["unsafe-torch-load", "unsafe-torch-load"]
    assert run("--diff").exit_code == 0


def test_local_rank_fix_without_default_keeps_none(project):
    path = write(
        project,
        "launch.py",
        'import os\nimport argparse\np = argparse.ArgumentParser()\np.add_argument("--local_rank", type=int)\n',
    )
    run("--fix")
    assert path.read_text().splitlines()[-1] == (
        'p.add_argument("--local_rank", "--local-rank", type=int, '
        'default=int(os.environ["LOCAL_RANK"]) if "LOCAL_RANK" in os.environ else None)'
    )


def test_fix_rewrites_the_state_dict_loop_from_the_dataparallel_faq(project):
    path = write(
        project,
        "load.py",
        """\
        import torch
        from collections import OrderedDict

        def load(model, path):
            state_dict = torch.load(path, map_location="cpu", weights_only=True)
            new_state_dict = OrderedDict()
            for k, v in state_dict.items():
                name = k[7:]  # remove `module.`
                new_state_dict[name] = v
            model.load_state_dict(new_state_dict)
    """,
    )
    assert run("--fix").exit_code == 0
    assert path.read_text().splitlines()[5:9] == [
        "    new_state_dict = OrderedDict()",
        "    new_state_dict.update(state_dict)",
        '    torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(new_state_dict, "module.")',
        "    model.load_state_dict(new_state_dict)",
    ]


def test_console_lists_findings_in_file_order_with_fixable_markers(project):
    write(project, "a.py", FIXABLE)
    write(project, "b.py", LEAKY)
    out = run("--fail-on", "never").output
    where = [m.group(0) for m in re.finditer(r"\b[ab]\.py:\d+:\d+", out)]
    assert where == sorted(where, key=lambda w: (w.split(":")[0], int(w.split(":")[1])))
    assert "[*] fixable with --fix" in out and "fixable with --fix." in out.splitlines()[-1]
    text = run("--format", "text", "--fail-on", "never").output
    assert "TD406 local-rank-argument [*] `" in text and "TD301 missing-zero-grad `" in text


def test_statistics_counts_findings_per_check(project):
    write(project, "a.py", FIXABLE)
    write(project, "b.py", LEAKY)
    lines = run("--statistics", "--fail-on", "never").output.splitlines()
    counts = {line.split()[2]: int(line.split()[0]) for line in lines}
    assert counts["unsafe-torch-load"] == 3 and counts["missing-zero-grad"] == 1
    assert any("local-rank-argument  [*] 1 fixable" in line for line in lines)


def test_build_dist_and_oversized_files(project, monkeypatch):
    from torchdoctor.lint import runner

    for rel in ("build/lib/x.py", "dist/y.py", "pkg/big.py"):
        write(project, rel, LEAKY)
    monkeypatch.setattr(runner, "MAX_FILE_BYTES", 100)
    doc = json.loads(run("--format", "json", "--fail-on", "never").output)
    assert [(f["location"]["file"], f["name"]) for f in doc["findings"]] == [("pkg/big.py", "source-unreadable")]
    assert "larger than the lint limit" in doc["findings"][0]["message"]
