"""Benchmark: per-step time of a training loop with and without `torchdoctor.watch`, and under anomaly mode.

Run: python tests/benchmarks/bench_watch.py [--rounds N] [--models mlp3,mlp3-early,mlp,cnn,lm,cnn-compile]
CPU, one thread. Configurations are interleaved block by block in one process, so they share the
machine's state: baseline, watch (all default checks), and torch.autograd.set_detect_anomaly(True).
A watch block enters a fresh session; every block runs untimed steps first, then timed steps, and its cost is the
mean per step over all of them (the steps watch observes in full included, at their real rate). watch observes
every step of the first 32, then every `every`-th (10) up to step 100 * every, then every 10 * every-th, and runs
the set-up checks every 100 * every-th from there (`torchdoctor.watch.context`): `mlp3` is timed in that steady
state (1,000 untimed steps, then 1,000 timed: a whole period of each schedule), `mlp3-early` and the larger models
between steps 40 and 80 (1 step in 10 observed, the dearer phase; the larger models' steps are too long for a
thousand steps per block). Prints, per configuration, the mean ms/step and the median over rounds of each block's
ratio to the baseline block of the same round, both for the CPU time of the stepping thread (what the overhead is;
insensitive to other processes taking the CPU) and wall time, with the quartiles of the per-round CPU ratios to
show the noise of the machine. Targets with all default checks on: <= 1.03x on the 3-layer MLP whose step takes
about 1 ms (watch's fixed per-step cost), <= 1.10x on the 8-layer MLP, <= 1.03x on the CNN and the small LM, <=
1.05x on the CNN under torch.compile (inductor); the MLP's early phase is printed against 1.10x. Then a step
function that calls the model is compiled with fullgraph=True and run with and without a session: graph breaks and
compiled graphs (torch._dynamo.utils.counters) must be equal, i.e. watch adds 0 breaks and 0 recompiles.

CUDA mode: python tests/benchmarks/bench_watch.py --device cuda [--rounds N] [--warmup N] [--steps N]
[--models resnet50,lm]. A ResNet-50 (torchvision, batch 128 x 3 x 224 x 224) and a 6-layer transformer LM
(d=512, sequence 512, batch 32), AdamW, under fp16 autocast with GradScaler and under bf16 autocast. Baseline
and watch blocks alternate; a watch block enters a fresh session, runs `--warmup` untimed steps (40: past the
first 32, which watch observes in full) and then `--steps` timed steps (40: 1 in 10 observed), as the CPU
models' early phase. A block's time is taken between two torch.cuda.synchronize() calls, so it is the
GPU-bound time per step. Then 3 x every steps of each are run under
torch.cuda.set_sync_debug_mode("warn") to count host synchronisations per step, apart for the steps where
a periodic check is due (0, every, ...) and the others. Target: <= 1.03x per step, 0 extra syncs between checks.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import warnings
from typing import Callable, Iterator, Optional

import torch
from torch import nn

import torchdoctor

TARGETS = {"mlp3": 1.03, "mlp3-early": 1.10, "mlp": 1.10, "cnn": 1.03, "lm": 1.03, "cnn-compile": 1.05}
# (untimed, timed) steps per block: the steady state of a long run where a thousand steps are cheap, else the
# early phase (steps 40-80)
STEADY, EARLY = (1000, 1000), (40, 40)
PHASE = {"mlp3": STEADY}


def mlp3() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A plain 3-layer MLP (256 wide), batch 64: a step of about 1 ms, where watch's fixed per-step cost shows."""
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    return model, torch.randn(64, 256), torch.randint(0, 10, (64,))


def mlp() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """8 x Linear(512) + ReLU, batch 64 (about 18 ms/step on one thread of a laptop-class core)."""
    layers: list[nn.Module] = []
    for _ in range(8):
        layers += [nn.Linear(512, 512), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(512, 10)), torch.randn(64, 512), torch.randint(0, 10, (64,))


