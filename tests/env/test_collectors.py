"""The torch-free collectors on this machine, and the probe's parsing of whatever a subprocess left."""

import json
import os
import time
from pathlib import Path

from torchdoctor.env import packages, probe, shadowing, system, toolkit
from torchdoctor.env.nvidia import collect_nvidia, describe_process


def test_probe_payloads_with_build_and_cuda_facts():
    payloads = [
        {"kind": "build", "ok": True, "version": "2.5.1+cu124", "cuda": "12.4", "unknown_key": 1},
        {"kind": "cuda", "cuda_devices": [{"name": "A100", "capability": [8, 0]}]},
    ]
    p = probe.build_probe(payloads, [], timed_out=False, timeout=60, returncode=0)
    assert p.ok and p.version == "2.5.1+cu124" and p.cuda_devices[0]["capability"] == (8, 0)


def test_probe_hang_during_cuda_init_keeps_the_build_facts():
    payloads = [{"kind": "build", "ok": True, "version": "2.5.1+cu124", "cuda": "12.4"}]
    p = probe.build_probe(payloads, [], timed_out=True, timeout=5, returncode=-9)
    assert p.ok and p.timed_out and "CUDA initialisation did not finish within 5 s" in p.cuda_error


def test_probe_that_died_without_output():
    p = probe.build_probe([], ["Segmentation fault\n"], timed_out=False, timeout=60, returncode=-11)
    assert not p.ok and p.error_type == "ProbeFailed" and "Segmentation fault" in p.error and "-11" in p.error
    assert p.exit_signal == 11


def test_probe_that_crashed_keeps_faulthandlers_stack():
    stderr = [
        "Fatal Python error: Bus error\n",
        "\n",
        "Current thread 0x00007f (most recent call first):\n",
        '  File "/py/ctypes/__init__.py", line 376 in __init__\n',
        '  File "/site/torch/__init__.py", line 380 in _load_global_deps\n',
    ]
    p = probe.build_probe([], stderr, timed_out=False, timeout=60, returncode=-7)
    assert p.crash_stack == [
        "/py/ctypes/__init__.py:376 in __init__",
        "/site/torch/__init__.py:380 in _load_global_deps",
    ]
    assert p.exit_signal == 7 and not p.timed_out and "Bus error" in p.error


