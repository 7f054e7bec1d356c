"""Benchmark `torchdoctor lint` on a generated corpus of training scripts, against TorchFix on the same files.

Run:  pip install torchfix   # benchmark-only dependency
      python tests/benchmarks/bench_lint.py [--files 1200] [--torchfix-sample 60]

The corpus mixes classifier, GAN, fine-tuning, DDP, gradient-accumulation, RNN, Lightning and evaluation
scripts (40-150 lines each, some with planted pitfalls). Throughput is in files per second of wall time,
through the CLI as a user runs it (start-up included, bytecode cached as after an install):
- cold: `--no-cache`, every file parsed and checked (the figure to compare with TorchFix, which has no cache);
- warm: the re-run "on every save", with the results cache filled by an earlier run, unchanged and with one
  file edited.
TorchFix runs through its CLI (`--select ALL`, default jobs) on a random sample of the same corpus, since it
needs minutes for the whole of it. Also printed: in-process throughput and what `ast.parse` alone manages,
the ceiling of any ast-based linter on this machine, and the cold cost as a multiple of that bare parse.
Targets: cold <= 2x a bare `ast.parse`, warm >= 3,000 files/s on 1,200 files, >= 50x TorchFix.
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEADER = """import argparse
import os
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
"""

MODEL = """

class {cls}(nn.Module):
    def __init__(self, in_dim={d}, hidden={h}, classes={c}):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_dim, hidden),
            nn.ReLU(),
            nn.Dropout({p}),
            nn.Linear(hidden, hidden),
            nn.BatchNorm1d(hidden),
            nn.ReLU(),
        )
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.head(self.net(x.flatten(1)))
"""

DATASET = """

class {cls}Data(Dataset):
    def __init__(self, n={n}, dim={d}):
        self.x = torch.randn(n, dim)
        self.y = torch.randint(0, {c}, (n,))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]
"""

TRAIN = """

def train_one_epoch(model, loader, optimizer, criterion, device, log_every={k}):
    model.train()
    running = 0.0
    for step, (inputs, targets) in enumerate(loader):
        inputs, targets = inputs.to(device), targets.to(device)
        {zero}
        outputs = model(inputs)
        loss = criterion(outputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), {clip})
        optimizer.step()
        running += {acc}
        if step % log_every == 0:
            print(f"step {{step}} loss {{loss.item():.4f}}")
    return running / max(1, len(loader))
"""

EVALUATE = """

{deco}def evaluate(model, loader, device):
    model.eval()
    correct, total = 0, 0
    for inputs, targets in loader:
        inputs, targets = inputs.to(device), targets.to(device)
        preds = model(inputs).argmax(dim=1)
        correct += (preds == targets).sum().item()
        total += targets.numel()
    return correct / max(1, total)
"""

ACCUM = """

def train_accumulated(model, loader, optimizer, scaler, accum={k}):
    optimizer.zero_grad(set_to_none=True)
    for i, (x, y) in enumerate(loader):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y) / accum
        scaler.scale(loss).backward()
        if (i + 1) % accum == 0:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
"""

GAN = """

def train_gan(netG, netD, loader, epochs={e}, nz={nz}):
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    bce = nn.BCEWithLogitsLoss()
    for epoch in range(epochs):
        for real, _ in loader:
            optD.zero_grad()
            noise = torch.randn(real.size(0), nz)
            fake = netG(noise)
            lossD = bce(netD(real), torch.ones(real.size(0), 1)) + bce(netD(fake.detach()), torch.zeros(real.size(0), 1))
            lossD.backward()
            optD.step()
            {gzero}
            lossG = bce(netD(fake), torch.ones(real.size(0), 1))
            lossG.backward()
            optG.step()
"""  # noqa: E501 - the fixture's own line

LIGHTNING = """

class Lit{cls}:
    def __init__(self, model, lr={lr}):
        self.model = model
        self.lr = lr
        self.epoch_loss = 0.0

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.model(x), y)
        self.epoch_loss += {acc}
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.model.parameters(), lr=self.lr)
"""

MAIN = """

