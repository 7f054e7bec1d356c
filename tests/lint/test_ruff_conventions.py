"""`torchdoctor lint` behaves like ruff: noqa comments, per-file-ignores, parse errors exit 1, --exit-zero,
--diff with nothing to fix, --add-noqa, --watch, an empty folder, and the docs' sample output."""

import json
import re
import textwrap

import pytest
from click.testing import CliRunner

from torchdoctor.cli import cli

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


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCHDOCTOR_CACHE_DIR", str(tmp_path / ".cache"))
    return tmp_path


def run(*args):
    return CliRunner().invoke(cli, ["lint", "--format", "text", *args])


def codes(result):
    return [m.group(1) for m in re.finditer(r"^\S+:\d+:\d+: (TD\d+)", result.stdout, re.M)]


def write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "comment, left",
    [
        ("# noqa: TD301", ["TD308"]),
        ("# noqa:TD301,TD308", []),
        ("# NOQA", []),
        ("# noqa: E501", ["TD301", "TD308"]),  # another tool's code silences nothing of ours
        ("# noqa: TD3011", ["TD301", "TD308"]),
    ],
)
def test_noqa_comments_silence_their_codes_on_their_line(project, comment, left):
    code = LEAKY.replace("optimizer.step()", f"optimizer.step()  {comment}")
    code = code.replace("total += loss", f"total += loss  {comment}")
    write(project, "train.py", code)
    assert codes(run()) == left


def test_noqa_inside_a_string_silences_nothing(project):
    write(project, "train.py", LEAKY.replace("optimizer.step()", "optimizer.step(); s = '# noqa'"))
    assert codes(run()) == ["TD301", "TD308"]


def test_per_file_ignores_from_the_project_table(project, monkeypatch):
    write(
        project,
        "pyproject.toml",
        """
        [tool.torchdoctor.per-file-ignores]
        "tests/" = ["TD301"]
        "legacy_*.py" = ["graph-retention-leak", "missing-zero-grad"]
    """,
    )
    for rel in ("tests/test_a.py", "src/legacy_b.py", "src/train.py"):
        write(project, rel, LEAKY)
    result = run()
    found = sorted(
        line.split(":")[0] + " " + line.split()[1]
        for line in result.stdout.splitlines()
        if re.match(r"^\S+:\d+:\d+: TD", line)
    )
    assert found == ["src/train.py TD301", "src/train.py TD308", "tests/test_a.py TD308"]
    # patterns are relative to the pyproject.toml, also when run from a subfolder
    monkeypatch.chdir(project / "tests")
    assert codes(run(".")) == ["TD308"]


def test_per_file_ignores_name_known_checks_and_never_source_unreadable(project):
    write(project, "train.py", LEAKY)
    write(project, "pyproject.toml", '[tool.torchdoctor.per-file-ignores]\n"*.py" = ["missing-zero-gradd"]\n')
    result = run()
    assert result.exit_code == 2 and "did you mean 'missing-zero-grad'" in result.stderr
    write(project, "pyproject.toml", '[tool.torchdoctor.per-file-ignores]\n"*.py" = ["TD507"]\n')
    assert run().exit_code == 2
    write(project, "pyproject.toml", '[tool.torchdoctor]\nper-file-ignores = ["x"]\n')
    assert "must be a table" in run().stderr


def test_a_file_that_does_not_parse_is_an_error(project):
    write(project, "broken.py", "def train(model, loader:\n    pass\n")
    result = run()
    assert result.exit_code == 1 and codes(result) == ["TD507"]
    assert run("--exit-zero").exit_code == 0
    doc = json.loads(CliRunner().invoke(cli, ["lint", "--format", "json"]).stdout)
    assert doc["findings"][0]["severity"] == "error"


def test_a_file_skipped_for_its_size_is_a_warning(project, monkeypatch):
    from torchdoctor.lint import runner

    monkeypatch.setattr(runner, "MAX_FILE_BYTES", 100)
    write(project, "big.py", LEAKY)
    result = run()
    assert codes(result) == ["TD507"] and result.exit_code == 0


def test_exit_zero_keeps_the_report(project):
    write(project, "train.py", LEAKY)
    result = run("--exit-zero")
    assert result.exit_code == 0 and codes(result) == ["TD301", "TD308"]
    assert run().exit_code == 1


def test_diff_says_when_there_is_nothing_to_fix(project):
    write(project, "train.py", LEAKY)
    result = run("--diff")
    assert result.exit_code == 0 and result.stdout == ""
    assert "nothing to fix: none of the 2 findings has a safe rewrite" in result.stderr
    write(project, "train.py", "x = 1\n")
    assert "nothing to fix" in run("--diff").stderr


