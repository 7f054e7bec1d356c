"""Every env check fires on a synthetic fact set that has its problem, and stays quiet on healthy ones."""

import dataclasses

import pytest
from env_fixtures import GiB, healthy_cpu_facts, healthy_gpu_facts, run_check

from torchdoctor import registry
from torchdoctor.env.facts import GpuFacts, GpuProcess, PathEntry
from torchdoctor.findings import Severity

ENV_CHECKS = [c.name for c in registry.all_checks(registry.Scope.ENV)]


@pytest.mark.parametrize("name", ENV_CHECKS)
@pytest.mark.parametrize("facts", [healthy_gpu_facts, healthy_cpu_facts], ids=["gpu-box", "cpu-box"])
def test_quiet_on_healthy_machines(name, facts):
    assert run_check(name, facts()) == []


def one(name, facts, severity=None):
    findings = run_check(name, facts)
    assert len(findings) == 1, findings
    f = findings[0]
    assert f.name == name and f.code == registry.get(name).code
    assert f.fix, "every finding says what to do"
    if severity is not None:
        assert f.severity == severity
    return f


# torch-import-failure ---------------------------------------------------------------------------


def test_import_failure_shadowed_by_a_folder(cpu_facts):
    cpu_facts.torch = dataclasses.replace(
        cpu_facts.torch,
        ok=False,
        error_type="ImportError",
        error="fake torch: broken on purpose",
        torch_file="/home/me/project/torch/__init__.py",
        version=None,
    )
    f = one("torch-import-failure", cpu_facts, Severity.ERROR)
    assert "/home/me/project/torch first" in f.message and "/site-packages/torch" in f.message
    assert "fake torch: broken on purpose" in f.message


def test_import_failure_missing_cuda_library(gpu_facts):
    gpu_facts.torch = dataclasses.replace(
        gpu_facts.torch,
        ok=False,
        error_type="ImportError",
        error="libcudnn.so.9: cannot open shared object file: No such file or directory",
    )
    f = one("torch-import-failure", gpu_facts)
    assert "libcudnn.so.9" in f.message
    assert (
        "pip install --force-reinstall torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124" in f.fix.title
    )


def test_import_failure_undefined_symbol(gpu_facts):
    gpu_facts.torch = dataclasses.replace(
        gpu_facts.torch,
        ok=False,
        error_type="ImportError",
        error="/site-packages/torch/lib/libtorch_cuda.so: undefined symbol: ncclCommRegister",
    )
    assert "mixed" in one("torch-import-failure", gpu_facts).message


def test_import_failure_hang(cpu_facts):
    cpu_facts.torch = dataclasses.replace(
        cpu_facts.torch,
        ok=False,
        timed_out=True,
        error_type="Timeout",
        error="`import torch` did not finish within 60 s",
        seconds=60.2,
        hang_stack=["/nfs/site/torch/_C.py:3 in <module>", "/nfs/site/torch/__init__.py:40 in <module>"],
    )
    f = one("torch-import-failure", cpu_facts)
    assert "hangs" in f.message and "importtime" in f.fix.title and "after 60 s" in f.message
    assert "at /nfs/site/torch/_C.py:3 in <module> (called from /nfs/site/torch/__init__.py:40" in f.message


def test_import_failure_hang_inside_a_shadowing_file(cpu_facts):
    cpu_facts.shadowing = [PathEntry(name="socket", path="/work/socket.py", origin_dir="/work")]
    cpu_facts.torch = dataclasses.replace(
        cpu_facts.torch,
        ok=False,
        timed_out=True,
        error_type="Timeout",
        seconds=60.0,
        hang_stack=["/work/socket.py:2 in <module>"],
    )
    f = one("torch-import-failure", cpu_facts)
    assert "hung in /work/socket.py" in f.message and f.fix.title.startswith("Rename /work/socket.py")


@pytest.mark.parametrize(
    "error", ["cannot import name 'deepcopy' from 'copy' (/work/copy.py)", "module 'copy' has no attribute 'deepcopy'"]
)
def test_import_failure_explained_by_a_shadowing_file_carries_its_fix(cpu_facts, error):
    cpu_facts.shadowing = [PathEntry(name="copy", path="/work/copy.py", origin_dir="/work")]
    cpu_facts.torch = dataclasses.replace(cpu_facts.torch, ok=False, error_type="ImportError", error=error)
    f = one("torch-import-failure", cpu_facts)
    assert "Cause: /work/copy.py shadows the module `copy` that torch imports" in f.message
    assert f.fix.title.startswith("Rename /work/copy.py") and "reinstall" not in f.fix.title


def test_import_failure_without_a_known_cause_proposes_no_reinstall(cpu_facts):
    """An unknown is unknown: nothing in "bad ELF" points at the install, so no reinstall is guessed."""
    cpu_facts.torch = dataclasses.replace(cpu_facts.torch, ok=False, error_type="OSError", error="bad ELF")
    f = one("torch-import-failure", cpu_facts)
    assert "OSError: bad ELF" in f.message and "no known cause matched" in f.message
    assert "reinstall" not in f.fix.title.replace("a reinstall is no answer", "")
    assert '/usr/bin/python3 -X faulthandler -c "import torch"' in f.fix.title


