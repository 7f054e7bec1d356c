"""Environment checks about the torch install itself: does it import, is it the right build for the
GPUs and driver, do its companions and NumPy match it."""
from __future__ import annotations

import os
import re
from typing import Iterator, Optional

from torchdoctor.env.facts import EnvFacts
from torchdoctor.findings import Finding, Location, Severity
from torchdoctor.registry import Scope, check

from ._envutil import (
    base_version, best_wheel_cuda, has_nvidia, local_tag, major_minor, pip_install,
)

# Oldest Linux driver that runs any CUDA runtime of a major version (minor-version compatibility).
MIN_DRIVER = {10: "410.48", 11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
# The CUDA version that first compiled for a compute capability (what a wheel must be built with).
FIRST_CUDA_FOR_CC = {(12, 0): (12, 8), (10, 0): (12, 8), (9, 0): (11, 8), (8, 9): (11, 8),
                     (8, 7): (11, 4), (8, 6): (11, 1), (8, 0): (11, 0), (7, 5): (10, 0)}
# torchvision/torchtext 0.(m+15) and torchaudio 2.m go with torch 2.m.
COMPANION_MINOR_OFFSET = {"torchvision": (0, 15), "torchtext": (0, 15), "torchaudio": (2, 0)}


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


@check(code="TD101", name="torch-import-failure", scope=Scope.ENV, severity="error",
       summary="`import torch` fails or hangs; names the likely cause.")
def torch_import_failure(facts: EnvFacts) -> Iterator[Finding]:
    probe = facts.torch
    if probe.ok:
        return
    error = f"{probe.error_type}: {probe.error}" if probe.error_type else (probe.error or "unknown error")
    installed = facts.torch_dist_location
    text = " ".join([error, *probe.traceback_tail, *probe.stderr_tail])
    reinstall = pip_install(facts, major_minor(facts.torch_cuda))
    where = Location(file=probe.torch_file) if probe.torch_file else None
    if probe.timed_out:
        cause = "it hung"
        fix = ("See where it stops: `python -X importtime -c \"import torch\" 2>&1 | tail` or "
               "`py-spy dump --pid <pid>` while it hangs. Usual culprits: torch on a slow network "
               "filesystem, a sitecustomize/usercustomize doing I/O, a stale lock in ~/.cache.")
    elif probe.torch_file and installed and not probe.torch_file.startswith(installed.rstrip("/") + "/"):
        cause = f"Python found {probe.torch_file} first, not the installed torch in {installed}"
        found = os.path.dirname(probe.torch_file) if probe.torch_file.endswith("__init__.py") else probe.torch_file
        fix = f"Rename or move {found} (or take its folder off PYTHONPATH), and delete the __pycache__ beside it."
    elif facts.torch_dist_version is None and ("No module named 'torch'" in text or probe.torch_file):
        cause = f"torch is not installed for {facts.system.python_executable or 'this Python'}"
        cuda = best_wheel_cuda(major_minor(facts.nvidia.driver_cuda)) if has_nvidia(facts) else None
        fix = "Install it into this interpreter: " + pip_install(facts, cuda, force=False)
        if probe.torch_file:
            cause = f"torch is not installed, and Python found {probe.torch_file} instead"
            fix = f"Move {probe.torch_file} out of the way, then: " + fix
    elif "partially initialized module" in text or "circular import" in text:
        cause = "a circular import: a file named like a module torch imports (e.g. random.py, copy.py) shadows it"
        fix = "Rename the shadowing file named in the module-shadowing finding (and delete __pycache__)."
    elif m := re.search(r"(lib[\w.+-]+\.so[\w.]*): cannot open shared object file", text):
        cause = f"the shared library {m.group(1)} that this torch build links against is missing"
        fix = ("Reinstall torch so pip brings its CUDA libraries (nvidia-* packages) again, and unset "
               f"LD_LIBRARY_PATH entries that point at other CUDA installs: {reinstall}")
    elif "undefined symbol" in text:
        cause = "undefined symbols: parts of two different torch/CUDA installs are mixed (pip over conda, LD_LIBRARY_PATH, a stale copy)"
        fix = ("Run `pip uninstall torch` until it says it is not installed (and `conda remove pytorch` in conda "
               f"envs), unset LD_LIBRARY_PATH, then: {reinstall}")
    elif "numpy" in text.lower() and ("multiarray" in text or "NumPy 1.x" in text or "_ARRAY_API" in text):
        cause = "a NumPy ABI mismatch: a package compiled against NumPy 1.x meets NumPy 2.x"
        fix = "pip install \"numpy<2\" (or upgrade the packages compiled against NumPy 1.x)"
    else:
        cause = "see the error above"
        fix = f"Reinstall torch cleanly: {reinstall}"
    yield Finding(f"`import torch` failed ({cause}). {error}", fix=fix, location=where)


@check(code="TD102", name="cpu-only-build", scope=Scope.ENV, severity="error",
       summary="A CPU-only torch build on a machine with an NVIDIA driver or GPU.")
def cpu_only_build(facts: EnvFacts) -> Iterator[Finding]:
    version = facts.torch_version
    known_cpu = (facts.torch.ok and not facts.torch.cuda and not facts.torch.hip) or local_tag(version) == "cpu"
    if not known_cpu:
        return
    nv = facts.nvidia
    if has_nvidia(facts):
        gpus = ", ".join(f"GPU{g.index} {g.name}" for g in nv.gpus) or "a loaded NVIDIA kernel driver"
        driver = f"driver {nv.driver_version}, CUDA ≤ {nv.driver_cuda}" if nv.driver_version else "driver present"
        target = best_wheel_cuda(major_minor(nv.driver_cuda))
        yield Finding(
            f"torch {version} is a CPU-only build (torch.version.cuda is None) but this machine has {gpus} "
            f"({driver}): torch.cuda.is_available() is False and .cuda() raises "
            "'AssertionError: Torch not compiled with CUDA enabled'.",
            fix=f"Install the CUDA build that matches the driver: {pip_install(facts, target or (12, 6))}",
        )
    elif facts.toolkit.nvcc_path:
        yield Finding(
            f"torch {version} is a CPU-only build. A CUDA toolkit is installed (nvcc {facts.toolkit.nvcc_version} "
            f"at {facts.toolkit.nvcc_path}) but there is no NVIDIA driver or GPU, so the CPU build is right here.",
            fix="Nothing to do on this machine; on a GPU machine install a CUDA build of torch.",
            severity=Severity.INFO,
        )


def _covered(cc: tuple[int, int], arch_list: list[str]) -> bool:
    """A GPU runs a wheel with SASS for its major version at or below its minor (not the 'a'/'f'
    arch-specific variants), or PTX (compute_XY) at or below its capability to JIT from."""
    want = cc[0] * 10 + cc[1]
    for arch in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+)([a-z]?)", arch)
        if not m:
            continue
        num = int(m.group(2))
        major, minor = divmod(num, 10)
        if m.group(1) == "sm" and not m.group(3) and major == cc[0] and minor <= cc[1]:
            return True
        if m.group(1) == "compute" and num <= want:
            return True
    return False