def main():
    parser = argparse.ArgumentParser(description="{desc}")
    parser.add_argument("--epochs", type=int, default={e})
    parser.add_argument("--lr", type=float, default={lr})
    parser.add_argument("--batch-size", type=int, default={bs})
    {rank}
    args = parser.parse_args()
    torch.manual_seed({seed})
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = {cls}Data()
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers={w})
    model = {cls}().to(device)
    optimizer = torch.optim.{opt}(model.parameters(), lr=args.lr)
    criterion = nn.CrossEntropyLoss()
    {resume}
    for epoch in range(args.epochs):
        loss = train_one_epoch(model, loader, optimizer, criterion, device)
        acc = evaluate(model, loader, device)
        print(f"epoch {{epoch}}: loss {{loss:.3f}} acc {{acc:.3f}}")
    torch.save(model.state_dict(), "{cls}.pt")


if __name__ == "__main__":
    main()
"""


def script(rng: random.Random, i: int) -> str:
    """One realistic training script; about one in five carries a planted pitfall."""
    cls = rng.choice(["Net", "MLP", "Classifier", "TabularNet", "Encoder"]) + str(i)
    planted = rng.random() < 0.2
    parts = [
        HEADER,
        MODEL.format(
            cls=cls, d=rng.choice([32, 64, 784]), h=rng.choice([128, 256]), c=10, p=rng.choice([0.1, 0.2, 0.5])
        ),
        DATASET.format(cls=cls, n=rng.choice([512, 1024]), d=rng.choice([32, 64, 784]), c=10),
    ]
    parts.append(
        TRAIN.format(
            k=rng.choice([10, 50]),
            clip=rng.choice([1.0, 5.0]),
            zero="" if planted and rng.random() < 0.5 else "optimizer.zero_grad(set_to_none=True)",
            acc="loss" if planted and rng.random() < 0.5 else "loss.item()",
        )
    )
    parts.append(EVALUATE.format(deco="" if planted else "@torch.no_grad()\n"))
    for extra in rng.sample([ACCUM, GAN, LIGHTNING], k=rng.randint(0, 2)):
        parts.append(
            extra.format(
                k=rng.choice([2, 4, 8]),
                e=rng.choice([5, 25]),
                nz=rng.choice([64, 100]),
                gzero="optG.zero_grad()" if not planted else "",
                cls=cls,
                lr=1e-3,
                acc="loss.detach()" if not planted else "loss",
            )
        )
    parts.append(
        MAIN.format(
            desc=f"train {cls}",
            e=rng.choice([10, 30]),
            lr=rng.choice([1e-3, 3e-4]),
            bs=rng.choice([32, 64, 128]),
            seed=i,
            cls=cls,
            w=rng.choice([0, 2, 4]),
            opt=rng.choice(["SGD", "Adam", "AdamW"]),
            rank='parser.add_argument("--local_rank", type=int, default=0)' if planted else "",
            resume='optimizer.load_state_dict(torch.load("opt.pt"))' if rng.random() < 0.3 else "",
        )
    )
    return "".join(parts)


def make_corpus(root: Path, count: int, seed: int = 0) -> list[Path]:
    rng = random.Random(seed)
    paths = []
    for i in range(count):
        path = root / f"project{i % 20}" / f"train_{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(script(rng, i), encoding="utf-8")
        paths.append(path)
    return paths


def run_cli(cmd: list[str], env: dict[str, str]) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall seconds, CPU seconds (the command and every process it waited for) and the result of `cmd`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc


def best_cli(
    cmd: list[str], env: dict[str, str], rounds: int = 3, before=None
) -> tuple[float, float, subprocess.CompletedProcess]:
    """The fastest of `rounds` runs of `cmd` (calling `before()` ahead of each)."""
    runs = []
    for _ in range(rounds):
        if before is not None:
            before()
        runs.append(run_cli(cmd, env))
    return min(runs, key=lambda r: r[0])


FINDING = re.compile(r"^(?P<file>\S[^:]*):\d+:\d+: (?P<code>TD\d+) (?P<name>[a-z0-9-]+) ")


def findings_of(proc: subprocess.CompletedProcess, what: str) -> dict[str, set[str]]:
    """File name -> names of the findings in `--format text` output, once the run is known to have worked (exit
    0 under --fail-on never, nothing on stderr): a timed failure must never read as a result."""
    if proc.returncode != 0 or proc.stderr.strip():
        raise SystemExit(f"{what}: the command failed (exit {proc.returncode}): {proc.stderr.strip()[:500]}")
    found: dict[str, set[str]] = {}
    for line in proc.stdout.splitlines():
        match = FINDING.match(line)
        if match:
            found.setdefault(os.path.basename(match["file"]), set()).add(match["name"])
    return found


def check_found(found: dict[str, set[str]], paths: list[Path], texts: list[str], what: str) -> int:
    """The planted scripts (they take `--local_rank`) and only they have local-rank-argument; returns the
    number of findings."""
    planted = {p.name for p, t in zip(paths, texts) if '"--local_rank"' in t}
    flagged = {name for name, names in found.items() if "local-rank-argument" in names}
    if flagged != planted:
        raise SystemExit(
            f"{what}: local-rank-argument on {len(flagged)} files, planted in {len(planted)} "
            f"(missed {sorted(planted - flagged)[:3]}, extra {sorted(flagged - planted)[:3]})"
        )
    return sum(len(names) for names in found.values())


def measured(fn, runs: int = 3) -> tuple[float, float]:
    """Best wall and CPU seconds of `fn` over `runs` runs in this process."""
    times = []
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        times.append((time.perf_counter() - wall, time.process_time() - cpu))
    return min(t[0] for t in times), min(t[1] for t in times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1200)
    parser.add_argument("--torchfix-sample", type=int, default=60)
    args = parser.parse_args()

    from torchdoctor import registry
    from torchdoctor.lint.runner import lint_paths, usable_cpus

    root = Path(tempfile.mkdtemp(prefix="td-lint-bench-"))
    try:
        paths = make_corpus(root / "corpus", args.files)
        texts = [p.read_text() for p in paths]
        lines = sum(t.count("\n") for t in texts)
        n = len(paths)
        print(f"corpus: {n} files, {lines} lines ({lines / n:.0f} lines/file); {usable_cpus()} CPUs")
        checks = registry.all_checks(registry.Scope.SOURCE)
        corpus = [str(root / "corpus")]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(TORCHDOCTOR_CACHE_DIR=str(root / "cache"), PYTHONPYCACHEPREFIX=str(root / "pycache"), NO_COLOR="1")
        lint_cmd = [sys.executable, "-m", "torchdoctor", "lint", "--format", "text", "--fail-on", "never"]
        run_cli(lint_cmd + ["--no-cache", str(paths[0])], env)  # write the bytecode, as an install does

        wall, cpu, proc = best_cli(lint_cmd + ["--no-cache"] + corpus, env)
        ours_cli = n / wall
        found = check_found(findings_of(proc, "cold lint"), paths, texts, "cold lint")
        print(
            f"torchdoctor lint CLI, cold (--no-cache; start-up included): {wall:.2f} s wall = {ours_cli:.0f} files/s; "
            f"{n / cpu:.0f} files per CPU-second; {found} findings (the planted ones found)"
        )
        cold_output = proc.stdout
        run_cli(lint_cmd + corpus, env)  # fills the cache
        wall, _, proc = best_cli(lint_cmd + corpus, env)
        findings_of(proc, "warm lint")
        assert proc.stdout == cold_output, "cached results differ from a cold run"
        print(f"torchdoctor lint CLI, warm (re-run, nothing changed): {wall:.2f} s wall = {n / wall:.0f} files/s")
        edited, original = paths[len(paths) // 2], texts[len(paths) // 2]
        edits = iter(range(1_000_000))
        wall, _, proc = best_cli(
            lint_cmd + corpus,
            env,
            before=lambda: edited.write_text(original + f"# edit {next(edits)}\n", encoding="utf-8"),
        )
        edited.write_text(original, encoding="utf-8")
        check_found(findings_of(proc, "warm lint after an edit"), paths, texts, "warm lint after an edit")
        print(f"torchdoctor lint CLI, warm (re-run after editing one file): {wall:.2f} s wall = {n / wall:.0f} files/s")

        result = lint_paths(corpus, checks, cache=None)
        in_process = {}
        for f in result.findings:
            if "failed internally" in f.message:
                raise SystemExit(f"in-process lint: {f.message}")
            in_process.setdefault(os.path.basename(f.location.file), set()).add(f.name)
        check_found(in_process, paths, texts, "in-process lint")
        wall, _ = measured(lambda: lint_paths(corpus, checks))
        print(
            f"torchdoctor lint in-process, no cache, {usable_cpus()} workers: {n / wall:.0f} files/s, "
            f"{lines / wall:.0f} lines/s"
        )
        ratios, lint_cpu, parse_cpu = [], [], []
        for _ in range(5):  # back to back in each round, so a change in the machine's speed hits both alike
            lint_cpu.append(measured(lambda: lint_paths(corpus, checks, jobs=1), runs=1)[1])
            parse_cpu.append(measured(lambda: [ast.parse(t) and None for t in texts], runs=1)[1])
            ratios.append(lint_cpu[-1] / parse_cpu[-1])
        ours_cpu = n / min(lint_cpu)
        print(f"torchdoctor lint in-process, no cache, one process: {ours_cpu:.0f} files per CPU-second (best of 5)")
        print(
            f"ast.parse alone: {n / min(parse_cpu):.0f} files per CPU-second (best of 5; x {usable_cpus()} CPUs: the "
            "cold ceiling of any ast-based linter here)"
        )
        print(
            f"cold cost / bare ast.parse of the same files: {statistics.median(ratios):.2f}x median of 5 rounds "
            f"(range {min(ratios):.2f}-{max(ratios):.2f}; target <= 2; CPU time, one process, reading, parsing, "
            "indexing and every check, each round's lint and parse back to back)"
        )

        torchfix = shutil.which("torchfix")
        if torchfix is None:
            print("torchfix is not installed (pip install torchfix): no baseline")
            return
        sample = random.Random(1).sample(paths, min(args.torchfix_sample, n))
        sample_dir = root / "sample"
        for p in sample:
            target = sample_dir / p.parent.name / p.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(p, target)
        tf_wall, tf_cpu, tf_proc = run_cli([torchfix, "--select", "ALL", str(sample_dir)], env)
        tf_findings = sum(1 for line in tf_proc.stdout.splitlines() if ": TOR" in line)
        theirs, theirs_cpu = len(sample) / tf_wall, len(sample) / tf_cpu
        print(
            f"torchfix --select ALL CLI on a {len(sample)}-file sample: {tf_wall:.1f} s wall = {theirs:.2f} files/s; "
            f"{theirs_cpu:.2f} files per CPU-second; {tf_findings} findings"
        )
        wall, cpu, proc = run_cli(lint_cmd + ["--no-cache", str(sample_dir)], env)
        findings_of(proc, "cold lint of the sample")
        print(
            f"torchdoctor lint CLI, cold, on the same sample: {wall:.2f} s wall, {cpu:.2f} CPU-s "
            f"({tf_wall / wall:.0f}x faster wall, {tf_cpu / cpu:.0f}x less CPU, start-up included)"
        )
        print(
            f"throughput ratio, cold: {ours_cli / theirs:.0f}x TorchFix (files/s, CLI, wall); "
            f"{ours_cpu / theirs_cpu:.0f}x (files per CPU-second)"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
