"""Benchmark: per-step time of a 2-rank gloo DDP training loop with and without `torchdoctor.watch`.

Run: python tests/benchmarks/bench_watch_ddp.py [--rounds N] [--steps N] [--models mlp,cnn] [--every N]
It starts two ranks on 127.0.0.1 (one CPU thread each; TORCH_DISTRIBUTED_DEBUG unset). Both ranks run
the same blocks in the same order, interleaved in one run (the order rotates every round): baseline;
watch with all default checks; watch without the four ddp checks (what the distributed part adds is the
difference of the two). Every block starts with two untimed steps; a watch block enters a fresh session
(every=10 unless --every says otherwise), whose side group connects at the first exchange, step 0, an
untimed step, while the later exchanges (steps 10, 20, ...) fall on timed steps at their usual rate.
DDP synchronises the ranks at every step, so rank 0's times are the job's. Printed: mean wall ms/step;
the median over rounds of each block's ratio to the baseline block of the same round (wall, with
quartiles to show the noise of the shared machine; and CPU time of the stepping thread, which ignores
other processes but also the time spent waiting for the other rank); and what one session costs once
beyond its steps (start, stop with the gathering of findings, connecting). Target: watch <= 1.05x.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import torchdoctor

TARGET = 1.05


def mlp() -> nn.Module:
    """4 x Linear(256) + ReLU; batch 64 per rank."""
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(256, 10))


def cnn() -> nn.Module:
    """2 x (Conv + BatchNorm + ReLU) 3 -> 32 -> 64, pooling, Linear; batch 32 x 3 x 32 x 32 per rank."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(64 * 16, 10),
    )


def batches(name: str, rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Four different batches per rank (each rank its own shard, as with a DistributedSampler)."""
    g = torch.Generator().manual_seed(100 + rank)
    shape = (64, 256) if name == "mlp" else (32, 3, 32, 32)
    return [(torch.randn(*shape, generator=g), torch.randint(0, 10, (shape[0],), generator=g)) for _ in range(4)]


def block(
    model: nn.Module, opt: torch.optim.Optimizer, data: list, steps: int
) -> tuple[list[float], list[float], float]:
    """Wall and CPU time (of the stepping thread) of each timed step, and wall time of the two untimed
    steps before them together."""
    wall, cpu, untimed = [], [], 0.0
    for i in range(steps + 2):
        x, y = data[i % len(data)]
        start, start_cpu = time.perf_counter(), time.thread_time()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if i >= 2:
            wall.append(time.perf_counter() - start)
            cpu.append(time.thread_time() - start_cpu)
        else:
            untimed += time.perf_counter() - start
    return wall, cpu, untimed


DISTRIBUTED = ["ddp-buffer-desync", "ddp-param-desync", "ddp-same-data", "syncbn-missing"]
CONFIGS = {"baseline": None, "watch": [], "watch, no ddp checks": DISTRIBUTED}  # config -> checks ignored


def bench(name: str, rank: int, rounds: int, steps: int, every: int) -> dict[str, dict[str, float]]:
    """Per configuration: mean wall ms/step, and the median over rounds of the block's wall and CPU time
    ratio to the baseline block of the same round; for watch blocks, what a session costs once."""
    torch.manual_seed(0)
    model = DDP({"mlp": mlp, "cnn": cnn}[name]())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = batches(name, rank)
    block(model, opt, data, 3)  # warm up allocator, kernels and DDP's buckets
    walls: dict[str, list[float]] = {c: [] for c in CONFIGS}
    ratios: dict[str, dict[str, list[float]]] = {c: {"wall": [], "cpu": [], "session": []} for c in CONFIGS}
    for r in range(rounds):
        means, untimed, edges = {}, {}, {}
        for config in list(CONFIGS)[r % 3 :] + list(CONFIGS)[: r % 3]:  # rotate the order
            if CONFIGS[config] is None:
                wall, cpu, untimed[config] = block(model, opt, data, steps)
            else:
                session = torchdoctor.watch(
                    model, opt, every=every, on_finding=lambda f: None, report=False, ignore=CONFIGS[config]
                )
                start = time.perf_counter()
                session.start()
                entered = time.perf_counter() - start
                wall, cpu, untimed[config] = block(model, opt, data, steps)
                start = time.perf_counter()
                session.stop()
                edges[config] = entered + time.perf_counter() - start
                watched_steps = session.facts["optimizers"][0]["steps"]  # a loop it did not watch is no result
                if session.findings or session.facts["ranks"]["missing"] or watched_steps != steps + 2:
                    raise SystemExit(
                        f"rank {rank}: the benchmark loop is not clean: "
                        f"{[f.message for f in session.findings]} {session.facts['ranks']}"
                    )
            walls[config] += wall
            means[config] = (statistics.mean(wall), statistics.mean(cpu))
        for config in CONFIGS:
            ratios[config]["wall"].append(means[config][0] / means["baseline"][0])
            ratios[config]["cpu"].append(means[config][1] / means["baseline"][1])
            if config in edges:  # the side group connects at step 0, one of the untimed steps
                ratios[config]["session"].append(edges[config] + untimed[config] - untimed["baseline"])
    out = {}
    for config in CONFIGS:
        q1, _, q3 = statistics.quantiles(ratios[config]["wall"], n=4)
        out[config] = {
            "ms": statistics.mean(walls[config]) * 1e3,
            "ratio": statistics.median(ratios[config]["wall"]),
            "q1": q1,
            "q3": q3,
            "cpu_ratio": statistics.median(ratios[config]["cpu"]),
            "session_ms": statistics.median(ratios[config]["session"]) * 1e3 if edges.get(config) else None,
        }
    return out


def rank_main(args: argparse.Namespace) -> None:
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", FutureWarning)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    results = {name: bench(name, rank, args.rounds, args.steps, args.every) for name in args.models.split(",")}
    dist.barrier()
    if rank == 0:
        print(
            f"torch {torch.__version__}, 2 ranks (gloo, 127.0.0.1), 1 thread each, {args.rounds} rounds x "
            f"{args.steps} steps, every={args.every}"
        )
        print(
            f"{'model':<6}{'configuration':<22}{'ms/step':>9}{'ratio':>8}{'(quartiles)':>16}{'cpu ratio':>10}"
            f"{'session ms':>12}   target (wall per step)"
        )
        for name, configs in results.items():
            for config, r in configs.items():
                quartiles = f"({r['q1']:.3f}-{r['q3']:.3f})"
                session = f"{r['session_ms']:.1f}" if r["session_ms"] is not None else ""
                target = f"<= {TARGET:.2f}x {'ok' if r['ratio'] <= TARGET else 'MISSED'}" if config == "watch" else ""
                print(
                    f"{name:<6}{config:<22}{r['ms']:>9.2f}{r['ratio']:>7.3f}x{quartiles:>16}{r['cpu_ratio']:>9.3f}x"
                    f"{session:>12}   {target}"
                )
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--every", type=int, default=10)
    args = parser.parse_args()
    if "RANK" in os.environ:
        rank_main(args)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DISTRIBUTED_DEBUG"}
    env.update(WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, __file__, *sys.argv[1:]], env={**env, "RANK": str(r)}) for r in range(2)]
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
