"""Benchmark: what `torchdoctor run` adds to `python train.py`, at start-up and per training step.

Run: python tests/benchmarks/bench_run.py [--rounds N] [--steps N] [--warmup N] [--models mlp-small,mlp,cnn]

1. Start-up: a script that imports torch, builds a small model and takes one step, run as
   ``python SCRIPT`` and as ``python -m torchdoctor run SCRIPT`` in alternation. Each process's CPU time
   (user + system, from the children's rusage) is taken, so other load on the machine does not count.
   Prints the medians, the median of the per-round differences and ratios. Target: <= 0.3 s added.
2. Per step: the same training script (a model of --models, SGD, --steps steps after --warmup untimed ones)
   reports the CPU time of its own thread per step (time.thread_time) to a file; run with plain python
   and under `torchdoctor run` in alternation, one thread each. Prints the median ms/step of each and the
   median of the per-round ratios (with the quartiles). `mlp-small` is bench_watch.py's `mlp3`, a 3-layer MLP
   whose step takes about a millisecond: the fixed per-step cost of watch dominates it (``--warmup 1000
   --steps 1000``: the steady state of a long run). Target: what watch itself costs
   (tests/benchmarks/bench_watch.py), i.e. <= 1.03x on the CNN.
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
import textwrap
from pathlib import Path

STARTUP = """
import torch
from torch import nn
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
opt.zero_grad()
nn.functional.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 3, (4,))).backward()
opt.step()
"""

TRAIN = """
import json, sys, time
import torch
from torch import nn
torch.set_num_threads(1)
torch.manual_seed(0)
kind, steps, out, warmup = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
if kind == "mlp-small":
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
elif kind == "mlp":
    layers = []
    for _ in range(8):
        layers += [nn.Linear(512, 512), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(512, 10))
    x, y = torch.randn(64, 512), torch.randint(0, 10, (64,))
else:
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                          nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(64 * 16, 10))
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

def step():
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()

for _ in range(warmup):
    step()
start = time.thread_time()
for _ in range(steps):
    step()
json.dump({"cpu_ms_per_step": (time.thread_time() - start) * 1000 / steps}, open(out, "w"))
"""


def child_cpu(command: list[str], env: dict[str, str]) -> float:
    """CPU seconds (user + system) of one child process run to completion."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def quartiles(values: list[float]) -> str:
    if len(values) < 4:
        return ""
    q = statistics.quantiles(values, n=4)
    return f" (quartiles {q[0]:.3f}-{q[2]:.3f})"


def startup(folder: Path, rounds: int, env: dict[str, str]) -> None:
    script = folder / "startup.py"
    script.write_text(textwrap.dedent(STARTUP))
    plain, doctor = [], []
    for _ in range(rounds):
        plain.append(child_cpu([sys.executable, str(script)], env))
        doctor.append(child_cpu([sys.executable, "-m", "torchdoctor", "run", str(script)], env))
    added = [d - p for p, d in zip(plain, doctor)]
    ratios = [d / p for p, d in zip(plain, doctor)]
    print(
        f"start-up CPU time, median of {rounds} rounds: python {statistics.median(plain):.3f} s, "
        f"torchdoctor run {statistics.median(doctor):.3f} s; added {statistics.median(added):+.3f} s"
        f"{quartiles(added)}, ratio {statistics.median(ratios):.3f}x (target: <= 0.3 s added)"
    )


def per_step(folder: Path, kinds: list[str], rounds: int, steps: int, warmup: int, env: dict[str, str]) -> None:
    script = folder / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    out = folder / "result.json"

    def one(prefix: list[str], kind: str) -> float:
        subprocess.run(
            [*prefix, str(script), kind, str(steps), str(out), str(warmup)],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        return float(json.loads(out.read_text())["cpu_ms_per_step"])

    for kind in kinds:
        plain, doctor = [], []
        for _ in range(rounds):
            plain.append(one([sys.executable], kind))
            doctor.append(one([sys.executable, "-m", "torchdoctor", "run"], kind))
        ratios = [d / p for p, d in zip(plain, doctor)]
        print(
            f"{kind}: per-step CPU time, median of {rounds} rounds of {steps} steps after {warmup}: python "
            f"{statistics.median(plain):.3f} ms, torchdoctor run {statistics.median(doctor):.3f} ms; "
            f"ratio {statistics.median(ratios):.3f}x{quartiles(ratios)}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--models", default="mlp-small,cnn")
    parser.add_argument("--skip-startup", action="store_true")
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCHDOCTOR_FAIL_ON": "never"}
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_startup:
            startup(Path(tmp), args.rounds, env)
        per_step(Path(tmp), [k for k in args.models.split(",") if k], args.rounds, args.steps, args.warmup, env)


if __name__ == "__main__":
    main()
