"""The lint engine: worker processes give the same findings as a serial run; a crashing check is contained."""

import ast
import gc
import textwrap
import warnings

import pytest
from conftest import ENGINE_CHECKS
from pitfall_factory import make_pitfall

from torchdoctor.findings import Severity
from torchdoctor.lint.runner import (
    _WORKER_STATE,
    _chunks,
    _lint_files,
    _worker_lint,
    check_source,
    lint_paths,
    read_source,
)
from torchdoctor.lint.source import ProjectFacts
from torchdoctor.pysource import parse_quietly, quiet_parsing

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


USES_LEAKY = textwrap.dedent("""
    from m0 import train


    def main(model, loader, optimizer, criterion):
        for epoch in range(3):
            train(model, loader, optimizer, criterion)
""")


def test_workers_find_what_a_serial_run_finds(tmp_path):
    for i in range(220):
        (tmp_path / f"t{i}.py").write_text(LEAKY if i % 2 else "x = 1\n", encoding="utf-8")
    checks = ENGINE_CHECKS
    serial = lint_paths([str(tmp_path)], checks, cwd=str(tmp_path), jobs=1)
    parallel = lint_paths([str(tmp_path)], checks, cwd=str(tmp_path), jobs=2)
    assert len(serial.findings) == 220 and serial.findings == parallel.findings


def test_workers_get_whole_projects_when_a_project_boundary_is_near(tmp_path):
    # Three projects of 60, 50 and 90 files (each a folder with a pyproject.toml), then one of 400: the slices
    # end where a project does (a worker parses the files its files' questions need, so a project split between
    # two workers is parsed twice), except inside a project too large for one slice.
    files = []
    for name, count in (("a", 60), ("b", 50), ("c", 90), ("big", 400)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "pyproject.toml").write_text("", encoding="utf-8")
        files += [(str(tmp_path / name / f"m{i:03}.py"), f"{name}/m{i:03}.py") for i in range(count)]
    chunks = _chunks(files, ProjectFacts(), 100)
    assert [len(c) for c in chunks] == [110, 90, 100, 100, 100, 100]
    assert [f for c in chunks for f in c] == files
    assert _chunks(files[:50], ProjectFacts(), 100) == [files[:50]]


def test_a_worker_releases_the_project_its_previous_slice_ended_in(tmp_path):
    # As a serial run does when it leaves a project: a worker whose next slice starts in another project forgets
    # the trees of the one before (a slice that goes on in the same project keeps the modules another file read).
    files = {}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "pyproject.toml").write_text("", encoding="utf-8")
        (tmp_path / name / "m0.py").write_text(LEAKY, encoding="utf-8")
        (tmp_path / name / "m1.py").write_text(USES_LEAKY, encoding="utf-8")
        files[name] = [(str(tmp_path / name / f"m{i}.py"), f"{name}/m{i}.py") for i in range(2)]
    project = ProjectFacts()
    _WORKER_STATE.update(checks=ENGINE_CHECKS, project=project)
    try:
        assert all(r.findings for r in _worker_lint(files["a"][:1]))
        _worker_lint(files["a"][1:])
        assert project.program.parsed(files["a"][0][0]) is not None  # the same project, read by m1: kept
        assert all(r.findings for r in _worker_lint(files["b"][:1]))
        assert all(project.program.parsed(path) is None for path, _ in files["a"])
    finally:
        _WORKER_STATE.clear()


def test_a_script_no_other_file_needs_is_forgotten_once_checked(tmp_path):
    # A script that imports nothing of its project and lies in no package is checked and its tree freed at once
    # (holding every such tree to the project's end made a run a sixth slower). Kept: a module another file's
    # question read, a file importing project modules (its calls may be another file's callers), a package's
    # module (others are likely to import it). Every finding is the one a single-file run gives.
    (tmp_path / "pyproject.toml").write_text("", encoding="utf-8")
    (tmp_path / "a_script.py").write_text(LEAKY, encoding="utf-8")
    (tmp_path / "b_lib.py").write_text(LEAKY, encoding="utf-8")
    (tmp_path / "c_user.py").write_text(USES_LEAKY.replace("m0", "b_lib"), encoding="utf-8")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "pkg" / "steps.py").write_text(LEAKY, encoding="utf-8")
    names = ["a_script.py", "b_lib.py", "c_user.py", "pkg/steps.py"]
    files = [(str(tmp_path / n), n) for n in names]
    project = ProjectFacts()
    results = _lint_files(files, ENGINE_CHECKS, project)
    kept = [project.program.parsed(path) is not None for path, _ in files]
    assert kept == [False, True, True, True]
    alone = [lint_paths([path], ENGINE_CHECKS, cwd=str(tmp_path), jobs=1).findings for path, _ in files]
    assert [r.findings for r in results] == alone
    assert all(r.findings for r in results)


