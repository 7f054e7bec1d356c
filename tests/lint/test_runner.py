"""The lint engine: worker processes give the same findings as a serial run; a crashing check is contained."""

import textwrap
import warnings

from conftest import ENGINE_CHECKS
from pitfall_factory import make_pitfall

from torchdoctor.findings import Severity
from torchdoctor.lint.runner import check_source, lint_paths, read_source

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


def test_workers_find_what_a_serial_run_finds(tmp_path):
    for i in range(220):
        (tmp_path / f"t{i}.py").write_text(LEAKY if i % 2 else "x = 1\n", encoding="utf-8")
    checks = ENGINE_CHECKS
    serial = lint_paths([str(tmp_path)], checks, cwd=str(tmp_path), jobs=1)
    parallel = lint_paths([str(tmp_path)], checks, cwd=str(tmp_path), jobs=2)
    assert len(serial.findings) == 220 and serial.findings == parallel.findings


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
