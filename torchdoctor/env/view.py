"""The compact facts section of the `torchdoctor env` console report."""

from __future__ import annotations

import os
from typing import Any, Optional

from rich.console import Group
from rich.table import Table
from rich.text import Text

from torchdoctor.units import byte_size


def _torch_row(torch: dict[str, Any], dist_version: Optional[str]) -> Text:
    if not torch.get("ok"):
        what = "hung" if torch.get("timed_out") else "failed"
        return Text(f"{dist_version or 'not installed'} · import {what}", style="red")
    cuda = torch.get("cuda")
    build = f"CUDA {cuda}" if cuda else f"ROCm {torch['hip']}" if torch.get("hip") else "CPU-only build"
    if cuda and torch.get("cudnn"):
        build += f", cuDNN {torch['cudnn']}"
    if torch.get("nccl"):
        build += f", NCCL {torch['nccl']}"
    took = f"import {torch.get('seconds') or 0:.1f} s"
    if torch.get("cpu_seconds") is not None:
        took += f" ({torch['cpu_seconds']:.1f} s CPU)"
    parts = [f"{torch.get('version')} ({build})", took]
    blas = torch.get("blas") or ""
    parts.append("BLAS " + ("MKL" if "Math Kernel" in blas else blas or "?"))
    if torch.get("cpu_capability"):
        parts.append(torch["cpu_capability"])
    if torch.get("num_threads"):
        parts.append(f"{torch['num_threads']} threads")
    if torch.get("debug"):
        parts.append("debug build")
    if torch.get("arch_list"):
        parts.append("archs " + " ".join(torch["arch_list"]))
    return Text(" · ".join(parts))


def where_torch(torch: dict[str, Any]) -> Optional[str]:
    """Which torch Python imports and why that one: the folder, whether it is the user site, what it hides."""
    file = torch.get("torch_file")
    if not file:
        return None
    folder = os.path.dirname(file) if file.endswith("__init__.py") else file
    user_site = torch.get("user_site")
    text = folder
    if user_site and folder.startswith(user_site.rstrip("/") + "/"):
        text += " (the user site: searched before the environment's site-packages)"
    hidden = [c for c in torch.get("torch_copies") or [] if c != folder]
    if hidden:
        text += "; hides " + ", ".join(hidden)
    return text


def _gpu_rows(nvidia: dict[str, Any], torch: dict[str, Any]) -> list[tuple[str, Text]]:
    if not nvidia.get("gpus"):
        return [("GPUs", Text(f"none: {nvidia.get('unavailable_reason') or 'NVML reported none'}", style="dim"))]
    rows = [("Driver", Text(f"{nvidia.get('driver_version')} (supports CUDA ≤ {nvidia.get('driver_cuda')})"))]
    for gpu in nvidia["gpus"]:
        cc = gpu.get("capability")
        bits = [gpu.get("name") or "?"]
        if cc:
            bits[0] += f" (sm_{cc[0]}{cc[1]})"
        bits.append(f"{byte_size(gpu.get('memory_used'))} / {byte_size(gpu.get('memory_total'))}")
        if gpu.get("utilization") is not None:
            bits.append(f"{gpu['utilization']}% busy")
        if gpu.get("temperature") is not None:
            bits.append(f"{gpu['temperature']}°C")
        if gpu.get("power_watts") is not None and gpu.get("power_limit_watts"):
            bits.append(f"{gpu['power_watts']:.0f}/{gpu['power_limit_watts']:.0f} W")
        procs = gpu.get("processes") or []
        if procs:
            bits.append(f"{len(procs)} process(es)")
        rows.append((f"GPU{gpu['index']}", Text(" · ".join(bits))))
    if torch.get("cuda_error"):
        rows.append(("CUDA op", Text(torch["cuda_error"], style="red")))
    elif torch.get("cuda_available"):
        rows.append(("CUDA op", Text(f"ok on {torch.get('cuda_device_count')} device(s)", style="green")))
    return rows