def test_probe_on_this_machine_is_not_waited_for_after_its_facts(tmp_path, monkeypatch):
    """Once the probe said "ready", its interpreter's teardown (slow with torch loaded) is not waited for."""
    (tmp_path / "sitecustomize.py").write_text("import atexit, time\natexit.register(time.sleep, 600)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    running = probe.RunningProbe(timeout=120)
    p = running.result()
    assert p.ok and p.version.startswith("2.") and p.num_threads >= 1 and p.seconds > 0
    assert p.cpu_seconds > 0 and (p.blocked_seconds is None or p.blocked_seconds >= 0)
    assert running.proc.returncode == -9  # killed once "ready" arrived, not waited for (however fast the machine)


def test_probe_subprocess_times_out_on_a_hanging_import(tmp_path, monkeypatch):
    """The probe's own clock starts when it runs (a slow start on a loaded machine is not counted), and it dumps
    its stack and ends itself at its deadline: no race between the dump and the parent's kill."""
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("import time\n\ndef wait_for_lock():\n    time.sleep(60)\n\nwait_for_lock()\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    result = probe.RunningProbe(timeout=1.5, cwd=str(tmp_path)).result()
    assert not result.ok and result.timed_out and "did not finish within 1.5 s" in result.error
    init = str(fake / "__init__.py")
    assert result.hang_stack == [f"{init}:4 in wait_for_lock", f"{init}:6 in <module>"]  # faulthandler's dump
    assert result.seconds >= 1.5 and not any("Timeout" in line for line in result.stderr_tail)


def test_shadowing_finds_stdlib_and_torch_copies_but_not_editable_installs(tmp_path):
    (tmp_path / "random.py").write_text("")
    (tmp_path / "numpy.py").write_text("")
    (tmp_path / "test.py").write_text("")  # not imported by torch: not a problem
    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    installed = {"torch": "/site-packages/torch", "numpy": str(tmp_path / "numpy.py")}
    found = shadowing.find_shadowing([(str(tmp_path), "the working directory")], installed)
    assert sorted((e.name, Path(e.path).name) for e in found) == [("random", "random.py"), ("torch", "torch")]


def test_first_folder_on_the_path_wins(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for d in (first, second):
        d.mkdir()
        (d / "copy.py").write_text("")
    found = shadowing.find_shadowing([(str(first), "PYTHONPATH"), (str(second), "PYTHONPATH")], {})
    assert [e.origin_dir for e in found] == [str(first)]


def test_search_dirs_are_cwd_then_pythonpath(tmp_path):
    extra = tmp_path / "extra"
    extra.mkdir()
    dirs = shadowing.search_dirs(str(tmp_path), {"PYTHONPATH": f"{extra}{os.pathsep}/does/not/exist"})
    assert dirs == [(str(tmp_path), "the working directory"), (str(extra), "PYTHONPATH")]


def test_relevant_env_keeps_only_what_matters():
    env = system.relevant_env(
        {"CUDA_VISIBLE_DEVICES": "0", "NCCL_DEBUG": "INFO", "HOME": "/root", "OMP_NUM_THREADS": "4", "AWS_SECRET": "x"}
    )
    assert env == {"CUDA_VISIBLE_DEVICES": "0", "NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "4"}


def test_cgroup_quota_v2_and_unlimited(tmp_path):
    (tmp_path / "cpu.max").write_text("400000 100000\n")
    assert system.cgroup_cpu_limit(tmp_path) == 4.0
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert system.cgroup_cpu_limit(tmp_path) is None


def test_system_facts_on_this_machine(tmp_path):
    facts = system.collect_system(str(tmp_path))
    assert facts.cpu_logical and facts.memory_total and facts.disk_free is not None
    assert facts.python.count(".") == 2


def test_packages_read_from_metadata_without_importing():
    facts = packages.collect_packages()
    assert facts.versions["torch"].startswith("2.")
    assert facts.torch_location and Path(facts.torch_location, "__init__.py").is_file()


def test_torch_cuda_read_as_text(tmp_path):
    v = tmp_path / "version.py"
    v.write_text("__version__ = '2.5.1+cu124'\ndebug = False\ncuda: Optional[str] = '12.4'\n")
    assert packages.read_torch_cuda(v) == "12.4"
    v.write_text("cuda: Optional[str] = None\n")
    assert packages.read_torch_cuda(v) is None


def test_toolkit_from_cuda_home_version_json(tmp_path):
    (tmp_path / "version.json").write_text(json.dumps({"cuda": {"version": "12.4.131"}}))
    facts = toolkit.collect_toolkit({"CUDA_HOME": str(tmp_path), "PATH": ""})
    assert facts.nvcc_version == "12.4" and facts.cuda_home_from_env


def test_nvml_reports_gpus_or_says_why_there_are_none():
    facts = collect_nvidia()
    assert bool(facts.gpus) != bool(facts.unavailable_reason)


def test_describe_process_for_a_live_and_a_dead_pid():
    me = describe_process(os.getpid(), 1024, same_pid_namespace=True)
    assert me.alive and "python" in (me.command or "") and me.user
    dead = describe_process(2**22 + 12345, 1024, same_pid_namespace=True)
    assert dead.alive is False
    unknown = describe_process(2**22 + 12345, 1024, same_pid_namespace=False)
    assert unknown.alive is None


def test_a_worker_whose_group_leader_died_is_orphaned():
    import subprocess

    leader = subprocess.Popen(
        ["sh", "-c", "sleep 30 & echo $!"], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    worker = int(leader.stdout.readline())
    leader.wait()
    try:
        for _ in range(50):  # the shell is reaped; the sleep lives on in the shell's process group
            if describe_process(worker, 1, same_pid_namespace=True).orphaned:
                break
            time.sleep(0.05)
        assert describe_process(worker, 1, same_pid_namespace=True).orphaned
        nohup_job = subprocess.Popen(["sleep", "30"], start_new_session=True)  # leads its own group
        assert not describe_process(nohup_job.pid, 1, same_pid_namespace=True).orphaned
        nohup_job.kill()
        nohup_job.wait()
    finally:
        os.kill(worker, 9)


def test_packages_pinned_to_another_torch_or_to_numpy_1(tmp_path, monkeypatch):
    info = tmp_path / "torchvision-0.29.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torchvision\nVersion: 0.29.2\n"
        "Requires-Dist: numpy\nRequires-Dist: torch (>=2.14.0)\n"
        "Requires-Dist: scipy ; extra == 'scipy'\n"
    )
    old = tmp_path / "oldcv-4.0.dist-info"
    old.mkdir()
    (old / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: OldCV\nVersion: 4.0\n"
        "Requires-Dist: numpy<2,>=1.21\nRequires-Dist: torch; extra == 'torch'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    facts = packages.collect_packages()
    assert facts.versions["torchvision"] == "0.29.2"
    assert facts.torch_requirements["torchvision"] == ">=2.14.0" and "oldcv" not in facts.torch_requirements
    assert facts.numpy_requirements["oldcv"] == "<2,>=1.21" and "torchvision" not in facts.numpy_requirements
    assert not [u for u in facts.unmet if u.dist in ("torchvision", "oldcv")]  # scipy is only an extra's


def test_unmet_requirements_like_pip_check(tmp_path, monkeypatch):
    """A real pass over this interpreter's packages plus two fake distributions, one requiring a missing
    package and one an installed package (click) in a version that is not installed."""
    for name, requires in (
        ("needsmissing", "no-such-dist-xyz>=1"),
        ("needsoldclick", "click<1"),
        ("happy", "click>=1"),
        ("onlyonwindows", "no-such-dist-xyz; sys_platform == 'win32'"),
    ):
        info = tmp_path / f"{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\nRequires-Dist: {requires}\n"
        )
    monkeypatch.syspath_prepend(str(tmp_path))
    from importlib.metadata import version

    unmet = {u.dist: u for u in packages.collect_packages().unmet}
    assert set(unmet) == {"needsmissing", "needsoldclick"}  # this interpreter itself passes `pip check`
    assert unmet["needsmissing"].installed is None and unmet["needsmissing"].requirement == "no-such-dist-xyz>=1"
    assert unmet["needsoldclick"].installed == version("click") and unmet["needsoldclick"].requirement_name == "click"


def test_long_variables_are_cut_in_the_summary_but_not_in_the_facts():
    from torchdoctor.env.view import _short

    constraint = "cuda>=12.4 " + " ".join(f"brand=tesla,driver>={n},driver<{n + 1}" for n in range(470, 560, 10))
    assert _short(constraint).endswith("...") and len(_short(constraint)) == 60
    assert _short("0,1") == "0,1"


def test_probe_imports_a_companion_built_for_another_variant(tmp_path, monkeypatch):
    other = "cu126" if __import__("torch").__version__.endswith("+cu130") else "cu130"  # a build torch is not
    fake = tmp_path / "torchvision"
    fake.mkdir()
    (fake / "version.py").write_text(f"__version__ = '0.28.0+{other}'\ngit_version = 'abc'\n")
    (fake / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    audio = tmp_path / "torchaudio"
    audio.mkdir()
    (audio / "version.py").write_text("__version__ = '%s'\n" % __import__("torch").__version__)  # same build
    (audio / "__init__.py").write_text("raise RuntimeError('same build: never imported')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    result = probe.RunningProbe(timeout=120, cwd=str(tmp_path)).result()
    assert result.ok and result.companion_errors == {
        "torchvision": "RuntimeError: operator torchvision::nms does not exist"
    }


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_limits_of_this_process_and_its_ancestors(tmp_path):
    write(tmp_path / "memory.max", "max\n")
    write(tmp_path / "job" / "memory.max", str(8 * 1024**3))
    write(tmp_path / "job" / "step" / "memory.max", str(2 * 1024**3))  # the tightest wins
    write(tmp_path / "job" / "step" / "memory.current", str(1024**3))
    write(tmp_path / "job" / "cpu.max", "150000 100000\n")
    limits = system.read_cgroup(tmp_path, "0::/job/step\n")
    assert (limits.cpus, limits.memory_limit, limits.memory_used) == (1.5, 2 * 1024**3, 1024**3)


def test_cgroup_v1_limits_and_unlimited(tmp_path):
    proc = "5:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n"
    write(tmp_path / "memory" / "docker" / "abc" / "memory.limit_in_bytes", str(2 * 1024**3))
    write(tmp_path / "memory" / "docker" / "abc" / "memory.usage_in_bytes", str(512 * 1024**2))
    write(tmp_path / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us", "200000")
    write(tmp_path / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_period_us", "100000")
    limits = system.read_cgroup(tmp_path, proc)
    assert (limits.cpus, limits.memory_limit, limits.memory_used) == (2.0, 2 * 1024**3, 512 * 1024**2)
    write(tmp_path / "memory" / "docker" / "abc" / "memory.limit_in_bytes", "9223372036854771712")
    write(tmp_path / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us", "-1")
    assert system.read_cgroup(tmp_path, proc) == system.CgroupLimits()  # no limits: the host's figures stand


def test_cache_folders_follow_the_variables(tmp_path):
    dirs = system.cache_dirs({"HF_HOME": str(tmp_path / "hf"), "XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert dirs["HF_HOME"] == str(tmp_path / "hf") and dirs["TORCH_HOME"] == str(tmp_path / "xdg" / "torch")
    assert system._existing(str(tmp_path / "not" / "yet")) == str(tmp_path)


def test_env_starts_its_probe_early_and_adopts_it_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    probe.start_early(["env", "--distributed"])
    probe.start_early(["lint", "x.py"])
    assert probe._EARLY == []  # only `env` on one machine starts early
    probe.start_early(["env", "--format", "json", "--timeout=30"])
    try:
        assert probe.adopt_early(60.0, str(tmp_path), None) is None  # started for other settings
        early = probe.adopt_early(30.0, str(tmp_path), None)
        assert early is not None and early.timeout == 30.0 and probe.adopt_early(30.0, str(tmp_path), None) is None
    finally:
        for p in [early, *probe._EARLY]:
            p._stop()
        probe._EARLY.clear()


def test_probe_splits_import_time_into_cpu_and_blocked_time(tmp_path, monkeypatch):
    """A torch that computes for 0.5 s of CPU time and sleeps 0.5 s: the split does not depend on how loaded
    the machine is (CPU time is CPU time; a sleep is never shorter), only the wall time does."""
    import pytest

    if not os.path.exists("/proc/self/schedstat"):
        pytest.skip("no per-thread scheduler statistics (not Linux)")
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "import time\nstart = time.process_time()\n"
        "while time.process_time() - start < 0.5:\n    pass\ntime.sleep(0.5)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    p = probe.RunningProbe(timeout=120, cwd=str(tmp_path)).result()
    assert not p.ok and p.error_type == "AttributeError"  # no __version__: not a working torch, but timed
    assert p.cpu_seconds >= 0.5 and p.blocked_seconds >= 0.45
