"""Benchmark: what the performance checks add to `torchdoctor.watch` per step (the step clock's readings at the
forward and step hooks and at every DataLoader ``__next__``, and the checks' own work).

Run: python tests/benchmarks/bench_step_clock.py [--rounds N] [--steps N] [--models mlp,cnn,lm]
CPU, one thread. The loop takes its batches from a DataLoader (in-memory batches, num_workers=0), so the
patched ``__next__`` is on the timed path. Three configurations, interleaved block by block in one process as
in bench_watch.py: baseline (no session), watch with every default check except the performance ones
(`PERF`), and watch with every default check. Prints the median CPU ms/step of the stepping thread, the median
over rounds of each block's ratio to the baseline block of the same round, and the ratio of the full session
to the one without the performance checks, and the difference of their median CPU time per step in microseconds:
the cost they add. Target: <= 1.03x per step (on the tiny model, the microseconds are what to read).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import Callable, Iterator

import torch
from bench_watch import CPU_MODELS
from torch import nn
from torch.utils.data import DataLoader

import torchdoctor


def tiny() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """Linear(32, 32) on batch 8: a step of a few hundred microseconds, where the added cost shows in microseconds."""
    return nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)), torch.randn(8, 32), torch.randint(0, 4, (8,))


MODELS = {**CPU_MODELS, "tiny": tiny}
PERF = ["input-bound", "step-time-drift", "recompiling", "dataparallel-slow", "host-device-sync", "tensor-cores-idle"]


@contextlib.contextmanager
def baseline(model: nn.Module, opt: torch.optim.Optimizer) -> Iterator[None]:
    yield


@contextlib.contextmanager
def without_perf(model: nn.Module, opt: torch.optim.Optimizer) -> Iterator[None]:
    with torchdoctor.watch(model, opt, ignore=PERF, on_finding=lambda f: None, report=False):
        yield


@contextlib.contextmanager
def with_perf(model: nn.Module, opt: torch.optim.Optimizer) -> Iterator[None]:
    with torchdoctor.watch(model, opt, on_finding=lambda f: None, report=False) as session:
        yield
    assert session._ctx is not None and session._ctx.clock is not None, "the step clock did not run"


CONFIGS: dict[str, Callable[..., contextlib.AbstractContextManager]] = {
    "baseline": baseline,
    "watch-no-perf": without_perf,
    "watch": with_perf,
}


def block(model: nn.Module, opt: torch.optim.Optimizer, loader: DataLoader, steps: int) -> list[float]:
    """CPU time of the stepping thread per step (batch fetch included), after two untimed steps."""
    cpu = []
    batches = iter(loader)
    for i in range(steps + 2):
        start = time.thread_time()
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if i >= 2:
            cpu.append(time.thread_time() - start)
    return cpu


def bench(name: str, rounds: int, steps: int) -> dict[str, dict[str, float]]:
    torch.manual_seed(0)
    model, x, y = MODELS[name]()
    loader = DataLoader([(x, y)] * 4, batch_size=None, shuffle=True)  # whole batches, fetched as a loop fetches them
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    block(model, opt, loader, 3)
    cpu: dict[str, list[float]] = {c: [] for c in CONFIGS}
    ratios: dict[str, list[float]] = {c: [] for c in CONFIGS}
    added: list[float] = []
    for r in range(rounds):
        medians = {}
        for config in list(CONFIGS) if r % 2 == 0 else list(reversed(CONFIGS)):
            with CONFIGS[config](model, opt):
                c = block(model, opt, loader, steps)
            cpu[config] += c
            medians[config] = statistics.median(c)
        for config in CONFIGS:
            ratios[config].append(medians[config] / medians["baseline"])
        added.append(medians["watch"] / medians["watch-no-perf"])
    out = {c: {"cpu_ms": statistics.median(cpu[c]) * 1e3, "ratio": statistics.median(ratios[c])} for c in CONFIGS}
    out["added"] = {
        "ratio": statistics.median(added),
        "us": (statistics.median(cpu["watch"]) - statistics.median(cpu["watch-no-perf"])) * 1e6,
        "q1": statistics.quantiles(added, n=4)[0],
        "q3": statistics.quantiles(added, n=4)[2],
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--models", default="mlp,cnn,lm,tiny")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, {args.rounds} rounds x {args.steps} steps; batches from a DataLoader")
    print(
        f"{'model':<8}{'baseline ms':>12}{'no-perf':>10}{'watch':>10}{'watch/no-perf (quartiles)':>32}"
        f"{'added us/step':>15}   target"
    )
    for name in args.models.split(","):
        r = bench(name, args.rounds, args.steps)
        a = r["added"]
        print(
            f"{name:<8}{r['baseline']['cpu_ms']:>12.2f}{r['watch-no-perf']['ratio']:>9.3f}x{r['watch']['ratio']:>9.3f}x"
            f"{a['ratio']:>14.3f}x ({a['q1']:.3f}-{a['q3']:.3f}){a['us']:>15.1f}   "
            f"<= 1.03x {'ok' if a['ratio'] <= 1.03 else 'MISSED'}"
        )


if __name__ == "__main__":
    main()
