"""Settings: `[tool.torchdoctor]` found from the target's folder, then TORCHDOCTOR_* variables, then options."""

import json
import struct
import textwrap

import pytest
from click.testing import CliRunner

from torchdoctor.cli import cli
from torchdoctor.settings import SettingsError, find_project, load_settings

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


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def checkpoint(path):
    """A tiny safetensors file with a DataParallel `module.` prefix (a wrapper-prefix warning)."""
    header = json.dumps({"module.w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<2f", 1.0, 2.0))
    return path


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """repo/ has the table; repo/sub/ a pyproject.toml without one; elsewhere/ is where commands are run."""
    write(
        tmp_path / "repo" / "pyproject.toml",
        """
        [project]
        name = "repo"

        [tool.torchdoctor]
        ignore = ["graph-retention-leak", "wrapper-prefix"]
        fail-on = "warning"
    """,
    )
    write(tmp_path / "repo" / "sub" / "pyproject.toml", '[project]\nname = "sub"\n')
    write(tmp_path / "repo" / "sub" / "train.py", LEAKY)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    return tmp_path


def test_the_table_is_found_from_the_target_upwards_as_ruff_does(tree):
    table = str(tree / "repo" / "pyproject.toml")
    assert find_project(str(tree / "repo" / "sub" / "train.py")) == table  # sub/'s file has no table
    assert find_project(str(tree / "repo" / "sub" / "missing.pt")) == table
    assert find_project([str(tree / "repo" / "sub"), str(tree / "repo" / "x.py")]) == table  # their common folder
    assert find_project() is None  # elsewhere/: the working directory, and nothing above it has a table
    assert load_settings(str(tree / "repo" / "sub")).root == str(tree / "repo")


def test_lint_and_check_ckpt_read_the_project_of_their_target_not_of_the_working_directory(tree):
    lint = CliRunner().invoke(cli, ["lint", "--format", "text", str(tree / "repo" / "sub" / "train.py")])
    assert "missing-zero-grad" in lint.output and "graph-retention-leak" not in lint.output
    assert lint.exit_code == 1
    outside = checkpoint(tree / "elsewhere" / "w.safetensors")
    inside = checkpoint(tree / "repo" / "models" / "w.safetensors")
    assert "wrapper-prefix" in CliRunner().invoke(cli, ["check-ckpt", str(outside)]).output
    assert "wrapper-prefix" not in CliRunner().invoke(cli, ["check-ckpt", str(inside)]).output


def test_check_checkpoint_reads_the_same_settings_from_python(tree, monkeypatch):
    from torchdoctor import check_checkpoint

    inside = checkpoint(tree / "repo" / "w.safetensors")
    report = check_checkpoint(inside)
    assert "wrapper-prefix" not in {f.name for f in report.findings}
    assert (report.fail_on, report.exit_code()) == ("warning", 0)
    outside = check_checkpoint(checkpoint(tree / "elsewhere" / "w.safetensors"), ignore=["storage-bloat"])
    assert "wrapper-prefix" in {f.name for f in outside.findings} and outside.exit_code() == 0
    monkeypatch.setenv("TORCHDOCTOR_FAIL_ON", "info")
    assert check_checkpoint(inside).exit_code() == 1  # the environment wins over the table
    monkeypatch.setenv("TORCHDOCTOR_IGNORE", "wrapper-prefixx")
    with pytest.raises(ValueError, match="unknown check 'wrapper-prefixx' in TORCHDOCTOR_IGNORE; did you mean"):
        check_checkpoint(inside)


def test_later_layers_win_and_ignores_add_up(tree, monkeypatch):
    target = str(tree / "repo" / "sub")
    assert load_settings(target).fail_on == "warning"
    monkeypatch.setenv("TORCHDOCTOR_FAIL_ON", "info")
    monkeypatch.setenv("TORCHDOCTOR_SELECT", "missing-zero-grad, TD308")
    monkeypatch.setenv("TORCHDOCTOR_IGNORE", "TD306")
    settings = load_settings(target, select=["TD301"], ignore="a,b", fail_on="never", exclude=["gen/"])
    assert settings.fail_on == "never"
    assert [(layer.select, layer.ignore) for layer in settings.layers] == [
        ((), ("graph-retention-leak", "wrapper-prefix")),
        (("missing-zero-grad", "TD308"), ("TD306",)),
        (("TD301",), ("a", "b")),
    ]
    assert settings.exclude == [("gen/", None)]
    assert load_settings(target).fail_on == "info"
    monkeypatch.delenv("TORCHDOCTOR_FAIL_ON")
    assert load_settings(None).fail_on == "error"  # elsewhere/ has no table


@pytest.mark.parametrize(
    "table, words",
    [
        ('fail-on = "sometimes"', "[tool.torchdoctor] fail-on must be one of error, warning, info, never"),
        ("select = 3", "[tool.torchdoctor] select must be a list of strings"),
        ('colour = "red"', "unknown key 'colour' in [tool.torchdoctor]"),
        ("select = [", "cannot read"),
    ],
)
def test_a_malformed_table_is_a_one_line_input_error(tmp_path, monkeypatch, table, words):
    write(tmp_path / "pyproject.toml", f"[tool.torchdoctor]\n{table}\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SettingsError) as error:
        load_settings()
    assert words in str(error.value) and str(tmp_path / "pyproject.toml") in str(error.value)
    result = CliRunner().invoke(cli, ["lint"])
    assert result.exit_code == 2 and words in result.output and len(result.output.splitlines()) == 1


def test_a_bad_variable_is_a_one_line_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCHDOCTOR_FAIL_ON", "sometimes")
    result = CliRunner().invoke(cli, ["lint"])
    assert result.exit_code == 2
    assert result.output == "Error: TORCHDOCTOR_FAIL_ON must be one of error, warning, info, never, not 'sometimes'\n"