def cnn() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """2 x (Conv + BatchNorm + ReLU) 3 -> 32 -> 64, pooling, Linear; batch 32 x 3 x 32 x 32."""
    model = nn.Sequential(
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
    return model, torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))


def lm_cpu() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """TinyLM (vocabulary 2000, d=128, 2 layers, sequence 64) on batch 8: the LM loop at CPU size."""
    tokens = torch.randint(0, 2000, (8, 65))
    return TinyLM(vocab=2000, d=128, layers=2, seq=64), tokens[:, :-1], tokens[:, 1:].flatten()


def cnn_compiled() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The CNN under torch.compile (inductor), watched as the OptimizedModule users pass."""
    model, x, y = cnn()
    return torch.compile(model), x, y


CPU_MODELS: dict[str, Callable[[], tuple[nn.Module, torch.Tensor, torch.Tensor]]] = {
    "mlp3": mlp3,
    "mlp3-early": mlp3,
    "mlp": mlp,
    "cnn": cnn,
    "lm": lm_cpu,
    "cnn-compile": cnn_compiled,
}


def fullgraph_counts(steps: int = 20) -> dict[str, tuple[int, int]]:
    """(graph breaks, compiled graphs) of `steps` steps of a fullgraph=True compiled function that calls the
    model, without and with a watch session (every=1, so every periodic check runs)."""
    from torch._dynamo.utils import counters

    result = {}
    for config in ("baseline", "watch"):
        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        model, x, y = cnn()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        @torch.compile(fullgraph=True)
        def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return nn.functional.cross_entropy(model(x), y)  # noqa: B023 - called in this iteration only

        with CONFIGS[config](model, opt):
            for _ in range(steps):
                opt.zero_grad()
                loss_of(x, y).backward()
                opt.step()
        result[config] = (sum(counters["graph_break"].values()), counters["stats"]["unique_graphs"])
    return result


@contextlib.contextmanager
def baseline(model: nn.Module, opt: torch.optim.Optimizer) -> Iterator[None]:
    yield


@contextlib.contextmanager
def watched(model: nn.Module, opt: torch.optim.Optimizer) -> Iterator[None]:
    with torchdoctor.watch(model, opt, on_finding=lambda f: None, report=False) as session:
        yield
    if session.findings:
        raise SystemExit(f"the benchmark loop is not clean: {[f.name for f in session.findings]}")
    if not session.facts["optimizers"] or session.facts["optimizers"][0]["steps"] == 0:
        raise SystemExit("watch saw no optimizer step: it timed a loop it did not watch")


@contextlib.contextmanager
def anomaly(model: nn.Module, opt: torch.optim.Optimizer) -> Iterator[None]:
    torch.autograd.set_detect_anomaly(True)
    try:
        yield
    finally:
        torch.autograd.set_detect_anomaly(False)


CONFIGS: dict[str, Callable[..., contextlib.AbstractContextManager]] = {
    "baseline": baseline,
    "watch": watched,
    "detect_anomaly": anomaly,
}


def block(
    model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, steps: int, warmup: int
) -> tuple[float, float]:
    """Mean CPU time of the stepping thread and mean wall time per step over `steps` steps, after `warmup`
    untimed ones."""
    for i in range(steps + warmup):
        if i == warmup:
            start_cpu, start_wall = time.thread_time(), time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return (time.thread_time() - start_cpu) / steps, (time.perf_counter() - start_wall) / steps


def bench(name: str, rounds: int) -> dict[str, dict[str, float]]:
    """Per configuration: median over rounds of the mean CPU and wall ms/step, and of each block's ratio to
    the baseline block of the same round (adjacent blocks share the machine's load)."""
    torch.manual_seed(0)
    model, x, y = CPU_MODELS[name]()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    warmup, steps = PHASE.get(name, EARLY)
    cpu: dict[str, list[float]] = {c: [] for c in CONFIGS}
    wall: dict[str, list[float]] = {c: [] for c in CONFIGS}
    ratios: dict[str, dict[str, list[float]]] = {c: {"cpu": [], "wall": []} for c in CONFIGS}
    block(model, opt, x, y, 3, 2)  # warm up allocator and kernels
    for r in range(rounds):
        order = list(CONFIGS) if r % 2 == 0 else list(reversed(CONFIGS))
        for config in order:
            with CONFIGS[config](model, opt):
                c, w = block(model, opt, x, y, steps, warmup)
            cpu[config].append(c)
            wall[config].append(w)
        for config in CONFIGS:
            ratios[config]["cpu"].append(cpu[config][-1] / cpu["baseline"][-1])
            ratios[config]["wall"].append(wall[config][-1] / wall["baseline"][-1])
    return {
        c: {
            "cpu_ms": statistics.median(cpu[c]) * 1e3,
            "wall_ms": statistics.median(wall[c]) * 1e3,
            "cpu_ratio": statistics.median(ratios[c]["cpu"]),
            "wall_ratio": statistics.median(ratios[c]["wall"]),
            "cpu_iqr": _quartiles(ratios[c]["cpu"]),
        }
        for c in CONFIGS
    }


def _quartiles(values: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def resnet50() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """torchvision's ResNet-50, batch 128 x 3 x 224 x 224, 1000 classes."""
    from torchvision.models import resnet50 as build

    return build(), torch.randn(128, 3, 224, 224), torch.randint(0, 1000, (128,))


class TinyLM(nn.Module):
    """A causal transformer LM: embedding, 6 pre-norm encoder layers (d=512, 8 heads), tied output."""

    def __init__(self, vocab: int = 32000, d: int = 512, layers: int = 6, seq: int = 512) -> None:
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.zeros(seq, d))
        layer = nn.TransformerEncoderLayer(d, 8, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks, self.norm = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False), nn.LayerNorm(d)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.blocks(self.embed(tokens) + self.pos, mask=self.mask, is_causal=True)
        return (self.norm(h) @ self.embed.weight.T).flatten(0, 1)


def lm() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """TinyLM on batch 32 x 512 tokens; the targets are the flattened next tokens."""
    tokens = torch.randint(0, 32000, (32, 513))
    return TinyLM(), tokens[:, :-1], tokens[:, 1:].flatten()


def cuda_steps(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    scaler: Optional[torch.amp.GradScaler],
    dtype: torch.dtype,
    x: torch.Tensor,
    y: torch.Tensor,
    steps: int,
    each: Callable[[int], None] = lambda i: None,
) -> float:
    """Seconds per step of `steps` autocast training steps, the GPU's work included."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(steps):
        each(i)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype):
            loss = nn.functional.cross_entropy(model(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def count_syncs(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    scaler: Optional[torch.amp.GradScaler],
    dtype: torch.dtype,
    x: torch.Tensor,
    y: torch.Tensor,
    every: int,
) -> tuple[float, float]:
    """Mean host syncs per step over 3 x every steps: (steps with a periodic check due, the others)."""
    counts: list[int] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def mark(i: int) -> None:
            counts.append(len(caught))

        torch.cuda.set_sync_debug_mode("warn")
        try:
            cuda_steps(model, opt, scaler, dtype, x, y, 3 * every, mark)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        counts.append(len(caught))
    syncs = [b - a for a, b in zip(counts, counts[1:])]
    due = [n for i, n in enumerate(syncs) if i % every == 0]
    other = [n for i, n in enumerate(syncs) if i % every]
    return statistics.mean(due), statistics.mean(other)


def bench_cuda(name: str, dtype: torch.dtype, rounds: int, warmup: int, steps: int) -> None:
    """Print baseline and watch ms/step, their ratio (median over rounds), and syncs per step."""
    torch.manual_seed(0)
    model, x, y = {"resnet50": resnet50, "lm": lm}[name]()
    model, x, y = model.cuda(), x.cuda(), y.cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda") if dtype == torch.float16 else None
    cuda_steps(model, opt, scaler, dtype, x, y, 5)  # warm up cuDNN, cuBLAS and the allocator
    times: dict[str, list[float]] = {"baseline": [], "watch": []}
    for r in range(rounds):
        for config in ["baseline", "watch"] if r % 2 == 0 else ["watch", "baseline"]:
            with CONFIGS[config](model, opt):
                cuda_steps(model, opt, scaler, dtype, x, y, warmup)
                times[config].append(cuda_steps(model, opt, scaler, dtype, x, y, steps))
    ratio = statistics.median(w / b for w, b in zip(times["watch"], times["baseline"]))
    q1, q3 = _quartiles([w / b for w, b in zip(times["watch"], times["baseline"])])
    every = 10
    plain_due, plain_other = count_syncs(model, opt, scaler, dtype, x, y, every)
    with CONFIGS["watch"](model, opt):
        watch_due, watch_other = count_syncs(model, opt, scaler, dtype, x, y, every)
    label = str(dtype).removeprefix("torch.")
    print(
        f"{name:<9}{label:<9}{statistics.median(times['baseline']) * 1e3:>9.2f}"
        f"{statistics.median(times['watch']) * 1e3:>9.2f}{ratio:>8.3f}x{f'({q1:.3f}-{q3:.3f})':>16}"
        f"{plain_other:>7.1f}{watch_other:>7.1f}{plain_due:>7.1f}{watch_due:>7.1f}   "
        f"<= 1.03x {'ok' if ratio <= 1.03 else 'MISSED'}, {'ok' if watch_other <= plain_other else 'MISSED'}"
    )


def main_cuda(args: argparse.Namespace) -> None:
    print(
        f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {args.rounds} rounds x {args.warmup} untimed "
        f"+ {args.steps} timed steps"
    )
    print(
        f"{'model':<9}{'dtype':<9}{'base ms':>9}{'watch ms':>9}{'ratio':>9}{'(quartiles)':>16}"
        f"{'syncs/step between checks (base, watch)':>14}  and at checks (base, watch)"
    )
    for name in args.models.split(","):
        for dtype in (torch.float16, torch.bfloat16):
            bench_cuda(name, dtype, args.rounds, args.warmup, args.steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=40, help="untimed steps per block (cuda)")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per block (cuda)")
    parser.add_argument(
        "--models", default=None, help="default: mlp3,mlp,cnn,lm,cnn-compile (cpu) or resnet50,lm (cuda)"
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    if args.device == "cuda":
        args.models = args.models or "resnet50,lm"
        main_cuda(args)
        return
    args.models = args.models or "mlp3,mlp3-early,mlp,cnn,lm,cnn-compile"
    torch.set_num_threads(1)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread, {args.rounds} rounds; per block, untimed "
        f"then timed steps: {STEADY} for {', '.join(PHASE)}, {EARLY} for the others"
    )
    print(
        f"{'model':<12}{'configuration':<16}{'cpu ms':>8}{'ratio':>8}{'(quartiles)':>16}{'wall ms':>9}{'ratio':>8}"
        "   target (cpu)"
    )
    for name in args.models.split(","):
        for config, r in bench(name, args.rounds).items():
            target = ""
            if config == "watch":
                target = f"<= {TARGETS[name]:.2f}x {'ok' if r['cpu_ratio'] <= TARGETS[name] else 'MISSED'}"
            low, high = r["cpu_iqr"]
            print(
                f"{name:<12}{config:<16}{r['cpu_ms']:>8.2f}{r['cpu_ratio']:>7.3f}x{f'({low:.3f}-{high:.3f})':>16}"
                f"{r['wall_ms']:>9.2f}{r['wall_ratio']:>7.3f}x   {target}"
            )
    counts = fullgraph_counts()
    added = tuple(w - b for w, b in zip(counts["watch"], counts["baseline"]))
    print(
        f"fullgraph=True compiled step: (graph breaks, compiled graphs) baseline {counts['baseline']}, "
        f"watch {counts['watch']}: added {added} {'ok' if added == (0, 0) else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
