"""The shared report (JSON schema, exit codes, console layout) and the `checks` command."""

import json
from dataclasses import replace

from click.testing import CliRunner

from torchdoctor import __version__, registry
from torchdoctor.cli import cli
from torchdoctor.findings import Finding, Location, Severity, fold
from torchdoctor.report import Report, exit_code, make_console, render_console, to_json


def sample() -> Report:
    return Report(
        scope="env",
        facts={"answer": 42},
        subject="box",
        findings=[
            Finding(
                "shm is 64 MiB",
                fix="--shm-size=8g",
                code="TD111",
                name="shm-too-small",
                severity=Severity.WARNING,
                location=Location(file="/dev/shm"),
            ),
            Finding("CPU build", fix="pip install ...", code="TD102", name="cpu-only-build", severity=Severity.ERROR),
            Finding("just so you know", code="TD116", name="determinism-settings", severity=Severity.INFO),
        ],
    )


def test_json_document_follows_the_design_schema():
    doc = json.loads(to_json(sample()))
    assert list(doc) == [
        "schema_version",
        "tool",
        "version",
        "scope",
        "subject",
        "counts",
        "exit_code",
        "facts",
        "findings",
    ]
    assert (doc["schema_version"], doc["tool"], doc["version"], doc["scope"], doc["subject"], doc["facts"]) == (
        1,
        "torchdoctor",
        __version__,
        "env",
        "box",
        {"answer": 42},
    )
    assert doc["counts"] == {"error": 1, "warning": 1, "info": 1} and doc["exit_code"] == 1
    assert json.loads(to_json(replace(sample(), fail_on="never")))["exit_code"] == 0
    first = doc["findings"][0]  # errors first
    assert set(first) == {"code", "name", "severity", "message", "fix", "location", "count", "key"}
    assert (first["name"], first["severity"], first["location"]) == ("cpu-only-build", "error", None)
    assert doc["findings"][1]["location"] == {"file": "/dev/shm"}


def test_exit_codes_follow_fail_on():
    findings = sample().findings
    assert [exit_code(findings, level) for level in ("error", "warning", "info", "never")] == [1, 1, 1, 0]
    warnings_only = [f for f in findings if f.severity != Severity.ERROR]
    assert exit_code(warnings_only, "error") == 0 and exit_code(warnings_only, "warning") == 1
    assert exit_code([], "info") == 0


def test_console_groups_by_severity_with_fixes_and_no_colour_when_asked(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    console = make_console()
    with console.capture() as captured:
        render_console(sample(), console, fail_on="warning")
    out = captured.get()
    assert "\x1b[" not in out
    assert out.index("1 error") < out.index("1 warning") < out.index("1 note")
    assert "fix: --shm-size=8g" in out and "where: /dev/shm" in out
    assert " ".join(out.split()).endswith("Found 1 error, 1 warning, 1 note. Exit 1: --fail-on warning.")


def test_fold_counts_repeats():
    f = Finding("same", code="TD1", name="x", severity=Severity.INFO)
    [folded] = fold([f, f, f])
    assert folded.count == 3


def test_checks_command_lists_every_check_with_its_origin():
    result = CliRunner().invoke(cli, ["checks", "--format", "json"])
    assert result.exit_code == 0
    doc = json.loads(result.output)
    assert (doc["scope"], doc["subject"], doc["findings"], doc["exit_code"]) == ("checks", "all checks", [], 0)
    rows = doc["facts"]["checks"]
    assert [r["name"] for r in rows] == [c.name for c in registry.all_checks()]
    env_row = next(r for r in rows if r["name"] == "shm-too-small")
    assert env_row == {
        "code": "TD111",
        "name": "shm-too-small",
        "scopes": ["env"],
        "severity": "warning",
        "origin": "built-in",
        "summary": registry.get("TD111").summary,
    }
    piped = CliRunner().invoke(cli, ["checks", "--scope", "env"], env={"COLUMNS": "40"})
    lines = piped.output.splitlines()  # off a terminal: one tab-separated line each, never wrapped or padded
    assert lines[0] == "code\tname\tscope\tseverity\torigin\tsummary" and "TD201" not in piped.output
    assert f"TD111\tshm-too-small\tenv\twarning\tbuilt-in\t{registry.get('TD111').summary}" in lines
    assert len(lines) == 1 + len(registry.all_checks("env")) and all(line.count("\t") == 5 for line in lines)


def test_bare_torchdoctor_prints_the_help_and_a_missing_argument_points_to_it(capsys):
    import pytest

    from torchdoctor.cli import main

    with pytest.raises(SystemExit) as exc:
        main([])
    out, err = capsys.readouterr()
    assert exc.value.code == 0 and err == "" and out.startswith("Usage: torchdoctor") and "check-ckpt" in out
    with pytest.raises(SystemExit) as exc:
        main(["explain"])
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == ""
    assert err == "torchdoctor: error: Missing argument 'CHECK'. (see `torchdoctor explain --help`)\n"