def failed(facts, error_type, error, **probe):
    facts.torch = dataclasses.replace(facts.torch, ok=False, error_type=error_type, error=error, version=None, **probe)
    return one("torch-import-failure", facts, Severity.ERROR)


def test_import_failure_errno_names_the_file_system_and_the_variable(cpu_facts):
    cpu_facts.env_vars["TMPDIR"] = "/mnt/ro/tmp"
    f = failed(
        cpu_facts,
        "OSError",
        "[Errno 30] Read-only file system: '/mnt/ro/tmp/torch_cache.lock'",
        error_errno=30,
        error_filename="/mnt/ro/tmp/torch_cache.lock",
    )
    assert "/mnt/ro/tmp is on a read-only file system (EROFS), set by TMPDIR" in f.message
    assert "`mkdir -p $HOME/tmpdir && export TMPDIR=$HOME/tmpdir`" in f.fix.title and "reinstall" not in f.fix.title
    f = failed(
        healthy_cpu_facts(),
        "OSError",
        "[Errno 28] No space left on device: '/data/cache/x.bin'",
        error_errno=28,
        error_filename="/data/cache/x.bin",
    )
    assert "the file system holding /data/cache is full (ENOSPC)" in f.message and "df -h /data/cache" in f.fix.title


def test_import_failure_permission_denied_inside_torchs_folder(cpu_facts):
    f = failed(
        cpu_facts,
        "PermissionError",
        "[Errno 13] Permission denied: '/site-packages/torch/_C.so'",
        error_errno=13,
        error_filename="/site-packages/torch/_C.so",
    )
    assert "this user may not access /site-packages/torch/_C.so (EACCES); it lives in torch's own folder" in f.message
    assert f.fix.title.endswith("`chmod -R a+rX /site-packages/torch`")


def test_import_failure_killed_by_a_containers_memory_limit(cpu_facts):
    cpu_facts.system.cgroup_memory_limit, cpu_facts.system.cgroup_memory_used = 2 * GiB, 2 * GiB - 4096
    f = failed(
        cpu_facts,
        "ProbeFailed",
        "the Python process that imported torch exited with status -9: no output",
        exit_signal=9,
    )
    assert "the container's memory limit (2 GiB" in f.message and "SIGKILL" in f.message
    assert "--memory" in f.fix.title


def test_import_failure_open_files_limit_with_a_low_hard_limit(cpu_facts):
    f = failed(
        cpu_facts,
        "OSError",
        "[Errno 24] Too many open files: '/site-packages/torch/lib'",
        error_errno=24,
        limits={"Max open files": [64, 64]},
    )
    assert "RLIMIT_NOFILE = 64 (`ulimit -n`)" in f.message and "hard limit is 64 too" in f.fix.title


def test_import_failure_from_a_library_on_ld_preload(cpu_facts):
    from torchdoctor.env.facts import LibraryCopy

    cpu_facts.env_vars["LD_PRELOAD"] = "/opt/tools/libjemalloc.so.2 /opt/old/libgomp.so.1"
    cpu_facts.libraries = [
        LibraryCopy("/opt/tools/libjemalloc.so.2", "LD_PRELOAD", "/opt/tools/libjemalloc.so.2"),
        LibraryCopy("/opt/old/libgomp.so.1", "LD_PRELOAD", "/opt/old/libgomp.so.1"),
    ]
    f = failed(
        cpu_facts,
        "OSError",
        "/site-packages/torch/lib/libtorch_cpu.so: undefined symbol: omp_get_max_active_levels, version GOMP_4.5",
    )
    assert "Cause: /opt/old/libgomp.so.1 (from LD_PRELOAD) lacks a symbol torch needs" in f.message
    assert f.fix.title.endswith("`export LD_PRELOAD=/opt/tools/libjemalloc.so.2`")


def test_import_failure_cuda_build_without_a_driver_installs_the_cpu_build(cpu_facts):
    cpu_facts.torch_dist_version, cpu_facts.torch_dist_cuda = "2.13.0+cu130", "13.0"
    f = failed(cpu_facts, "OSError", "libcudnn.so.9: cannot open shared object file: No such file or directory")
    assert "is a CUDA build and libcudnn.so.9 is missing, on a machine without an NVIDIA driver" in f.message
    assert "--index-url https://download.pytorch.org/whl/cpu" in f.fix.title and "cu13" not in f.fix.title


def test_import_failure_damaged_file_in_torchs_own_folder_is_a_reinstall(gpu_facts):
    f = failed(gpu_facts, "OSError", "/site-packages/torch/lib/libtorch_cuda.so: file too short")
    assert "a file of torch's own install, is damaged" in f.message
    assert "install --force-reinstall torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124" in f.fix.title


