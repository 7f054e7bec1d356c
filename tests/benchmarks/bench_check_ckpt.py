"""Benchmark: `torchdoctor check-ckpt` against `torch.load(weights_only=True)` (and with mmap) on a ~1 GiB state_dict.

Run: python tests/benchmarks/bench_check_ckpt.py [--rounds N] [--mib SIZE] [--scan-values]
Both commands run as fresh processes (what a user types), interleaved round by round in one run so
they share the machine's state and page cache, with bytecode cached as after an install (even when
PYTHONDONTWRITEBYTECODE is set here); wall time (median), peak RSS and CPU time (user + system: what a
busy machine disturbs least), of that process alone from wait4, are printed with the ratios, plus the same
work in-process without interpreter start-up. Targets: <= 0.05x torch.load's wall time (the same file, the
same run), no slower than torch.load(mmap=True, weights_only=True), <= 50 MB RSS.

With --many it times instead the per-entry cost on two many-entry files (issue 11): a safetensors file
whose header has 300,000 entries (against json.loads of that header alone) and a torch zip of 50,000
tiny tensors (against torch.load(weights_only=True)); target <= 1 s of check-ckpt work for each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time


def build(path: str, mib: int) -> int:
    """A state_dict of 4 MiB fp32 tensors totalling `mib` MiB, written by torch.save (in a child process)."""
    code = (
        "import sys, torch\n"
        "n = int(sys.argv[2]) // 4\n"
        "sd = {f'layers.{i}.weight': torch.randn(1024, 1024) for i in range(n)}\n"
        "torch.save(sd, sys.argv[1])\n"
    )
    subprocess.run([sys.executable, "-c", code, path, str(mib)], check=True, timeout=600)
    return os.path.getsize(path)


def build_many_safetensors(path: str, entries: int = 300_000) -> int:
    """A safetensors file of `entries` one-element fp32 tensors (written directly: no torch needed)."""
    header: dict[str, object] = {
        f"model.layers.{i}.weight": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
        for i in range(entries)
    }
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob + bytes(4 * entries))
    return os.path.getsize(path)


def build_many_zip(path: str, tensors: int = 50_000) -> int:
    """A torch.save zip of `tensors` two-element fp32 tensors (in a child process)."""
    code = (
        "import sys, torch\n"
        "torch.save({f'layers.{i}.weight': torch.zeros(2) for i in range(int(sys.argv[2]))}, sys.argv[1])\n"
    )
    subprocess.run([sys.executable, "-c", code, path, str(tensors)], check=True, timeout=600)
    return os.path.getsize(path)


JSON_HEADER_SCRIPT = (  # the floor for a safetensors reader: decoding the header, nothing else
    "import json, struct, sys, time\n"
    "t = time.perf_counter()\n"
    "with open(sys.argv[1], 'rb') as f:\n"
    "    json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))\n"
    "print(time.perf_counter() - t)\n"
)


def many_entries(rounds: int) -> None:
    """Time check-ckpt (in-process, imports excluded) on the two many-entry files against their baselines."""
    with tempfile.TemporaryDirectory() as tmp:
        env = child_env(os.path.join(tmp, "pycache"))
        cases = [
            (
                "safetensors, 300,000 header entries",
                os.path.join(tmp, "many.safetensors"),
                build_many_safetensors,
                "json.loads(header)",
                JSON_HEADER_SCRIPT,
            ),
            (
                "torch zip, 50,000 tiny tensors",
                os.path.join(tmp, "many.pt"),
                build_many_zip,
                "torch.load(weights_only=True)",
                OP_SCRIPTS["torch.load (in-process)"],
            ),
        ]
        for title, path, build_file, base_name, base_script in cases:
            size = build_file(path)
            ours = [op_time(OP_SCRIPTS["check-ckpt (in-process)"], path, env) for _ in range(rounds)]
            base = [op_time(base_script, path, env) for _ in range(rounds)]
            command = [sys.executable, "-m", "torchdoctor", "check-ckpt", "--format", "json", path]
            verified(command, env, 300_000 if path.endswith(".safetensors") else 50_000)
            cli = [measure(command, env)[0] for _ in range(rounds)]
            ours_med, base_med = statistics.median(ours), statistics.median(base)
            print(f"{title} ({size / 2**20:.1f} MiB), {rounds} rounds:")
            print(f"  check-ckpt (in-process) median {ours_med:.3f} s (min {min(ours):.3f})  target <= 1 s")
            print(f"  {base_name:29s} median {base_med:.3f} s; ratio {ours_med / base_med:.2f}x")
            print(f"  check-ckpt CLI wall median {statistics.median(cli):.3f} s (interpreter start-up included)")


def child_env(pycache: str) -> dict[str, str]:
    """As after a normal install: bytecode cached (in a temp dir here, so the checkout stays clean)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "NO_COLOR": "1", "PYTHONPYCACHEPREFIX": pycache}


