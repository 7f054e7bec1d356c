"""`torchdoctor env` end to end: on this machine, with a broken torch, and with bad options."""

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from env_stub import collection_of

from torchdoctor.cli import cli, main

# Runs the CLI like the console script does, and tells on stderr whether torch ended up imported.
ENTRY = (
    "import atexit, sys; "
    "atexit.register(lambda: sys.stderr.write('torch-imported=%s' % ('torch' in sys.modules))); "
    "from torchdoctor.cli import main; main()"
)


def run_env(*args, cwd, extra_env=None):
    env = {**os.environ, **(extra_env or {}), "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-c", ENTRY, "env", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_healthy_machine_exits_0_with_no_warning_or_error_even_while_every_core_is_busy(tmp_path):
    """The healthy control runs beside CPU-bound processes on every core: a loaded machine (a busy CI runner)
    makes the import slow in wall time, which must not turn into a warning about the install."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        result = run_env("--format", "json", cwd=tmp_path)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
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
    assert "torch-import-failure" in out and "this torch is broken on purpose" in out
    assert "module-shadowing" not in out  # one cause, one finding: the import failure names the folder
    assert f"Python found {fake / 'torch'} first (PYTHONPATH is searched before site-packages)" in out
    assert f"Rename {fake / 'torch'}" in out
    assert "Python" in out and "Memory" in out  # the facts section is still there
    assert result.stderr == "torch-imported=False"


@pytest.mark.parametrize(
    "args, words",
    [
        (["env", "--select", "no-such-check"], "unknown check 'no-such-check'"),
        (["env", "--format", "xml"], "Invalid value for '--format'"),
        (["env", "--fail-on", "sometimes"], "Invalid value for '--fail-on'"),
        (["explain", "nope"], "unknown check 'nope'"),
    ],
)
def test_bad_options_give_one_line_and_exit_2(args, words, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and err.startswith("torchdoctor: error:")


def test_select_and_fail_on_with_synthetic_facts(monkeypatch):
    """--select narrows the checks, --fail-on moves the exit-code threshold (no probe: facts injected)."""
    from env_fixtures import healthy_gpu_facts

    facts = healthy_gpu_facts()
    facts.system.shm_total = 64 * 1024**2
    facts.nvidia.gpus[0].persistence_mode = False
    fake_collection(monkeypatch, facts)
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


def fake_collection(monkeypatch, facts):
    from torchdoctor.env import doctor

    monkeypatch.setattr(doctor, "FactCollection", collection_of(lambda: facts))


# Every field `python -m torch.utils.collect_env` prints (torch 2.13), and the markdown row that covers it.
COLLECT_ENV_FIELDS = {
    "PyTorch version": "| PyTorch |",
    "Is debug build": "debug build:",
    "CUDA used to build PyTorch": "| CUDA used to build PyTorch |",
    "ROCM used to build PyTorch": "| ROCm used to build PyTorch |",
    "OS": "| OS |",
    "GCC version": "GCC:",
    "Clang version": "Clang:",
    "CMake version": "CMake:",
    "Libc version": "| Libc |",
    "Python version": "| Python |",
    "Python platform": "| Python platform |",
    "Is CUDA available": "| CUDA available |",
    "CUDA runtime version": "| CUDA toolkit (nvcc) |",
    "CUDA_MODULE_LOADING set to": "| CUDA_MODULE_LOADING |",
    "GPU models and configuration": "| GPU models and configuration |",
    "Nvidia driver version": "| NVIDIA driver |",
    "cuDNN version": "| cuDNN |",
    "Is XPU available": "| XPU available |",
    "HIP runtime version": "| HIP runtime |",
    "MIOpen runtime version": "| cuDNN |",  # the same row, named MIOpen on ROCm builds
    "Is XNNPACK available": "| XNNPACK available |",
    "Caching allocator config": "| Caching allocator config |",
    "CPU": "CPU (lscpu)",
    "Versions of relevant libraries": "**Relevant packages (pip)**",
}


def test_markdown_report_covers_collect_env(monkeypatch):
    from env_fixtures import healthy_gpu_facts

    facts = healthy_gpu_facts()
    facts.torch.xpu_available, facts.torch.xnnpack, facts.torch.debug = False, True, False
    facts.system.shm_total = 64 * 1024**2
    facts.env_vars["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    fake_collection(monkeypatch, facts)
    result = CliRunner().invoke(cli, ["env", "--format", "markdown"])
    out = result.output
    missing = [name for name, row in COLLECT_ENV_FIELDS.items() if row not in out]
    if not __import__("shutil").which("lscpu"):  # no lscpu (macOS): the CPU row alone
        missing.remove("CPU")
    assert missing == [] and result.exit_code == 0
    assert "| PyTorch | 2.5.1+cu124 (debug build: no) |" in out and "| cuDNN | 90100 |" in out
    assert "GPU0: NVIDIA A100-SXM4-80GB (sm_80), 80 GiB; GPU1:" in out
    assert "| Caching allocator config | PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True |" in out
    assert "torchvision==0.20.1+cu124" in out
    assert "- **warning TD111 shm-too-small**: /dev/shm is only 64 MiB" in out


def test_verbose_lists_the_checks_that_passed_by_area(monkeypatch):
    from env_fixtures import healthy_cpu_facts

    facts = healthy_cpu_facts()
    facts.system.shm_total = 64 * 1024**2
    fake_collection(monkeypatch, facts)
    out = CliRunner().invoke(cli, ["env", "-v"], env={"COLUMNS": "300"}).output
    machine = next(line for line in out.splitlines() if line.startswith("✓ machine"))
    assert "low-resources" in machine and "shm-too-small" not in machine  # it fired
    assert "✓ torch install" in out and "torch-import-failure" in out
    plain = CliRunner().invoke(cli, ["env"]).output
    assert "Checks that passed" not in plain


def test_spinner_only_on_a_terminal(monkeypatch):
    from torchdoctor.cli import env as env_cli

    with env_cli._spinner("json") as progress:
        progress("importing torch")  # nothing to show: not the console format
    steps = []

    class Status:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def update(self, text):
            steps.append(text)

    class Console:
        def status(self, text):
            steps.append(text)
            return Status()

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    monkeypatch.setattr("torchdoctor.report.make_console", lambda stderr: Console())
    with env_cli._spinner("console") as progress:
        progress("importing torch in a subprocess")
    assert steps == ["examining this machine…", "importing torch in a subprocess…"]


def test_fresh_install_brings_numpy():
    """The README's quick start installs torch and torchdoctor only: numpy must come as a dependency, or the
    first report a newcomer sees is numpy-problem's 'NumPy is not installed'."""
    import re
    from pathlib import Path

    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib

    root = Path(__file__).resolve().parents[2]
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(re.match(r"numpy\b", d) for d in deps)
    quick_start = re.search(r"## Quick start.*?```bash\n(.*?)```", (root / "README.md").read_text(), re.S).group(1)
    assert "pip install ." in quick_start and "numpy" not in quick_start  # one way to get it, not two