def facts_view(facts: dict[str, Any]) -> Table:
    """Key facts, one line each: torch, Python, CPU, memory, shm, GPUs, toolkit, packages, variables."""
    sysf, torch, tk = facts["system"], facts["torch"], facts["toolkit"]
    table = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    table.add_row("torch", _torch_row(torch, facts.get("torch_dist_version")))
    where = where_torch(torch)
    if where:
        table.add_row("torch from", where)
    table.add_row("Python", f"{sysf['python']} ({sysf['python_executable']}) on {sysf['platform']}")
    cpu = (
        f"{sysf.get('cpu_model') or sysf.get('machine')} · {sysf.get('cpu_logical')} logical / "
        f"{sysf.get('cpu_physical')} physical cores"
    )
    if sysf.get("cpu_affinity") and sysf["cpu_affinity"] != sysf.get("cpu_logical"):
        cpu += f" · {sysf['cpu_affinity']} usable"
    if sysf.get("cgroup_cpu_limit"):
        cpu += f" · container quota {sysf['cgroup_cpu_limit']:g} CPUs"
    table.add_row("CPU", cpu)
    memory = f"{byte_size(sysf.get('memory_available'))} available of {byte_size(sysf.get('memory_total'))}"
    if sysf.get("cgroup_memory_limit"):
        memory += f" · container limit {byte_size(sysf['cgroup_memory_limit'])}"
        if sysf.get("cgroup_memory_used") is not None:
            memory += f" ({byte_size(sysf['cgroup_memory_used'])} used)"
    table.add_row("Memory", memory + f" · disk {byte_size(sysf.get('disk_free'))} free at {sysf.get('disk_path')}")
    shm = byte_size(sysf["shm_total"]) if sysf.get("shm_total") is not None else "none"
    if sysf.get("shm_free") is not None:
        shm += f" ({byte_size(sysf['shm_free'])} free)"
    if sysf.get("open_files_soft"):
        shm += f" · open files limit {sysf['open_files_soft']}"
    table.add_row("/dev/shm", shm + (f" · in {sysf['container']}" if sysf.get("container") else ""))
    for label, value in _gpu_rows(facts["nvidia"], torch):
        table.add_row(label, value)
    if tk.get("nvcc_path") or tk.get("cuda_home_from_env"):
        table.add_row(
            "Toolkit",
            f"nvcc {tk.get('nvcc_version') or '?'} at {tk.get('nvcc_path')} · "
            f"CUDA_HOME {tk.get('cuda_home')}{' (from env)' if tk.get('cuda_home_from_env') else ''}",
        )
    if facts.get("ranks"):
        hosts = sorted({r["hostname"] for r in facts["ranks"]})
        row = f"{len(facts['ranks'])} rank(s) reported from {len(hosts)} host(s): {', '.join(hosts)}"
        if facts.get("missing_ranks"):
            row += f" · missing: {', '.join(map(str, facts['missing_ranks']))}"
        table.add_row("Ranks", row)
    packages = {k: v for k, v in facts["packages"].items() if k != "torch"}
    if packages:
        table.add_row("Packages", ", ".join(f"{k} {v}" for k, v in packages.items()))
    if facts["env_vars"]:
        table.add_row("Variables", " ".join(f"{k}={_short(v)}" for k, v in facts["env_vars"].items()))
    return table


def _short(value: str, limit: int = 60) -> str:
    """A variable's value cut for the summary table (CUDA images set NVIDIA_REQUIRE_CUDA to dozens of
    constraints); `--format json` keeps it whole."""
    return value if len(value) <= limit else value[: limit - 3] + "..."


def passed_view(facts_table: Table, passed: list[str], areas: dict[str, tuple[str, ...]]) -> Group:
    """The facts, then one ✓ line per area listing the checks that found nothing (`env -v`)."""
    table = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 2), title_justify="left")
    table.add_column(style="bold green", no_wrap=True)
    table.add_column(overflow="fold")
    placed: set[str] = set()
    for area, names in areas.items():
        ok = [n for n in names if n in passed]
        placed.update(ok)
        if ok:
            table.add_row(f"✓ {area}", ", ".join(ok))
    others = [n for n in passed if n not in placed]
    if others:
        table.add_row("✓ other", ", ".join(others))
    return Group(facts_table, Text(""), Text("Checks that passed", style="bold"), table)