def measure(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int, float]:
    """(wall seconds, peak RSS in MiB, exit code, CPU seconds: user + system) of one fresh process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss / 1024, proc.returncode, usage.ru_utime + usage.ru_stime


OP_SCRIPTS = {
    # the same work without interpreter start-up and imports: reading + checks vs the load itself
    "check-ckpt (in-process)": (
        "import sys, time\n"
        "from torchdoctor import registry\n"
        "from torchdoctor.ckpt.api import diagnose_checkpoints\n"
        "import torchdoctor.ckpt.reader, torchdoctor.ckpt.structure  # imports outside the timed part\n"
        "checks = registry.all_checks('checkpoint')\n"
        "t = time.perf_counter(); r = diagnose_checkpoints([sys.argv[1]], checks); print(time.perf_counter() - t)\n"
        "facts = r.facts['checkpoints'][0]  # a failed read must never be timed as a result\n"
        "assert r.exit_code() == 0 and facts['format'] != 'unreadable' and facts['tensors']['count'] > 0, r.findings\n"
    ),
    "torch.load (in-process)": (
        "import sys, time, torch\n"
        "t = time.perf_counter(); torch.load(sys.argv[1], weights_only=True); print(time.perf_counter() - t)\n"
    ),
    "torch.load mmap (in-process)": (
        "import sys, time, torch\n"
        "t = time.perf_counter(); torch.load(sys.argv[1], weights_only=True, mmap=True)\n"
        "print(time.perf_counter() - t)\n"
    ),
}


def verified(cmd: list[str], env: dict[str, str], tensors: int) -> None:
    """Run a `check-ckpt --format json` command once and check that it worked and read every tensor: the timed
    runs discard the output, and a failed run must never be timed as a result."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        raise SystemExit(f"{' '.join(cmd[2:4])} failed (exit {proc.returncode}): {proc.stderr.strip()[:500]}") from None
    [facts] = doc["facts"]["checkpoints"]
    if proc.returncode != 0 or doc["findings"] or facts["tensors"]["count"] != tensors:
        raise SystemExit(
            f"{' '.join(cmd[2:4])}: exit {proc.returncode}, {facts['tensors']['count']} of {tensors} "
            f"tensors read, findings {[f['message'][:200] for f in doc['findings']]}"
        )