def test_import_failure_from_a_module_copy_on_pythonpath(cpu_facts):
    """Not a shadowing name torchdoctor lists, not in pip's metadata: the path in the error says where it lives."""
    cpu_facts.env_vars["PYTHONPATH"] = "/home/me/vendored:/home/me/lib"
    cpu_facts.torch_dist_requirements = {"typing-extensions": ">=4.10.0"}
    f = failed(
        cpu_facts,
        "ImportError",
        "cannot import name 'deprecated' from 'typing_extensions' (/home/me/vendored/typing_extensions.py)",
    )
    assert (
        "Python finds typing_extensions at /home/me/vendored/typing_extensions.py, in the PYTHONPATH folder "
        "/home/me/vendored"
        in f.message
        and "(torch requires typing-extensions>=4.10.0)" in f.message
    )
    assert f.fix.title.endswith("`export PYTHONPATH=/home/me/lib`")


def test_import_failure_conda_environments_old_libstdcxx(cpu_facts):
    """The loader found the conda environment's libstdc++ (python's RPATH), older than torch's wheel needs."""
    cpu_facts.env_vars["CONDA_PREFIX"] = "/opt/conda/envs/train"
    f = failed(
        cpu_facts,
        "ImportError",
        "/opt/conda/envs/train/lib/libstdc++.so.6: version `GLIBCXX_3.4.30' not "
        "found (required by /site-packages/torch/lib/libtorch_cpu.so)",
    )
    assert (
        "Cause: /opt/conda/envs/train/lib/libstdc++.so.6 is older than torch needs: it lacks GLIBCXX_3.4.30"
        in f.message
        and "it comes from the conda environment /opt/conda/envs/train" in f.message
    )
    assert f.fix.title.endswith("`conda install -p /opt/conda/envs/train -c conda-forge libstdcxx-ng`")


# slow-torch-import ------------------------------------------------------------------------------


def test_slow_torch_import_judges_cpu_and_file_time_not_wall_time(cpu_facts):
    assert run_check("slow-torch-import", cpu_facts) == []  # 2 s
    probe = cpu_facts.torch
    probe.seconds, probe.cpu_seconds, probe.cpu_wait_seconds, probe.blocked_seconds = 31.0, 1.9, 28.5, 0.6
    [note] = run_check("slow-torch-import", cpu_facts)  # a loaded machine: a note, no warning
    assert note.severity == Severity.INFO and "the machine is loaded: it waited 28 s for a CPU" in note.message
    probe.seconds, probe.cpu_wait_seconds, probe.blocked_seconds = 31.0, 0.2, 28.9  # an NFS mount
    f = one("slow-torch-import", cpu_facts, Severity.WARNING)
    assert "spent 29 s waiting for its files" in f.message and "local disk" in f.fix.title
    probe.cpu_seconds, probe.blocked_seconds = 29.0, 1.8  # a sitecustomize computing
    assert "used 29 s of CPU time" in one("slow-torch-import", cpu_facts, Severity.WARNING).message
    probe.cpu_seconds, probe.seconds = 9.5, 11.0
    assert run_check("slow-torch-import", cpu_facts) == []


def test_slow_torch_import_without_scheduler_statistics_trusts_off_cpu_time_only_on_an_idle_machine(cpu_facts):
    probe = cpu_facts.torch
    probe.seconds, probe.cpu_seconds, probe.cpu_wait_seconds, probe.blocked_seconds = 31.0, 2.0, None, None
    cpu_facts.system.load_average = 0.5
    assert "waiting for its files" in one("slow-torch-import", cpu_facts).message
    cpu_facts.system.load_average = 9.0  # busy: the off-CPU time may be waiting for a CPU
    assert run_check("slow-torch-import", cpu_facts) == []


def test_import_failure_not_installed(cpu_facts):
    cpu_facts.torch = dataclasses.replace(
        cpu_facts.torch,
        ok=False,
        error_type="ModuleNotFoundError",
        error="No module named 'torch'",
        torch_file=None,
        version=None,
    )
    cpu_facts.torch_dist_version = cpu_facts.torch_dist_location = None
    f = one("torch-import-failure", cpu_facts)
    assert "not installed" in f.message and "/usr/bin/python3 -m pip install torch " in f.fix.title


# cpu-only-build ---------------------------------------------------------------------------------


def test_cpu_build_with_driver_present(gpu_facts):
    gpu_facts.torch = dataclasses.replace(gpu_facts.torch, version="2.5.1+cpu", cuda=None, arch_list=[])
    f = one("cpu-only-build", gpu_facts, Severity.ERROR)
    assert "GPU0 NVIDIA A100-SXM4-80GB" in f.message and "550.54.15" in f.message
    assert f.fix.title.endswith("torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124")


def test_cpu_build_with_only_a_toolkit_is_info(cpu_facts):
    cpu_facts.toolkit = dataclasses.replace(cpu_facts.toolkit, nvcc_path="/usr/local/bin/nvcc", nvcc_version="13.0")
    f = one("cpu-only-build", cpu_facts, Severity.INFO)
    assert "nvcc 13.0" in f.message


