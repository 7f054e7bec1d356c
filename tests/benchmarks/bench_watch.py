"""Benchmark: per-step time of a training loop with and without `torchdoctor.watch`, and under anomaly mode.

Run: python tests/benchmarks/bench_watch.py [--rounds N] [--steps N] [--models mlp,cnn]
CPU, one thread. Configurations are interleaved block by block in one process, so they share the
machine's state: baseline, watch (all default checks), and torch.autograd.set_detect_anomaly(True).
Every block starts with two untimed steps; a watch block enters a fresh session, so its periodic
(every=10) checks fall on the timed steps at their usual rate. Prints the median ms/step, and the median
over rounds of each block's ratio to the baseline block of the same round, both for the CPU time of the
stepping thread (what the overhead is; insensitive to other processes taking the CPU) and wall time,
with the quartiles of the per-round CPU ratios to show the noise of the machine. Targets with all default checks on: <= 1.10x on the MLP, <= 1.03x on the CNN.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import Callable, Iterator

import torch
from torch import nn

import torchdoctor

TARGETS = {"mlp": 1.10, "cnn": 1.03}


def mlp() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """8 x Linear(512) + ReLU, batch 64 (about 18 ms/step on one thread of a laptop-class core)."""
    layers: list[nn.Module] = []
    for _ in range(8):
        layers += [nn.Linear(512, 512), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(512, 10)), torch.randn(64, 512), torch.randint(0, 10, (64,))


def cnn() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """2 x (Conv + BatchNorm + ReLU) 3 -> 32 -> 64, pooling, Linear; batch 32 x 3 x 32 x 32."""
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(64 * 16, 10))
    return model, torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))


@contextlib.contextmanager
def baseline(model: nn.Module, opt: torch.optim.Optimizer) -> Iterator[None]:
    yield


@contextlib.contextmanager
def watched(model: nn.Module, opt: torch.optim.Optimizer) -> Iterator[None]:
    with torchdoctor.watch(model, opt, on_finding=lambda f: None, report=False) as session:
        yield
    if session.findings:
        raise SystemExit(f"the benchmark loop is not clean: {[f.name for f in session.findings]}")


@contextlib.contextmanager
def anomaly(model: nn.Module, opt: torch.optim.Optimizer) -> Iterator[None]:
    torch.autograd.set_detect_anomaly(True)
    try:
        yield
    finally:
        torch.autograd.set_detect_anomaly(False)


CONFIGS: dict[str, Callable[..., contextlib.AbstractContextManager]] = {
    "baseline": baseline, "watch": watched, "detect_anomaly": anomaly}


def block(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
          steps: int) -> tuple[list[float], list[float]]:
    """CPU time of the stepping thread and wall time of each step, after two untimed steps."""
    cpu, wall = [], []
    for i in range(steps + 2):
        start_cpu, start_wall = time.thread_time(), time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if i >= 2:
            cpu.append(time.thread_time() - start_cpu)
            wall.append(time.perf_counter() - start_wall)
    return cpu, wall


def bench(name: str, rounds: int, steps: int) -> dict[str, dict[str, float]]:
    """Per configuration: median CPU and wall ms/step, and the median over rounds of each block's ratio
    to the baseline block of the same round (adjacent blocks share the machine's load)."""
    torch.manual_seed(0)
    model, x, y = {"mlp": mlp, "cnn": cnn}[name]()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    cpu: dict[str, list[float]] = {c: [] for c in CONFIGS}
    wall: dict[str, list[float]] = {c: [] for c in CONFIGS}
    ratios: dict[str, dict[str, list[float]]] = {c: {"cpu": [], "wall": []} for c in CONFIGS}
    block(model, opt, x, y, 3)  # warm up allocator and kernels
    for r in range(rounds):
        order = list(CONFIGS) if r % 2 == 0 else list(reversed(CONFIGS))
        medians = {}
        for config in order:
            with CONFIGS[config](model, opt):
                c, w = block(model, opt, x, y, steps)
            cpu[config] += c
            wall[config] += w
            medians[config] = (statistics.median(c), statistics.median(w))
        for config in CONFIGS:
            ratios[config]["cpu"].append(medians[config][0] / medians["baseline"][0])
            ratios[config]["wall"].append(medians[config][1] / medians["baseline"][1])
    return {c: {"cpu_ms": statistics.median(cpu[c]) * 1e3, "wall_ms": statistics.median(wall[c]) * 1e3,
                "cpu_ratio": statistics.median(ratios[c]["cpu"]), "wall_ratio": statistics.median(ratios[c]["wall"]),
                "cpu_iqr": _quartiles(ratios[c]["cpu"])}
            for c in CONFIGS}


def _quartiles(values: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--models", default="mlp,cnn")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, {args.rounds} rounds x {args.steps} steps")
    print(f"{'model':<6}{'configuration':<16}{'cpu ms':>8}{'ratio':>8}{'(quartiles)':>16}{'wall ms':>9}{'ratio':>8}"
          "   target (cpu)")
    for name in args.models.split(","):
        for config, r in bench(name, args.rounds, args.steps).items():
            target = ""
            if config == "watch":
                target = f"<= {TARGETS[name]:.2f}x {'ok' if r['cpu_ratio'] <= TARGETS[name] else 'MISSED'}"
            low, high = r["cpu_iqr"]
            print(f"{name:<6}{config:<16}{r['cpu_ms']:>8.2f}{r['cpu_ratio']:>7.3f}x{f'({low:.3f}-{high:.3f})':>16}"
                  f"{r['wall_ms']:>9.2f}{r['wall_ratio']:>7.3f}x   {target}")


if __name__ == "__main__":
    main()
