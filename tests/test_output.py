"""Output a person can paste: no wrap or padding off a terminal, fix code never wrapped, ASCII where needed."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from click.testing import CliRunner
from rich.console import Console

from torchdoctor.cli import cli
from torchdoctor.findings import Finding, Severity
from torchdoctor.report import Report, render_console

LEAKY = textwrap.dedent("""\
    def train(model, loader, optimizer, criterion):
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
""")
CODE_LINE = "             optimizer.zero_grad(set_to_none=True)"  # the fix's code, indented under its title


def _report() -> Report:
    long_code = (
        "model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank], find_unused_parameters=True)"
    )
    return Report(
        scope="runtime",
        findings=[
            Finding(
                "A message long enough to need several lines on a narrow terminal, which the console wraps there " * 2,
                fix="Wrap the model:\n" + long_code,
                code="TD9",
                name="long-one",
                severity=Severity.ERROR,
            )
        ],
    )


def test_piped_lint_output_is_neither_wrapped_nor_padded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(LEAKY)
    result = CliRunner().invoke(cli, ["lint", "--no-cache", "train.py"], env={"COLUMNS": "40", "NO_COLOR": "1"})
    lines = result.output.splitlines()
    message = next(line for line in lines if "optimizer.step()" in line and "zero_grad" in line)
    assert message.startswith("     `optimizer.step()` runs in the loop") and message.endswith("running sum.")
    assert CODE_LINE in lines and "         for x, y in loader:" in lines
    assert [line for line in lines if line != line.rstrip()] == []


def test_on_a_terminal_prose_wraps_and_fix_code_is_neither_wrapped_nor_cut():
    console = Console(force_terminal=True, width=60, no_color=True, highlight=False)
    with console.capture() as captured:
        render_console(_report(), console)
    lines = captured.get().splitlines()
    long_code = (
        "model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank], find_unused_parameters=True)"
    )
    assert "         " + long_code in lines  # 114 columns on a 60-column terminal, whole
    prose = [line for line in lines if "narrow terminal" in line or "wraps there" in line]
    assert len(prose) > 2 and all(len(line) <= 60 for line in prose)


def _run_cli(args, cwd, encoding):
    env = {**os.environ, "PYTHONIOENCODING": encoding, "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "torchdoctor", *args], cwd=cwd, env=env, capture_output=True, timeout=120
    )


@pytest.mark.parametrize("encoding", ["ascii", "cp1252"])
def test_a_stream_without_the_symbols_gets_ascii_stand_ins_not_a_crash(tmp_path, encoding):
    (tmp_path / "train.py").write_text(LEAKY)
    torch.save({"module.w": torch.zeros(2)}, tmp_path / "dp.pt")  # wrapper-prefix: its message holds "…"
    lint = _run_cli(["lint", "--no-cache", "train.py"], tmp_path, encoding)
    assert lint.returncode == 1, lint.stderr
    out = lint.stdout.decode(encoding)
    assert " X TD301 missing-zero-grad" in out and "Found 1 error." in out and CODE_LINE in out.splitlines()
    ckpt = _run_cli(["check-ckpt", "dp.pt"], tmp_path, encoding)
    assert ckpt.returncode == 0, ckpt.stderr
    ellipsis = {"ascii": "...", "cp1252": "\u2026"}[encoding]  # cp1252 has "…": kept
    assert f"Missing key(s) {ellipsis} Unexpected" in ckpt.stdout.decode(encoding)


def test_text_and_json_on_a_cp1252_stream(tmp_path):
    """The formats click writes get stand-ins too (on an ASCII stream click writes UTF-8 by itself)."""
    (tmp_path / "train.py").write_text(
        'import torch\nstate = torch.load("caf\u00e9 \u2265 \u2713.pt")\n', encoding="utf-8"
    )
    text = _run_cli(["lint", "--no-cache", "--format", "text", "train.py"], tmp_path, "cp1252")
    assert text.returncode == 0 and text.stderr == b""
    assert text.stdout.decode("cp1252").startswith(
        'train.py:2:9: TD503 unsafe-torch-load `torch.load("caf\u00e9 >= OK.pt")`'
    )
    doc = _run_cli(["lint", "--no-cache", "--format", "json", "train.py"], tmp_path, "cp1252")
    [finding] = json.loads(doc.stdout.decode("cp1252"))["findings"]
    assert doc.returncode == 0 and 'torch.load("caf\u00e9 >= OK.pt")' in finding["message"]


def test_env_on_an_ascii_stream(tmp_path):
    env = _run_cli(["env", "--select", "cpu-only-build"], tmp_path, "ascii")
    assert env.returncode in (0, 1) and env.stderr == b""  # no UnicodeEncodeError, no internal error
    assert env.stdout.decode("ascii").startswith("torchdoctor env - ")
