"""`torchdoctor env --format markdown`: a report to paste into a bug report, covering every field of
`python -m torch.utils.collect_env` (OS, libc, compilers, Python, torch build, CUDA/cuDNN/driver, GPUs, CPU,
relevant pip and conda packages, variables) plus the findings.

`collect_details()` gathers what only this report shows (the OS name, compiler versions, `lscpu`, conda
packages); it runs in a thread while the torch probe imports torch, so the report costs no extra wall time.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from typing import Any, Optional

from torchdoctor import __version__
from torchdoctor.env.packages import RELEVANT
from torchdoctor.report import Report
from torchdoctor.units import byte_size


def _first_line(cmd: list[str]) -> Optional[str]:
    """The first output line of a version command, None when the tool is missing or fails."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def os_name() -> str:
    """ "Debian GNU/Linux 12 (bookworm) (x86_64)", "macOS 14.5 (arm64)", "Windows 10 ...", like collect_env."""
    if sys.platform.startswith("linux"):
        try:
            with open("/etc/os-release", encoding="utf-8") as f:
                m = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', f.read(), re.M)
            if m:
                return f"{m.group(1)} ({platform.machine()})"
        except OSError:
            pass
    if sys.platform == "darwin":
        return f"macOS {platform.mac_ver()[0]} ({platform.machine()})"
    return f"{platform.system()} {platform.release()} ({platform.machine()})"


def conda_packages(prefix: Optional[str]) -> str:
    """Relevant packages of the active conda environment, read from conda-meta (no `conda` start-up)."""
    if not prefix:
        return ""
    lines = []
    for path in sorted(glob.glob(os.path.join(prefix, "conda-meta", "*.json"))):
        try:
            with open(path, encoding="utf-8") as f:
                meta = json.load(f)
        except (OSError, ValueError):
            continue
        if RELEVANT.search(str(meta.get("name", ""))):
            lines.append(f"{meta.get('name')}=={meta.get('version')} ({meta.get('build', '')})")
    return "\n".join(lines)


def collect_details(environ: Optional[dict[str, str]] = None) -> dict[str, str]:
    """What only the markdown report shows: OS name, compilers, `lscpu`, conda packages."""
    environ = dict(os.environ) if environ is None else environ
    details = {"os": os_name()}
    for key, cmd in (
        ("gcc", ["gcc", "--version"]),
        ("clang", ["clang", "--version"]),
        ("cmake", ["cmake", "--version"]),
        ("lscpu", ["lscpu"]),
    ):
        if key == "lscpu":
            if shutil.which("lscpu"):
                try:
                    details[key] = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
                except (OSError, subprocess.SubprocessError):
                    pass
        elif (line := _first_line(cmd)) is not None:
            details[key] = line
    details["conda"] = conda_packages(environ.get("CONDA_PREFIX"))
    return details