@pytest.mark.parametrize("collecting", [True, False])
def test_a_run_gives_the_garbage_collector_back_as_it_found_it(tmp_path, collecting):
    # A run switches the collector off while it builds syntax trees; a library caller (or the watch and run
    # doors in the same process) gets its own setting back, after a run and after one that raised.
    (tmp_path / "t.py").write_text(LEAKY, encoding="utf-8")
    was = gc.isenabled()
    try:
        gc.enable() if collecting else gc.disable()
        assert lint_paths([str(tmp_path)], ENGINE_CHECKS, cwd=str(tmp_path), jobs=1).findings
        assert gc.isenabled() is collecting
        with pytest.raises(FileNotFoundError):
            lint_paths([str(tmp_path / "missing.py")], ENGINE_CHECKS, cwd=str(tmp_path))
        assert gc.isenabled() is collecting
    finally:
        gc.enable() if was else gc.disable()


def test_a_crashing_check_becomes_one_finding_for_that_file(tmp_path):
    path = tmp_path / "t.py"
    path.write_text(LEAKY, encoding="utf-8")

    def broken(src):
        raise RuntimeError("boom")

    info = make_pitfall("TD999", "broken-check", "source", broken, severity="error")
    [f] = check_source(read_source(str(path), "t.py"), [info])
    assert "boom" in f.message and f.location.file == "t.py" and f.severity == Severity.INFO


def test_columns_count_characters_in_crlf_files(tmp_path):
    path = tmp_path / "t.py"
    path.write_bytes(
        "for x, y in loader:\r\n    loss = crit(model(x), y)\r\n    loss.backward()\r\n"
        "    é = 1; optimizer.step()  # torchdoctor: ignore[graph-retention-leak]\r\n".encode("utf-8")
    )
    [f] = check_source(read_source(str(path), "t.py"), ENGINE_CHECKS)
    assert (f.name, f.location.line, f.location.column) == ("missing-zero-grad", 4, 12)
    assert f.message.startswith("`optimizer.step()`")


def test_a_file_with_an_invalid_escape_is_linted_quietly_even_when_warnings_are_errors(tmp_path):
    """`"\\d"` (and a helper module with one): the parser's SyntaxWarning on Python 3.12 (printed amid the lint
    report by default), its DeprecationWarning before; under `-W error` either one made the file 'not valid
    Python' and hid its findings."""
    (tmp_path / "helpers.py").write_text('PATTERN = "\\d+"\n\n\ndef total(loss, acc):\n    return acc + loss\n')
    (tmp_path / "train.py").write_text('from helpers import PATTERN\n\nDIGITS = "\\d"\n' + LEAKY)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet = lint_paths([str(tmp_path)], ENGINE_CHECKS, cwd=str(tmp_path), jobs=1)
    assert [str(w.message) for w in caught] == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        strict = lint_paths([str(tmp_path)], ENGINE_CHECKS, cwd=str(tmp_path), jobs=1)
    assert strict.findings == quiet.findings and {f.name for f in quiet.findings} == {
        "graph-retention-leak",
        "missing-zero-grad",
    }


def test_quiet_parsing_silences_the_parser_once_for_a_block_and_restores_the_filters():
    """A lint run changes the warning filters once (`quiet_parsing`), not once per file; `parse_quietly` stays
    quiet on its own outside such a block, and the user's filters are as they were afterwards."""
    escape = 'DIGITS = "\\d"\n'
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = list(warnings.filters)
        ast.parse(escape)  # the control: this parse warns
        assert len(caught) == 1
        with quiet_parsing():
            inside = list(warnings.filters)
            parse_quietly(escape)
            assert warnings.filters == inside  # no filter change per parse
        assert warnings.filters == before
        parse_quietly(escape)
        assert warnings.filters == before
    assert len(caught) == 1