@check(code="TD103", name="gpu-arch-unsupported", scope=Scope.ENV, severity="error",
       summary="A GPU's compute capability has no kernels in this torch build ('no kernel image is available').")
def gpu_arch_unsupported(facts: EnvFacts) -> Iterator[Finding]:
    arch_list = facts.torch.arch_list
    if not (facts.torch.ok and facts.torch.cuda and arch_list):
        return
    for gpu in facts.nvidia.gpus:
        if gpu.capability is None:
            continue
        major, minor = gpu.capability
        cc = (major, minor)
        if _covered(cc, arch_list):
            continue
        sm = f"sm_{cc[0]}{cc[1]}"
        need = FIRST_CUDA_FOR_CC.get(cc) or next((v for k, v in sorted(FIRST_CUDA_FOR_CC.items()) if k >= cc), (12, 8))
        if cc < (7, 5):
            target = best_wheel_cuda((12, 6))  # CUDA 13 wheels dropped pre-Turing GPUs
        else:
            target = best_wheel_cuda(major_minor(facts.nvidia.driver_cuda), min_cuda=need) or need
        seen = f" The probe's CUDA op failed with: {facts.torch.cuda_error}" if facts.torch.cuda_error else ""
        yield Finding(
            f"GPU{gpu.index} {gpu.name} has compute capability {cc[0]}.{cc[1]} ({sm}), but torch {facts.torch.version} "
            f"(CUDA {facts.torch.cuda}) only has kernels for {' '.join(arch_list)}: every CUDA op fails with "
            f"'CUDA error: no kernel image is available for execution on the device'.{seen}",
            fix=f"Install a build that includes {sm} (CUDA ≥ {need[0]}.{need[1]}"
                f"{' and ≤ 12.x' if cc < (7, 5) else ''}): {pip_install(facts, target)}",
            location=Location(device=f"GPU{gpu.index}"),
        )