# gpu-arch-unsupported ---------------------------------------------------------------------------


def test_blackwell_gpu_against_an_arch_list_without_it(gpu_facts):
    gpu_facts.nvidia.gpus = [GpuFacts(index=0, name="NVIDIA GeForce RTX 5090", capability=(12, 0))]
    gpu_facts.nvidia.driver_cuda = "12.8"
    f = one("gpu-arch-unsupported", gpu_facts, Severity.ERROR)
    assert "sm_120" in f.message and "no kernel image is available" in f.message
    assert "CUDA ≥ 12.8" in f.fix.title and "whl/cu128" in f.fix.title


@pytest.mark.parametrize(
    "cc, archs",
    [
        ((8, 6), ["sm_80"]),  # same major, higher minor runs sm_80 SASS
        ((12, 0), ["sm_90", "compute_90"]),  # PTX JIT from compute_90
    ],
)
def test_covered_architectures_are_quiet(gpu_facts, cc, archs):
    gpu_facts.torch.arch_list = archs
    for gpu in gpu_facts.nvidia.gpus:
        gpu.capability = cc
    assert run_check("gpu-arch-unsupported", gpu_facts) == []


def test_arch_specific_sass_does_not_cover_newer_minor(gpu_facts):
    gpu_facts.torch.arch_list = ["sm_90a"]
    gpu_facts.nvidia.gpus = [GpuFacts(index=0, name="H100", capability=(9, 0))]
    assert len(run_check("gpu-arch-unsupported", gpu_facts)) == 1


# driver-too-old ---------------------------------------------------------------------------------


def test_470_driver_under_a_cuda_12_build(gpu_facts):
    gpu_facts.nvidia.driver_version, gpu_facts.nvidia.driver_cuda = "470.182.03", "11.4"
    f = one("driver-too-old", gpu_facts, Severity.ERROR)
    assert "470.182.03" in f.message and "525.60.13" in f.message and "11.4" in f.message
    assert "whl/cu118" in f.fix.title


def test_driver_version_alone_when_nvml_lacks_the_cuda_version(gpu_facts):
    gpu_facts.nvidia.driver_version, gpu_facts.nvidia.driver_cuda = "470.182.03", None
    assert len(run_check("driver-too-old", gpu_facts)) == 1


def test_minor_version_compatibility_is_fine(gpu_facts):
    gpu_facts.nvidia.driver_version, gpu_facts.nvidia.driver_cuda = "535.104.05", "12.2"  # runs cu124
    assert run_check("driver-too-old", gpu_facts) == []


# cuda-toolkit-mismatch --------------------------------------------------------------------------


def test_toolkit_major_differs_is_info(gpu_facts):
    gpu_facts.toolkit.nvcc_version = "11.8"
    f = one("cuda-toolkit-mismatch", gpu_facts, Severity.INFO)
    assert "nvcc 11.8" in f.message and "CUDA 12.4" in f.message


def test_toolkit_mismatch_is_a_warning_when_cuda_home_points_at_it(gpu_facts):
    gpu_facts.toolkit.nvcc_version, gpu_facts.toolkit.cuda_home_from_env = "13.0", True
    one("cuda-toolkit-mismatch", gpu_facts, Severity.WARNING)


# companion-version-mismatch ---------------------------------------------------------------------


def test_torchvision_for_another_torch(cpu_facts):
    cpu_facts.packages["torchvision"] = "0.29.2"
    cpu_facts.torch_requirements["torchvision"] = ">=2.14.0"
    f = one("companion-version-mismatch", cpu_facts, Severity.ERROR)
    assert (
        "torchvision 0.29.2 does not go with torch 2.13.0+cpu: it requires torch>=2.14.0; it is the release"
        in f.message
        and " and " not in f.message.split(";")[0]
    )  # one clause each, not four chained with "and"
    assert "torchvision::nms does not exist" in f.message
    assert (
        '/usr/bin/python3 -m pip install "torch==2.13.0" "torchvision==0.28.*" '
        "--index-url https://download.pytorch.org/whl/cpu"
    ) in f.fix.title


def test_pypi_cuda_torchvision_on_a_cpu_torch(cpu_facts, monkeypatch):
    """The explain page's Bad example: a plain PyPI torchvision (a CUDA build on Linux) next to a +cpu torch,
    confirmed by the probe's failed import."""
    import platform

    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    cpu_facts.packages["torchvision"] = "0.28.0"
    cpu_facts.torch.companion_errors = {"torchvision": "RuntimeError: operator torchvision::nms does not exist"}
    f = one("companion-version-mismatch", cpu_facts, Severity.ERROR)
    assert "is a PyPI (CUDA) build while torch is +cpu" in f.message
    assert "Importing it fails: RuntimeError: operator torchvision::nms does not exist" in f.message
    cpu_facts.packages["torchvision"] = "0.28.0+cpu"
    cpu_facts.torch.companion_errors = {}
    assert run_check("companion-version-mismatch", cpu_facts) == []


