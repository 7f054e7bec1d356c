"""Benchmark: per-step cost of the "why doesn't it learn?" runtime checks (issue 26) on their own.

Run: python tests/benchmarks/bench_learn_checks.py [--rounds N] [--steps N] [--models cnn,lm]
CPU, one thread, the loops and models of bench_watch.py (whose block loss is `cross_entropy`, so the loss tap
runs on every step). Blocks interleave in one process: baseline, and a watch session with only
softmax-before-cross-entropy, sigmoid-before-bce-with-logits, loss-shape-broadcast, unshuffled-training-data
and update-underflow enabled (every=10). Prints, per model, the median over rounds of the ratio of each
block's mean CPU time per step (the stepping thread's, periodic steps included) to the baseline block of the
same round, with its quartiles. Target: <= 1.03x
(watch's per-step budget, which these checks share with the others).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from typing import Iterator

import torch
from bench_watch import CPU_MODELS, block
from torch import nn

import torchdoctor

CHECKS = [
    "softmax-before-cross-entropy",
    "sigmoid-before-bce-with-logits",
    "loss-shape-broadcast",
    "unshuffled-training-data",
    "update-underflow",
]


@contextlib.contextmanager
def learn_checks(model: nn.Module, opt: torch.optim.Optimizer) -> Iterator[None]:
    with torchdoctor.watch(model, opt, checks=CHECKS, on_finding=lambda f: None, report=False) as session:
        yield
    if session.findings:
        raise SystemExit(f"the benchmark loop is not clean: {[f.name for f in session.findings]}")


def bench(name: str, rounds: int, steps: int) -> tuple[float, tuple[float, float]]:
    torch.manual_seed(0)
    model, x, y = CPU_MODELS[name]()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    block(model, opt, x, y, 3, 2)
    ratios = []
    for r in range(rounds):
        means = {}
        for config in ["baseline", "watch"] if r % 2 == 0 else ["watch", "baseline"]:
            with learn_checks(model, opt) if config == "watch" else contextlib.nullcontext():
                means[config], _ = block(model, opt, x, y, steps, 2)
        ratios.append(means["watch"] / means["baseline"])
    q = statistics.quantiles(ratios, n=4)
    return statistics.median(ratios), (q[0], q[2])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--models", default="cnn,lm")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in args.models.split(","):
        ratio, (lo, hi) = bench(name, args.rounds, args.steps)
        print(f"{name:4s} issue-26 checks / baseline, mean CPU per step: {ratio:.3f}x (quartiles {lo:.3f}-{hi:.3f})")


if __name__ == "__main__":
    main()
