"""`torchdoctor run` on the command line: usage errors, the report on stderr and in --report, exit statuses."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from run_programs import GOOD_STEP, LOOP

from torchdoctor.cli import main


def _usage_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        main(["run", *argv])
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_usage_errors_come_before_the_program_runs(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\n")
    assert "did you mean 'missing-zero-grad'" in _usage_error(capsys, "--select", "missing-zero-gard", str(script))
    assert "only by torchdoctor env" in _usage_error(capsys, "--select", "shm-too-small", str(script))
    assert "can't open file" in _usage_error(capsys, str(tmp_path / "nope.py"))
    assert "Missing argument" in _usage_error(capsys)
    assert not (tmp_path / "ran").exists()


def test_a_real_run_keeps_stdout_reports_on_stderr_and_writes_the_json(tmp_path):
    from test_json_envelope import SCHEMA, violations  # type: ignore[import-not-found]

    script = tmp_path / "train.py"
    step = GOOD_STEP.replace("    optimizer.zero_grad()\n", "")
    script.write_text(
        textwrap.dedent(LOOP.format(step=step))
        + "print('done', sys.argv[1:])\nraise SystemExit(int(sys.argv[1]))\n".replace("sys.", "__import__('sys').")
    )
    report = tmp_path / "out" / "report.json"
    report.parent.mkdir()
    run = [sys.executable, "-m", "torchdoctor", "run", "--report", str(report), str(script)]
    ok = subprocess.run([*run, "0", "--fail-on", "x"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    # the program's arguments are its own, --fail-on included; its stdout is untouched
    assert ok.stdout == "done ['0', '--fail-on', 'x']\n"
    assert "TD301 missing-zero-grad" in ok.stderr and "torchdoctor run" in ok.stderr
    assert ok.returncode == 1  # the program succeeded; an error finding under the default fail-on
    doc = json.loads(report.read_text())
    assert violations(doc, SCHEMA) == [] and doc["scope"] == "run"
    assert doc["findings"][0]["name"] == "missing-zero-grad" and doc["facts"]["program"]["exit_status"] == 0