def test_no_torchaudio_exists_for_this_torch(cpu_facts):
    cpu_facts.packages["torchaudio"] = "2.11.0+cpu"
    f = one("companion-version-mismatch", cpu_facts)
    assert "no torchaudio release exists for torch 2.13" in f.message and "2.13.*" not in f.fix.title
    assert "-m pip uninstall torchaudio" in f.fix.title


def test_torch_newer_than_the_release_table_says_matching(cpu_facts):
    cpu_facts.torch_dist_version = cpu_facts.torch.version = "2.99.0+cpu"
    cpu_facts.packages.update(torch="2.99.0+cpu", torchvision="0.28.0+cu130")
    f = one("companion-version-mismatch", cpu_facts)
    assert "0.114" not in f.fix.title and "matching torch 2.99.0" in f.fix.title


def test_release_table_covers_the_installed_torch():
    """Kept in step: every torch 2.m up to the one installed here has a row (checked against PyPI's releases:
    torchvision 0.(m+15) for every m, torchaudio up to 2.11, torchtext up to 0.18)."""
    from importlib.metadata import version

    from torchdoctor.checks.companion_version_mismatch import COMPANION_RELEASES

    minor = int(version("torch").split(".")[1])
    assert all(m in COMPANION_RELEASES for m in range(minor + 1))
    assert COMPANION_RELEASES[5] == {"torchvision": "0.20", "torchaudio": "2.5", "torchtext": None}
    assert COMPANION_RELEASES[13]["torchaudio"] is None and COMPANION_RELEASES[3]["torchtext"] == "0.18"


def test_unmet_requirements(cpu_facts):
    from torchdoctor.env.facts import UnmetRequirement

    assert run_check("unmet-requirement", cpu_facts) == []
    cpu_facts.unmet_requirements = [
        UnmetRequirement("transformers", "4.48.0", "tokenizers<0.22,>=0.21", "0.22.1"),
        UnmetRequirement("timm", "1.0", "huggingface_hub", None),
    ]
    f = one("unmet-requirement", cpu_facts, Severity.WARNING)
    assert "transformers 4.48.0 requires tokenizers<0.22,>=0.21, but tokenizers 0.22.1 is installed" in f.message
    assert "timm 1.0 requires huggingface_hub, but it is not installed" in f.message
    assert f.fix.title == ('/usr/bin/python3 -m pip install "huggingface_hub" "tokenizers<0.22,>=0.21" "torch==2.13.0"')


def test_an_old_torchvision_is_one_finding_with_pip_checks_complaint_as_evidence(cpu_facts):
    """One cause, one finding: lightning's unmet torchvision requirement is the same old torchvision that
    companion-version-mismatch reports, so unmet-requirement leaves it out and the companion finding quotes it."""
    from torchdoctor.env.facts import UnmetRequirement

    cpu_facts.packages["torchvision"] = "0.20.1+cpu"
    cpu_facts.unmet_requirements = [
        UnmetRequirement("lightning", "2.5.0", "torchvision>=0.21", "0.20.1+cpu"),
        UnmetRequirement("timm", "1.0", "huggingface_hub", None),
    ]
    f = one("companion-version-mismatch", cpu_facts)
    assert "Also (pip check): lightning 2.5.0 requires torchvision>=0.21." in f.message
    unmet = one("unmet-requirement", cpu_facts)
    assert "torchvision" not in unmet.message and "timm 1.0 requires huggingface_hub" in unmet.message
    cpu_facts.unmet_requirements = cpu_facts.unmet_requirements[:1]
    assert run_check("unmet-requirement", cpu_facts) == []


def test_cuda_variant_mismatch(gpu_facts):
    gpu_facts.packages["torchaudio"] = "2.5.1+cu121"
    f = one("companion-version-mismatch", gpu_facts)
    assert "+cu121 build while torch is +cu124" in f.message


# numpy-problem ----------------------------------------------------------------------------------


def test_numpy_missing(cpu_facts):
    del cpu_facts.packages["numpy"]
    assert "Failed to initialize NumPy" in one("numpy-problem", cpu_facts, Severity.WARNING).message


def test_numpy_2_with_packages_pinned_below_2(cpu_facts):
    cpu_facts.numpy_requirements = {"opencv-python": "<2", "scipy": ">=1.22"}
    f = one("numpy-problem", cpu_facts)
    assert "opencv-python (numpy<2)" in f.message and "NumPy 1.x" in f.message and "scipy" not in f.message
    assert f.fix.title.startswith('/usr/bin/python3 -m pip install "numpy<2" "torch==2.13.0"')


def test_numpy_1_with_packages_requiring_numpy_2(cpu_facts):
    cpu_facts.packages["numpy"] = "1.26.4"
    cpu_facts.numpy_requirements = {"opencv-python": "<2", "scikit-learn": ">=2.0"}
    f = one("numpy-problem", cpu_facts)
    assert "scikit-learn (numpy>=2.0) exclude it" in f.message and "opencv" not in f.message
    assert '-m pip install "numpy>=2" "torch==2.13.0"' in f.fix.title