@check(code="TD104", name="driver-too-old", scope=Scope.ENV, severity="error",
       summary="The NVIDIA driver is older than the CUDA version torch was built with needs.")
def driver_too_old(facts: EnvFacts) -> Iterator[Finding]:
    torch_cuda = major_minor(facts.torch_cuda)
    nv = facts.nvidia
    if torch_cuda is None or not nv.driver_version:
        return
    need = MIN_DRIVER.get(torch_cuda[0])
    driver_cuda = major_minor(nv.driver_cuda)
    if driver_cuda is not None:
        too_old = driver_cuda[0] < torch_cuda[0]
    else:
        too_old = need is not None and _version_tuple(nv.driver_version) < _version_tuple(need)
    if not too_old:
        return
    alt = best_wheel_cuda(driver_cuda) if driver_cuda else None
    alt_text = f", or install a torch build for CUDA {alt[0]}.{alt[1]}: {pip_install(facts, alt)}" if alt else ""
    supports = f"supports CUDA up to {nv.driver_cuda}" if nv.driver_cuda else "is too old"
    yield Finding(
        f"NVIDIA driver {nv.driver_version} {supports}, but torch {facts.torch_version} was built with CUDA "
        f"{facts.torch_cuda}, which needs driver ≥ {need or '?'}: torch.cuda.is_available() is False and CUDA "
        "init warns 'The NVIDIA driver on your system is too old'.",
        fix=f"Upgrade the NVIDIA driver to ≥ {need or 'a newer release'}{alt_text}",
    )


@check(code="TD105", name="cuda-toolkit-mismatch", scope=Scope.ENV, severity="warning",
       summary="The CUDA toolkit (nvcc) differs in major version from the CUDA torch was built with.")
def cuda_toolkit_mismatch(facts: EnvFacts) -> Iterator[Finding]:
    torch_cuda = major_minor(facts.torch_cuda)
    nvcc = major_minor(facts.toolkit.nvcc_version)
    if torch_cuda is None or nvcc is None or torch_cuda[0] == nvcc[0]:
        return
    explicit = facts.toolkit.cuda_home_from_env
    yield Finding(
        f"nvcc {facts.toolkit.nvcc_version} ({facts.toolkit.nvcc_path or facts.toolkit.cuda_home}) is CUDA "
        f"{nvcc[0]}.x but torch {facts.torch_version} was built with CUDA {facts.torch_cuda}. Training is not "
        "affected (torch ships its own CUDA runtime; nvidia-smi's 'CUDA Version' is only the driver's maximum), "
        "but building CUDA extensions (torch.utils.cpp_extension, apex, flash-attn, DeepSpeed ops) fails with "
        "'The detected CUDA version mismatches the version that was used to compile PyTorch'."
        + (" CUDA_HOME/CUDA_PATH points at it, so extension builds will use it." if explicit else ""),
        fix=f"Point CUDA_HOME at a CUDA {torch_cuda[0]}.x toolkit before building extensions, e.g. "
            f"`export CUDA_HOME=/usr/local/cuda-{torch_cuda[0]}.{torch_cuda[1]}`",
        severity=Severity.WARNING if explicit else Severity.INFO,
    )


