"""check-ckpt's console report off a terminal is printed without rich: the same text as rich prints, checked here
on every kind of file the tests build (and on files with what only rich may print)."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys

import hostile_corpus
import pytest

from torchdoctor import registry
from torchdoctor.ckpt.api import diagnose_checkpoints
from torchdoctor.ckpt.view import facts_view, plain_lines
from torchdoctor.pasteable import PasteableStream
from torchdoctor.plainreport import off_terminal, report_lines
from torchdoctor.report import render_console


class _File(io.StringIO):
    def isatty(self) -> bool:
        return False


def _both(paths: list[str], fail_on: str = "error", quiet: bool = False) -> tuple[str, "str | None"]:
    """(what rich prints, what the plain lines print; None when they leave the report to rich)."""
    from rich.console import Console

    report = diagnose_checkpoints(paths, registry.all_checks("checkpoint"))
    rich_out = _File()
    console = Console(file=PasteableStream(rich_out), width=10_000, highlight=False, soft_wrap=True)  # type: ignore[arg-type]
    render_console(report, console, fail_on=fail_on, facts_view=None if quiet else facts_view)
    facts = None if quiet else plain_lines(report.facts)
    lines = report_lines(report, fail_on, facts) if quiet or facts is not None else None
    if lines is None:
        return rich_out.getvalue(), None
    plain_out = _File()
    stream = PasteableStream(plain_out)
    stream.write("\n".join(lines) + "\n")
    return rich_out.getvalue(), plain_out.getvalue()


def test_every_benign_file_prints_as_rich_prints_it(files):
    for name, path in files.items():
        for quiet in (False, True):
            rich_text, plain_text = _both([path], quiet=quiet)
            assert plain_text == rich_text, name
    rich_text, plain_text = _both(list(files.values()), fail_on="warning")  # many files, exit 1
    assert plain_text == rich_text


def test_hostile_files_print_as_rich_prints_them(tmp_path):
    built = hostile_corpus.build(str(tmp_path / "h"), str(tmp_path / "canaries"))
    printed = 0
    for name, (path, _, _) in built.items():
        rich_text, plain_text = _both([path])
        assert plain_text in (None, rich_text), name
        printed += plain_text is not None
    assert printed >= len(built) // 2


@pytest.mark.parametrize(
    "key",
    ["tab\there", "line\nbreak", "bell\x07", "wide 漢字", "x" * 5000, "escape\x1b[31m"],
)
def test_what_only_rich_may_print_is_left_to_rich(tmp_path, key):
    path = tmp_path / "odd.pkl"
    path.write_bytes(pickle.dumps({key: 1}, protocol=2))
    rich_text, plain_text = _both([str(path)])
    assert plain_text is None or plain_text == rich_text


def test_a_terminal_or_forced_colour_gets_rich(monkeypatch):
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    assert off_terminal(_File())
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert not off_terminal(_File())
    monkeypatch.setenv("TTY_COMPATIBLE", "0")
    assert off_terminal(_File())


def test_the_piped_console_report_imports_no_rich(files, tmp_path):
    code = (
        "import sys\n"
        "from torchdoctor.cli import main\n"
        "try:\n    main(['check-ckpt', sys.argv[1]])\n"
        "except SystemExit:\n    pass\n"
        "print('RICH' if any(m.split('.')[0] == 'rich' for m in sys.modules) else 'NO RICH')\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    out = subprocess.run([sys.executable, "-c", code, files["training"]], capture_output=True, text=True, env=env)
    assert out.stdout.strip().endswith("NO RICH") and "Largest tensors" in out.stdout, out.stderr
