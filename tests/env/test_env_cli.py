"""`torchdoctor env` end to end: on this machine, with a broken torch, and with bad options."""
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from torchdoctor.cli import cli, main


# Runs the CLI like the console script does, and tells on stderr whether torch ended up imported.
ENTRY = ("import atexit, sys; "
         "atexit.register(lambda: sys.stderr.write('torch-imported=%s' % ('torch' in sys.modules))); "
         "from torchdoctor.cli import main; main()")


def run_env(*args, cwd, extra_env=None):
    env = {**os.environ, **(extra_env or {}), "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-c", ENTRY, "env", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_healthy_machine_exits_0_with_no_warning_or_error(tmp_path):
    result = run_env("--format", "json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["tool"] == "torchdoctor" and report["scope"] == "env"
    assert report["facts"]["torch"]["ok"] is True
    assert report["facts"]["system"]["cpu_logical"] >= 1
    assert [f for f in report["findings"] if f["severity"] != "info"] == []
    assert result.stderr == "torch-imported=False"  # torch is only imported by the probe subprocess


def test_broken_torch_first_on_pythonpath(tmp_path):
    fake = tmp_path / "shadow"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("raise ImportError('this torch is broken on purpose')\n")
    result = run_env(cwd=tmp_path, extra_env={"PYTHONPATH": str(fake)})
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert "torch-import-failure" in out and "module-shadowing" in out
    assert "this torch is broken on purpose" in out
    assert out.count(str(fake / "torch")) >= 2  # both findings name the folder
    assert "Python" in out and "Memory" in out  # the facts section is still there
    assert result.stderr == "torch-imported=False"


@pytest.mark.parametrize("args, words", [
    (["env", "--select", "no-such-check"], "unknown check 'no-such-check'"),
    (["env", "--format", "xml"], "Invalid value for '--format'"),
    (["env", "--fail-on", "sometimes"], "Invalid value for '--fail-on'"),
    (["explain", "nope"], "unknown check 'nope'"),
])
def test_bad_options_give_one_line_and_exit_2(args, words, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and err.startswith("torchdoctor: error:")


def test_select_and_fail_on_with_synthetic_facts(monkeypatch):
    """--select narrows the checks, --fail-on moves the exit-code threshold (no probe: facts injected)."""
    from env_fixtures import healthy_gpu_facts
    from torchdoctor.env import doctor

    facts = healthy_gpu_facts()
    facts.system.shm_total = 64 * 1024 ** 2
    facts.nvidia.gpus[0].persistence_mode = False
    class Collected:
        def __init__(self, **options):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def finish(self):
            return facts

    monkeypatch.setattr(doctor, "FactCollection", Collected)
    runner = CliRunner()
    both = runner.invoke(cli, ["env", "--format", "json"])
    names = sorted(f["name"] for f in json.loads(both.output)["findings"])
    assert names == ["gpu-health", "shm-too-small"] and both.exit_code == 0
    strict = runner.invoke(cli, ["env", "--fail-on", "warning"])
    assert strict.exit_code == 1 and "shm-too-small" in strict.output and "Found 1 warning, 1 note" in strict.output
    only = runner.invoke(cli, ["env", "--select", "TD114", "--fail-on", "info"])
    assert only.exit_code == 1 and "shm-too-small" not in only.output
    ignored = runner.invoke(cli, ["env", "--ignore", "shm-too-small,gpu-health", "--fail-on", "info"])
    assert ignored.exit_code == 0 and "No problems found" in ignored.output