def test_numpy_every_package_accepts_is_quiet(cpu_facts):
    cpu_facts.numpy_requirements = {"scipy": ">=1.22", "pandas": ">=1.26,<3"}
    assert run_check("numpy-problem", cpu_facts) == []


def test_numpy_bridge_broken(cpu_facts):
    cpu_facts.torch.numpy_error = "RuntimeError: Numpy is not available"
    assert "Numpy is not available" in one("numpy-problem", cpu_facts).message


def test_a_numpy_abi_error_that_breaks_import_torch_is_one_finding(cpu_facts):
    """The ABI error is torch-import-failure's cause: numpy-problem does not repeat it with the same command."""
    abi = "A module that was compiled using NumPy 1.x cannot be run in NumPy 2.4.6 as it may crash."
    cpu_facts.torch = dataclasses.replace(
        cpu_facts.torch,
        ok=False,
        error_type="ImportError",
        error="numpy.core.multiarray failed to import",
        stderr_tail=[abi],
    )
    f = one("torch-import-failure", cpu_facts)
    assert "Cause: a NumPy ABI mismatch" in f.message and '"numpy<2"' in f.fix.title
    assert run_check("numpy-problem", cpu_facts) == []
    cpu_facts.torch = dataclasses.replace(cpu_facts.torch, ok=True, error_type=None, error=None)
    assert "compiled using NumPy 1.x" in one("numpy-problem", cpu_facts).message  # torch imports: its own finding


# module-shadowing -------------------------------------------------------------------------------


def test_numpy_py_in_the_working_directory(cpu_facts):
    cpu_facts.shadowing = [PathEntry(name="numpy", path="/work/numpy.py", origin_dir="/work")]
    f = one("module-shadowing", cpu_facts, Severity.ERROR)
    assert "/work/numpy.py" in f.message and f.location.file == "/work/numpy.py"


# cuda-visible-devices ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, words",
    [
        ("0,x,1", "invalid entry 'x'"),
        ("GPU-00000001, GPU-00000000", "invalid entry ' GPU-00000000'"),
        ("0,0", "twice"),
        ("1,5", "names 5"),
        ("GPU-ffffffff", "names GPU-ffffffff"),
    ],
)
def test_bad_cuda_visible_devices(gpu_facts, value, words):
    gpu_facts.env_vars["CUDA_VISIBLE_DEVICES"] = value
    assert words in one("cuda-visible-devices", gpu_facts, Severity.WARNING).message


@pytest.mark.parametrize("value", ["GPU-00000001", "1, 0", "0,1"])
def test_valid_cuda_visible_devices(gpu_facts, value):
    gpu_facts.env_vars["CUDA_VISIBLE_DEVICES"] = value
    assert run_check("cuda-visible-devices", gpu_facts) == []


def test_all_gpus_hidden_is_only_info(gpu_facts):
    gpu_facts.env_vars["CUDA_VISIBLE_DEVICES"] = ""
    one("cuda-visible-devices", gpu_facts, Severity.INFO)