def test_add_noqa_silences_every_finding_and_keeps_the_rest(project):
    code = LEAKY.replace("total += loss", "total += loss  # noqa: E501")
    code += 'msg = """a\n' + 'b"""; optimizer.step()\n'
    path = write(project, "train.py", code)
    result = run("--add-noqa")
    assert result.exit_code == 0 and "added 2 noqa directives in 1 file" in result.stderr
    text = path.read_text()
    assert "    optimizer.step()  # noqa: TD301\n" in text
    assert "total += loss  # noqa: E501, TD308\n" in text
    assert codes(run()) == []
    assert run("--add-noqa").stderr.startswith("torchdoctor: added 0 noqa directives")


def test_add_noqa_refuses_lines_inside_a_string(project):
    path = write(project, "train.py", "import torch\nx = torch.load('a.pt'), '''\n'''\n")
    before = path.read_text()
    result = run("--add-noqa")
    assert "train.py:2: no comment can go" in result.stderr and path.read_text() == before


def test_add_noqa_keeps_crlf_line_endings(project):
    path = project / "train.py"
    path.write_bytes(b"import torch\r\nstate = torch.load('a.pt')\r\nprint(state)\r\n")
    run("--add-noqa")
    assert path.read_bytes() == b"import torch\r\nstate = torch.load('a.pt')  # noqa: TD503\r\nprint(state)\r\n"


def test_an_empty_folder_says_no_python_files_were_found(project):
    (project / "empty").mkdir()
    result = CliRunner().invoke(cli, ["lint", "empty"])
    assert result.exit_code == 0 and "No problems found" not in result.stdout
    assert "No Python files found under empty" in result.stdout
    assert "no Python files found under empty" in run("empty").stderr


def test_watch_lints_again_when_a_file_changes(project):
    from torchdoctor.lint.watching import snapshot, watch

    path = write(project, "train.py", "x = 1\n")
    write(project, "notes.txt", "not python")
    runs = []
    polls = iter(
        [
            lambda: None,  # nothing changed
            lambda: path.write_text(LEAKY + "\n\n"),  # an edit (a different size: a new stamp on any filesystem)
            lambda: (project / "notes.txt").write_text("still not python, and longer"),  # not a lint input
            lambda: write(project, "pkg/new.py", LEAKY),  # a new file
        ]
    )

    def lint_once():
        result = run(str(project))
        runs.append(codes(result))

    count = watch(lint_once, lambda: snapshot([str(project)]), sleep=lambda _: next(polls)(), rounds=4)
    assert count == 3 and runs == [[], ["TD301", "TD308"], ["TD301", "TD308"] * 2]


def test_watch_refuses_what_it_cannot_repeat(project):
    result = CliRunner().invoke(cli, ["lint", "--watch", "--diff"])
    assert result.exit_code == 2 and "--watch" in result.stderr


def test_help_says_which_unsafe_torch_load_cases_are_fixed():
    out = CliRunner().invoke(cli, ["lint", "--help"]).output
    assert "where the loaded object only goes to" in " ".join(out.split())


def test_explain_gives_the_severity_lint_reports(project):
    from torchdoctor import registry

    write(project, "load.py", "import torch\nstate = torch.load('a.pt')\nprint(state)\n")
    doc = json.loads(CliRunner().invoke(cli, ["lint", "--format", "json"]).stdout)
    [f] = doc["findings"]
    assert f["severity"] == str(registry.get("unsafe-torch-load").severity) == "info"
    assert "Severity: **info**" in CliRunner().invoke(cli, ["explain", "unsafe-torch-load"]).output


def test_docs_sample_output_is_what_lint_prints(project):
    """docs/lint.md shows a console run on its own example: the same text, but for the time it took."""
    import pathlib

    doc = (pathlib.Path(__file__).parents[2] / "docs" / "lint.md").read_text(encoding="utf-8")
    source = re.search(r"`train.py`:\n\n```python\n(.*?)```", doc, re.S).group(1)
    shown = re.search(r"```console\n\$ torchdoctor lint train.py\n(.*?)```", doc, re.S).group(1)
    write(project, "train.py", source)
    out = CliRunner().invoke(cli, ["lint", "train.py"]).stdout
    seconds = re.compile(r"in \d+\.\d\d s")
    assert seconds.sub("in _ s", out) == seconds.sub("in _ s", shown)


def test_watch_from_the_command_line_lints_then_stops_on_ctrl_c(project, monkeypatch):
    import time

    write(project, "train.py", LEAKY)

    def interrupted(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", interrupted)
    result = CliRunner().invoke(cli, ["lint", "--format", "text", "--watch"])
    assert result.exit_code == 0 and codes(result) == ["TD301", "TD308"]
    assert "watching for changes" in result.stderr
