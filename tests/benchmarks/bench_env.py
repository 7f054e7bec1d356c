"""Benchmark: `torchdoctor env` against `python -m torch.utils.collect_env` and a bare `import torch`.

Run: python tests/benchmarks/bench_env.py [--rounds N]
The three commands are interleaved round by round in one run, so they share the machine's state;
medians and the ratios against both baselines are printed. Targets: env <= 0.8x collect_env and
<= 1.1x the bare import, and `--format markdown` (the collect_env replacement) no slower than the default.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

COMMANDS = {
    "torchdoctor env": [sys.executable, "-m", "torchdoctor", "env", "--format", "json"],
    "env markdown": [sys.executable, "-m", "torchdoctor", "env", "--format", "markdown"],
    "collect_env": [sys.executable, "-m", "torch.utils.collect_env"],
    "import torch": [sys.executable, "-c", "import torch"],
}


# As installed: bytecode caches are used (pip compiles them at install); PYTHONDONTWRITEBYTECODE would make
# every run of an editable checkout compile torchdoctor from source, which no installed copy does.
ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, "NO_COLOR": "1"}


CPU: dict[str, list[float]] = {}  # CPU seconds (user + sys) of each run's whole process tree


def timed(cmd: list[str], cwd: str) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300, env=ENV)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.setdefault(" ".join(cmd[1:]), []).append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return wall


def verified(name: str, cmd: list[str], cwd: str) -> None:
    """Run `cmd` once, output kept, and check that it worked (the timed runs discard the output): the torch probe
    imported torch, and no check failed internally. A failed run must never be timed as a result."""
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, env=ENV)
    ok = proc.returncode == 0 or (name.startswith(("torchdoctor", "env")) and proc.returncode == 1)  # 1: findings
    if name == "torchdoctor env" and ok:
        doc = json.loads(proc.stdout)
        ok = doc["facts"]["torch"]["ok"] is True and not any(
            "failed internally" in f["message"] for f in doc["findings"]
        )
    elif name == "env markdown" and ok:
        ok = "failed internally" not in proc.stdout and "torch" in proc.stdout
    if not ok:
        raise SystemExit(f"{name} failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-500:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    with tempfile.TemporaryDirectory() as cwd:
        for name, cmd in COMMANDS.items():  # warm the page cache once, checking that each command works
            verified(name, cmd, cwd)
            timed(cmd, cwd)
        for _ in range(args.rounds):
            for name, cmd in COMMANDS.items():
                samples[name].append(timed(cmd, cwd))
    med = {name: statistics.median(v) for name, v in samples.items()}
    cpu = {name: statistics.median(CPU[" ".join(cmd[1:])][1:]) for name, cmd in COMMANDS.items()}
    for name, values in samples.items():
        print(
            f"{name:16s} median {med[name]:.3f} s  (min {min(values):.3f}, max {max(values):.3f}, n={len(values)})"
            f"  CPU {cpu[name]:.2f} s"
        )
    env = med["torchdoctor env"]
    print(f"env / collect_env  = {env / med['collect_env']:.2f}x  (target <= 0.80x)")
    print(f"env / import torch = {env / med['import torch']:.2f}x  (target <= 1.10x)")
    print(f"markdown / env     = {med['env markdown'] / env:.2f}x  (target <= 1.00x, within noise)")
    print(
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (wall ratios need an idle machine; "
        f"CPU env / import torch = {cpu['torchdoctor env'] / cpu['import torch']:.2f}x)"
    )


if __name__ == "__main__":
    main()