def test_mixed_gpu_models_without_pci_order(gpu_facts):
    gpu_facts.nvidia.gpus[1].name = "NVIDIA GeForce RTX 3090"
    f = one("cuda-visible-devices", gpu_facts)
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in f.fix.title
    gpu_facts.env_vars["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    assert run_check("cuda-visible-devices", gpu_facts) == []


# gpu-memory-held --------------------------------------------------------------------------------


def test_dead_pid_holding_gpu_memory(gpu_facts):
    gpu_facts.nvidia.gpus[0].processes = [GpuProcess(pid=4242, used_bytes=3 * GiB, alive=False)]
    f = one("gpu-memory-held", gpu_facts, Severity.WARNING)
    assert "pid 4242" in f.message and "3 GiB" in f.message and "no longer exists" in f.message
    assert "fuser" in f.fix.title and f.location.device == "GPU0"


def test_zombie_and_orphan(gpu_facts):
    gpu_facts.nvidia.gpus[0].processes = [
        GpuProcess(pid=10, used_bytes=GiB, alive=False, status="zombie", parent_pid=9),
        GpuProcess(
            pid=11,
            used_bytes=GiB,
            alive=True,
            status="sleeping",
            parent_pid=1,
            orphaned=True,
            command="/usr/bin/python train.py",
            user="me",
        ),
        GpuProcess(
            pid=12,
            used_bytes=GiB,
            alive=True,
            status="sleeping",
            parent_pid=1,
            orphaned=False,
            command="nohup python serve.py",
            user="me",
        ),
    ]
    findings = run_check("gpu-memory-held", gpu_facts)
    assert [("zombie" in f.message, "orphaned" in f.message) for f in findings] == [
        (True, False),
        (False, True),
        (False, False),
    ]  # the nohup job is only listed, as info
    assert findings[2].severity == Severity.INFO and "pid 12" in findings[2].message
    assert "kill 9" in findings[0].fix.title and "kill 11" in findings[1].fix.title


def test_other_live_processes_are_info(gpu_facts):
    gpu_facts.nvidia.gpus[1].processes = [
        GpuProcess(pid=77, used_bytes=10 * GiB, alive=True, parent_pid=70, user="alice", command="python serve.py")
    ]
    f = one("gpu-memory-held", gpu_facts, Severity.INFO)
    assert "alice" in f.message and "10 GiB" in f.message


def test_pids_of_another_namespace_are_not_called_dead(gpu_facts):
    gpu_facts.nvidia.gpus[0].processes = [GpuProcess(pid=31337, used_bytes=GiB, alive=None)]
    assert "no longer exists" not in one("gpu-memory-held", gpu_facts, Severity.INFO).message


# shm-too-small ----------------------------------------------------------------------------------


def test_docker_default_64_mib_shm(cpu_facts):
    cpu_facts.system.shm_total = 64 * 1024**2
    f = one("shm-too-small", cpu_facts, Severity.WARNING)
    assert "64 MiB" in f.message and "Bus error" in f.message and "--shm-size" in f.fix.title


# thread-oversubscription ------------------------------------------------------------------------


def test_threads_times_local_processes_exceed_cores(cpu_facts):
    cpu_facts.torch.num_threads = 2
    cpu_facts.env_vars.update(LOCAL_WORLD_SIZE="4", OMP_NUM_THREADS="2")
    f = one("thread-oversubscription", cpu_facts, Severity.WARNING)
    assert "8 threads on 2 usable CPU(s)" in f.message


def test_container_quota_smaller_than_host_cores(gpu_facts):
    gpu_facts.system.cgroup_cpu_limit = 4.0
    f = one("thread-oversubscription", gpu_facts)
    assert "container quota of 4 CPUs" in f.message and "OMP_NUM_THREADS=4" in f.fix.title


def test_omp_unset_with_several_local_processes(gpu_facts):
    gpu_facts.torch.num_threads = 1
    gpu_facts.env_vars["LOCAL_WORLD_SIZE"] = "8"
    assert "OMP_NUM_THREADS is unset" in one("thread-oversubscription", gpu_facts).message


# duplicate-openmp -------------------------------------------------------------------------------


def test_two_openmp_runtimes(cpu_facts):
    cpu_facts.torch.openmp_runtimes = ["/site-packages/torch/lib/libgomp.so.1", "/conda/lib/libiomp5.so"]
    f = one("duplicate-openmp", cpu_facts, Severity.WARNING)
    assert "libiomp5.so" in f.message and "OMP: Error #15" in f.message and "LD_PRELOAD" not in f.fix.title


def test_two_openmp_runtimes_because_of_ld_preload(cpu_facts):
    cpu_facts.torch.openmp_runtimes = ["/site-packages/torch/lib/libgomp.so.1", "/opt/intel/lib/libiomp5.so"]
    cpu_facts.env_vars["LD_PRELOAD"] = "/usr/lib/libtcmalloc.so /opt/intel/lib/libiomp5.so"
    f = one("duplicate-openmp", cpu_facts)
    assert (
        "LD_PRELOAD=/usr/lib/libtcmalloc.so /opt/intel/lib/libiomp5.so forces /opt/intel/lib/libiomp5.so" in f.message
    )
    assert f.fix.title.startswith("Take /opt/intel/lib/libiomp5.so out of LD_PRELOAD")


# gpu-health -------------------------------------------------------------------------------------


def test_gpu_health_problems(gpu_facts):
    g0, g1 = gpu_facts.nvidia.gpus
    g0.ecc_uncorrected = 3
    g0.throttle_reasons = ["hardware thermal slowdown"]
    g1.persistence_mode = False
    g1.utilization = 100
    g1.processes = [GpuProcess(pid=5, used_bytes=GiB, alive=True, parent_pid=4, user="bob", command="python x.py")]
    findings = run_check("gpu-health", gpu_facts)
    messages = " | ".join(f.message for f in findings)
    assert "3 uncorrected ECC" in messages and "thermal slowdown" in messages
    assert "100% busy" in messages and "persistence mode off" in messages
    assert [f.severity for f in findings] == [Severity.WARNING] * 3 + [Severity.INFO]


# low-resources ----------------------------------------------------------------------------------


def test_little_ram_and_disk(cpu_facts):
    cpu_facts.system.memory_available = 512 * 1024**2
    cpu_facts.system.disk_free = 287 * 1024**2
    findings = run_check("low-resources", cpu_facts)
    assert len(findings) == 2
    assert "512 MiB" in findings[0].message and "287 MiB" in findings[1].message


# determinism-settings ---------------------------------------------------------------------------


def test_malformed_cublas_workspace_config(gpu_facts):
    gpu_facts.env_vars["CUBLAS_WORKSPACE_CONFIG"] = "4096:8"
    one("determinism-settings", gpu_facts, Severity.WARNING)


def test_reproducibility_intent_without_cublas_config(gpu_facts):
    gpu_facts.env_vars["PYTHONHASHSEED"] = "0"
    f = one("determinism-settings", gpu_facts, Severity.INFO)
    assert "CUBLAS_WORKSPACE_CONFIG=:4096:8" in f.fix.title
    gpu_facts.env_vars["CUBLAS_WORKSPACE_CONFIG"] = ":16:8"
    assert run_check("determinism-settings", gpu_facts) == []


def test_a_crashing_check_becomes_one_internal_error(cpu_facts):
    cpu_facts.system = None  # a collector bug: the checks that read system facts must not take env down
    findings = run_check("shm-too-small", cpu_facts)
    assert len(findings) == 1 and "failed internally" in findings[0].message


def test_a_stopped_process_is_named_stopped(gpu_facts):
    gpu_facts.nvidia.gpus[1].processes = [
        GpuProcess(pid=78, used_bytes=2 * GiB, alive=True, status="stopped", parent_pid=70, command="python train.py")
    ]
    assert "pid 78" in one("gpu-memory-held", gpu_facts, Severity.INFO).message
    assert "stopped (Ctrl-Z" in one("gpu-memory-held", gpu_facts, Severity.INFO).message


# machine: cgroup memory, /dev/shm free, cache folders, open files, variables ------------------------


def test_container_memory_limit_replaces_the_hosts(cpu_facts):
    cpu_facts.system.memory_total, cpu_facts.system.memory_available = 64 * GiB, 60 * GiB
    cpu_facts.system.cgroup_memory_limit, cpu_facts.system.cgroup_memory_used = 2 * GiB, int(1.7 * GiB)
    f = one("low-resources", cpu_facts)
    assert (
        "Only 307.2 MiB of the 2 GiB this container may use (its cgroup memory limit; the host has 64 GiB)" in f.message
    )
    assert "--memory" in f.fix.title
    cpu_facts.system.cgroup_memory_used = GiB // 4  # 1.75 GiB left of 2: fine
    assert run_check("low-resources", cpu_facts) == []


def test_cache_folder_nearly_full(cpu_facts):
    cpu_facts.system.cache_free = {"HF_HOME": ("/home/me/.cache/huggingface", GiB // 2), "TMPDIR": ("/tmp", 40 * GiB)}
    f = one("low-resources", cpu_facts)
    assert "for HF_HOME (/home/me/.cache/huggingface)" in f.message and "export HF_HOME=" in f.fix.title


def test_shm_large_but_nearly_full(cpu_facts):
    cpu_facts.system.shm_free = 300 * 1024**2
    f = one("shm-too-small", cpu_facts)
    assert "is 12 GiB but only 300 MiB is free" in f.message
    cpu_facts.system.shm_free = 11 * GiB
    assert run_check("shm-too-small", cpu_facts) == []


@pytest.mark.parametrize(
    "soft, hard, severity",
    [
        (256, 4096, Severity.WARNING),
        (1024, 1048576, Severity.INFO),
        (1024, 1024, None),
        (65536, 65536, None),
        (None, None, None),
    ],
)
def test_open_files_limit(cpu_facts, soft, hard, severity):
    cpu_facts.system.open_files_soft, cpu_facts.system.open_files_hard = soft, hard
    findings = run_check("open-files-limit", cpu_facts)
    assert [f.severity for f in findings] == ([severity] if severity else [])
    if soft == 256:
        assert "ulimit -n 4096" in findings[0].fix.title and "received 0 items of ancdata" in findings[0].message


@pytest.mark.parametrize(
    "variables, expected",
    [
        ({"CUDA_LAUNCH_BLOCKING": "1"}, ["CUDA_LAUNCH_BLOCKING=1 is set"]),
        (
            {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segment:true"},
            ["unknown option 'expandable_segment' (did you mean expandable_segments?)"],
        ),
        ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb=128"}, ["'max_split_size_mb=128' is not key:value"]),
        ({"PYTORCH_ALLOC_CONF": "expandable_segments:yes"}, ["'yes' is not a valid value for expandable_segments"]),
        ({"OMP_NUM_THREADS": "auto"}, ["OMP_NUM_THREADS='auto' is not a positive whole number"]),
        ({"OMP_NUM_THREADS": ""}, ["OMP_NUM_THREADS='' is not"]),
        # must NOT flag
        (
            {
                "CUDA_LAUNCH_BLOCKING": "0",
                "OMP_NUM_THREADS": "8",
                "MKL_NUM_THREADS": "4,2",
                "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:128,"
                "roundup_power2_divisions:[256:1,512:2,>:8],garbage_collection_threshold:0.6",
            },
            [],
        ),
        ({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, []),
    ],
)
def test_env_var_misconfigured(cpu_facts, variables, expected):
    cpu_facts.env_vars.update(variables)
    findings = run_check("env-var-misconfigured", cpu_facts)
    assert len(findings) == len(expected) and all(e in f.message for e, f in zip(expected, findings))
    if "ALLOC_CONF" in str(variables) and expected:
        assert findings[0].severity == Severity.ERROR