def _yes(value: Any) -> str:
    return "?" if value is None else "yes" if value else "no"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _rows(facts: dict[str, Any]) -> list[tuple[str, str]]:
    torch, sysf, nv, tk = facts["torch"], facts["system"], facts["nvidia"], facts["toolkit"]
    details, env = facts.get("report_details", {}), facts.get("env_vars", {})
    if torch.get("ok"):
        version = f"{torch.get('version')} (debug build: {_yes(torch.get('debug'))})"
        if torch.get("git_version"):
            version += f", commit {str(torch['git_version'])[:12]}"
    else:
        version = (
            f"{facts.get('torch_dist_version') or 'not installed'}: `import torch` "
            f"{'hangs' if torch.get('timed_out') else 'fails'} (see the findings)"
        )
    gpus = [
        f"GPU{g['index']}: {g.get('name')}"
        + (f" (sm_{g['capability'][0]}{g['capability'][1]})" if g.get("capability") else "")
        + f", {byte_size(g.get('memory_total'))}"
        for g in nv.get("gpus", [])
    ]
    cpu = (
        f"{sysf.get('cpu_model') or sysf.get('machine')}, {sysf.get('cpu_logical')} logical / "
        f"{sysf.get('cpu_physical')} physical cores, {sysf.get('cpu_affinity')} usable"
    )
    if sysf.get("cgroup_cpu_limit"):
        cpu += f", container quota {sysf['cgroup_cpu_limit']:g} CPUs"
    if torch.get("cpu_capability"):
        cpu += f", torch uses {torch['cpu_capability']} with {torch.get('num_threads')} threads"
    memory = f"{byte_size(sysf.get('memory_available'))} available of {byte_size(sysf.get('memory_total'))}"
    if sysf.get("cgroup_memory_limit"):
        memory += f", container limit {byte_size(sysf['cgroup_memory_limit'])}"
    shm = (
        f"{byte_size(sysf.get('shm_total'))} ({byte_size(sysf.get('shm_free'))} free)"
        if sysf.get("shm_total") is not None
        else "none"
    )
    compilers = ", ".join(
        f"{name}: {details[key]}" if details.get(key) else f"{name}: not found"
        for key, name in (("gcc", "GCC"), ("clang", "Clang"), ("cmake", "CMake"))
    )
    alloc = next((f"{k}={env[k]}" for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF") if k in env), "not set")
    hip = torch.get("hip")
    cuda_available = False if torch.get("ok") and not torch.get("cuda") and not hip else torch.get("cuda_available")
    return [
        ("PyTorch", version),
        ("CUDA used to build PyTorch", torch.get("cuda") or ("none (CPU-only build)" if torch.get("ok") else "?")),
        ("ROCm used to build PyTorch", hip or "none"),
        ("OS", details.get("os") or f"{sysf.get('platform')} ({sysf.get('machine')})"),
        ("Libc", "-".join(platform.libc_ver()) or "?"),
        ("Compilers", compilers),
        (
            "Python",
            f"{sys.version.replace(chr(10), ' ')} ({sys.maxsize.bit_length() + 1}-bit runtime) at "
            f"`{sysf.get('python_executable')}`",
        ),
        ("Python platform", sysf.get("platform", "")),
        (
            "CUDA available",
            _yes(cuda_available)
            + (f" ({torch['cuda_device_count']} device(s))" if torch.get("cuda_device_count") else "")
            + (f"; CUDA error: {torch['cuda_error']}" if torch.get("cuda_error") else ""),
        ),
        (
            "CUDA toolkit (nvcc)",
            f"{tk.get('nvcc_version')} at {tk.get('nvcc_path')}" if tk.get("nvcc_path") else "not found",
        ),
        ("CUDA_MODULE_LOADING", env.get("CUDA_MODULE_LOADING", "not set")),
        ("GPU models and configuration", "; ".join(gpus) or f"none ({nv.get('unavailable_reason') or 'NVML: none'})"),
        (
            "NVIDIA driver",
            f"{nv.get('driver_version')} (supports CUDA ≤ {nv.get('driver_cuda')})"
            if nv.get("driver_version")
            else "none",
        ),
        ("cuDNN" if not hip else "MIOpen", torch.get("cudnn") or "none"),
        ("NCCL", torch.get("nccl") or "none"),
        ("XPU available", _yes(torch.get("xpu_available"))),
        ("HIP runtime", hip or "none"),
        ("XNNPACK available", _yes(torch.get("xnnpack"))),
        ("Caching allocator config", alloc),
        ("BLAS / OpenMP", f"{torch.get('blas') or '?'} / {torch.get('openmp') or '?'}"),
        ("CPU", cpu),
        ("Memory", memory),
        ("/dev/shm", shm),
    ]


def render_markdown(report: Report) -> str:
    """The whole report as GitHub-flavoured Markdown."""
    facts = report.facts
    details = facts.get("report_details", {})
    out = [
        f"### Environment (`torchdoctor env --format markdown`, torchdoctor {__version__})",
        "",
        "| | |",
        "|---|---|",
    ]
    out += [f"| {name} | {_cell(value)} |" for name, value in _rows(facts)]
    if details.get("lscpu"):
        out += ["", "<details><summary>CPU (lscpu)</summary>", "", "```", details["lscpu"], "```", "", "</details>"]
    pip = "\n".join(f"{name}=={version}" for name, version in sorted(facts.get("packages", {}).items()))
    out += ["", "**Relevant packages (pip)**", "", "```", pip or "none", "```"]
    if details.get("conda"):
        out += ["", "**Relevant packages (conda)**", "", "```", details["conda"], "```"]
    if facts.get("env_vars"):
        out += ["", "**Variables**", "", "```"] + [f"{k}={v}" for k, v in facts["env_vars"].items()] + ["```"]
    counts = {str(k): v for k, v in report.counts().items() if v}
    out += ["", f"**Findings** ({', '.join(f'{n} {k}' for k, n in counts.items()) or 'none'})", ""]
    for f in report.sorted_findings():
        fix = f" Fix: {f.fix.title}" if f.fix and f.fix.title else ""
        out.append(f"- **{f.severity} {f.code} {f.name}**: {f.message}{fix}")
    if not report.findings:
        out.append("- no problems found")
    return "\n".join(out)