def _matching_companion(name: str, torch_version: str) -> Optional[str]:
    mm = major_minor(torch_version)
    if mm is None or mm[0] != 2 or name not in COMPANION_MINOR_OFFSET:
        return None
    major, offset = COMPANION_MINOR_OFFSET[name]
    return f"{major}.{mm[1] + offset}" if major == 0 else f"2.{mm[1]}"


@check(code="TD106", name="companion-version-mismatch", scope=Scope.ENV, severity="error",
       summary="torchvision/torchaudio/torchtext (or another package) built for a different torch.")
def companion_version_mismatch(facts: EnvFacts) -> Iterator[Finding]:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    torch_version = facts.torch_version
    if not torch_version:
        return
    base = base_version(torch_version)
    for name, version in sorted(facts.packages.items()):
        if name == "torch":
            continue
        problems = []
        spec = facts.torch_requirements.get(name)
        if spec:
            try:
                if not SpecifierSet(spec).contains(base, prereleases=True):
                    problems.append(f"requires torch{spec}")
            except InvalidSpecifier:
                pass
        want = _matching_companion(name, torch_version)
        if want and major_minor(version) != major_minor(want):
            problems.append(f"is the release for another torch (torch {base} goes with {name} {want}.*)")
        ours, theirs = local_tag(torch_version), local_tag(version)
        if ours and theirs and ours != theirs and name in COMPANION_MINOR_OFFSET:
            problems.append(f"is a +{theirs} build while torch is +{ours}")
        if not problems:
            continue
        target = f"{name}=={want}.*" if want else name
        extra = (" Importing it fails with 'RuntimeError: operator torchvision::nms does not exist'."
                 if name == "torchvision" else "")
        yield Finding(
            f"{name} {version} {' and '.join(problems)}, but torch {torch_version} is installed.{extra}",
            fix=f"Install the matching release from the same index as torch: pip install \"{target}\""
                + (f" --index-url https://download.pytorch.org/whl/{ours}" if ours else ""),
        )


@check(code="TD107", name="numpy-problem", scope=Scope.ENV, severity="warning",
       summary="NumPy missing, or a NumPy 1.x/2.x ABI mismatch with compiled packages.")
def numpy_problem(facts: EnvFacts) -> Iterator[Finding]:
    numpy = facts.packages.get("numpy")
    if numpy is None:
        if facts.torch_version:
            yield Finding(
                "NumPy is not installed: `import torch` warns 'Failed to initialize NumPy: No module named "
                "numpy', and tensor.numpy() / torch.from_numpy() / DataLoader collation of arrays fail.",
                fix="pip install numpy",
            )
        return
    abi_text = " ".join(facts.torch.stderr_tail)
    if facts.torch.numpy_error or "compiled using NumPy 1.x" in abi_text:
        detail = facts.torch.numpy_error or "a module compiled using NumPy 1.x cannot run in NumPy 2.x"
        yield Finding(
            f"torch cannot use NumPy {numpy}: {detail}.",
            fix="pip install \"numpy<2\" (or upgrade the packages compiled against NumPy 1.x)",
        )
    elif numpy.split(".")[0] == "2" and facts.numpy1_only:
        names = ", ".join(facts.numpy1_only)
        yield Finding(
            f"NumPy {numpy} is installed, but {names} require numpy<2: importing them fails with "
            "'A module that was compiled using NumPy 1.x cannot be run in NumPy 2.x'.",
            fix=f"pip install \"numpy<2\", or upgrade {names} to releases built for NumPy 2",
        )