def op_time(script: str, path: str, env: dict[str, str]) -> float:
    out = subprocess.run(
        [sys.executable, "-c", script, path], capture_output=True, text=True, check=True, timeout=600, env=env
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mib", type=int, default=1024, help="size of the state_dict in MiB")
    parser.add_argument("--scan-values", action="store_true", help="also time check-ckpt --scan-values")
    parser.add_argument(
        "--many",
        action="store_true",
        help="time the many-entry files (300k-entry safetensors header, 50k tiny tensors) instead",
    )
    args = parser.parse_args()
    if args.many:
        many_entries(args.rounds)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "big.pt")
        size = build(path, args.mib)
        commands = {
            "check-ckpt": [sys.executable, "-m", "torchdoctor", "check-ckpt", "--format", "json", path],
            # the default console report (off a terminal here, as when piped): what a user types, rich included
            "check-ckpt (console)": [sys.executable, "-m", "torchdoctor", "check-ckpt", path],
            "torch.load": [sys.executable, "-c", f"import torch; torch.load({path!r}, weights_only=True)"],
            "torch.load mmap": [
                sys.executable,
                "-c",
                f"import torch; torch.load({path!r}, weights_only=True, mmap=True)",
            ],
        }
        if args.scan_values:
            commands["check-ckpt --scan-values"] = [*commands["check-ckpt"], "--scan-values"]
        env = child_env(os.path.join(tmp, "pycache"))
        for name, cmd in commands.items():  # warm the page cache and bytecode once, and check what is timed
            if name.startswith("check-ckpt") and "--format" in cmd:
                verified(cmd, env, args.mib // 4)
            else:
                measure(cmd, env)
        walls: dict[str, list[float]] = {k: [] for k in commands}
        rss: dict[str, list[float]] = {k: [] for k in commands}
        cpu: dict[str, list[float]] = {k: [] for k in commands}
        ops: dict[str, list[float]] = {k: [] for k in OP_SCRIPTS}
        for _ in range(args.rounds):
            for name, cmd in commands.items():
                wall, peak, code, seconds = measure(cmd, env)
                if code != 0:
                    raise SystemExit(f"{name} failed with exit code {code}")
                walls[name].append(wall)
                rss[name].append(peak)
                cpu[name].append(seconds)
            for name, script in OP_SCRIPTS.items():
                ops[name].append(op_time(script, path, env))
    print(
        f"file: {size / 2**30:.2f} GiB state_dict ({args.mib // 4} fp32 tensors), {args.rounds} rounds, "
        f"python {sys.version.split()[0]}"
    )
    med = {k: statistics.median(v) for k, v in walls.items()}
    for name in commands:
        print(
            f"{name:26s} wall median {med[name]:.3f} s (min {min(walls[name]):.3f}, max {max(walls[name]):.3f})"
            f"  CPU median {statistics.median(cpu[name]):.3f} s  peak RSS {max(rss[name]):.1f} MiB"
        )
    op_med = {k: statistics.median(v) for k, v in ops.items()}
    for name, value in op_med.items():
        print(f"{name:26s} median {value * 1000:.1f} ms (imports excluded)")
    ratio = med["check-ckpt"] / med["torch.load"]
    print(f"check-ckpt / torch.load wall = {ratio:.3f}x  (target <= 0.05x)")
    cpu_ratio = statistics.median(cpu["check-ckpt"]) / statistics.median(cpu["torch.load"])
    print(f"check-ckpt / torch.load CPU time (user + system) = {cpu_ratio:.3f}x  (less sensitive to a busy machine)")
    console_cpu = statistics.median(cpu["check-ckpt (console)"]) / statistics.median(cpu["torch.load"])
    print(
        f"check-ckpt (console report) / torch.load: wall {med['check-ckpt (console)'] / med['torch.load']:.3f}x, "
        f"CPU {console_cpu:.3f}x"
    )
    mmap_ratio = med["check-ckpt"] / med["torch.load mmap"]
    print(f"check-ckpt / torch.load(mmap=True) wall = {mmap_ratio:.3f}x  (target <= 1x)")
    inproc = op_med["check-ckpt (in-process)"]
    print(
        f"in-process ratio = {inproc / op_med['torch.load (in-process)']:.4f}x; "
        f"vs mmap {inproc / op_med['torch.load mmap (in-process)']:.3f}x"
    )
    print(
        f"check-ckpt peak RSS = {max(rss['check-ckpt']):.1f} MiB  (target <= 50 MB); "
        f"torch.load {max(rss['torch.load']):.1f} MiB"
    )


if __name__ == "__main__":
    main()
