"""The torch probe: run as ``python -c <this file's source>`` in a subprocess by `torchdoctor env`.

It imports torch the way the user's own scripts would (the working directory first on sys.path) and
prints JSON lines prefixed with a marker: first the build facts, then the CUDA facts, so a hang in CUDA
initialisation still leaves the build facts behind, then a "ready" line. Standard library and torch only;
it never imports torchdoctor.

Under torchrun (TORCHDOCTOR_PROBE_EXCHANGE=<timeout s> in its environment) it then reads one JSON line
from stdin, this rank's summary and findings, and shares it through the launcher's TCPStore: every rank
writes its key, rank 0 collects all of them (waiting at most the timeout) and prints them as "ranks".
"""
import json
import os
import sys
import time
import traceback
from types import ModuleType
from typing import Any

MARKER = "@@torchdoctor-probe@@"


def emit(kind: str, payload: dict[str, Any]) -> None:
    sys.stdout.write(MARKER + json.dumps({"kind": kind, **payload}, default=str) + "\n")
    sys.stdout.flush()


def openmp_runtimes() -> list[str]:
    """Distinct OpenMP runtime libraries mapped into this process (Linux only)."""
    found = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1]
                base = path.rsplit("/", 1)[-1]
                if base.startswith(("libgomp", "libiomp5", "libomp.", "libomp-")):
                    found.add(path)
    except OSError:
        pass
    return sorted(found)


def config_highlights(torch: ModuleType) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        show = torch.__config__.show()
        for line in show.splitlines():
            line = line.strip(" -")
            if "Math Kernel Library" in line or line.startswith("OpenBLAS"):
                out.setdefault("blas", line)
            elif line.startswith("OpenMP"):
                out["openmp"] = line
            elif line.startswith("CPU capability usage:"):
                out["cpu_capability"] = line.split(":", 1)[1].strip()
            elif "BLAS_INFO=" in line and "blas" not in out:
                out["blas"] = line.split("BLAS_INFO=", 1)[1].split(",", 1)[0]
    except Exception:
        pass
    return out


def main() -> None:
    start = time.perf_counter()
    try:
        import torch
    except BaseException as exc:  # noqa: B902 - SystemExit from a broken package counts too
        spec_file = None
        mod = sys.modules.get("torch")
        if mod is not None:
            spec_file = getattr(mod, "__file__", None)
        else:
            try:
                import importlib.util

                spec = importlib.util.find_spec("torch")
                spec_file = spec.origin if spec else None
            except Exception:
                pass
        emit("build", {
            "ok": False,
            "seconds": time.perf_counter() - start,
            "error_type": type(exc).__name__,
            "error": str(exc),
            "traceback_tail": traceback.format_exc().strip().splitlines()[-8:],
            "torch_file": spec_file,
        })
        return
    seconds = time.perf_counter() - start
    build: dict[str, Any] = {
        "ok": True,
        "seconds": seconds,
        "torch_file": getattr(torch, "__file__", None),
        "version": getattr(torch, "__version__", None),
        "cuda": getattr(torch.version, "cuda", None),
        "hip": getattr(torch.version, "hip", None),
        "debug": getattr(torch.version, "debug", None),
        "num_threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
    }
    build.update(config_highlights(torch))
    try:
        build["arch_list"] = torch.cuda.get_arch_list()
    except Exception:
        build["arch_list"] = []
    try:
        build["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:
        build["cudnn"] = None
    try:
        import numpy

        build["numpy_version"] = numpy.__version__
        torch.from_numpy(numpy.zeros(1)).add_(1)
    except Exception as exc:
        build["numpy_error"] = f"{type(exc).__name__}: {exc}"
    build["openmp_runtimes"] = openmp_runtimes()
    emit("build", build)

    cuda: dict[str, Any] = {}
    if build["cuda"] or build["hip"]:
        cuda = cuda_facts(torch)
        emit("cuda", cuda)
    emit("ready", {})
    if os.environ.get("TORCHDOCTOR_PROBE_EXCHANGE"):
        exchange(float(os.environ["TORCHDOCTOR_PROBE_EXCHANGE"]), {**build, **cuda})


def cuda_facts(torch: ModuleType) -> dict[str, Any]:
    cuda: dict[str, Any] = {"cuda_available": False, "cuda_device_count": 0, "cuda_devices": []}
    try:
        cuda["cuda_device_count"] = torch.cuda.device_count()
        cuda["cuda_available"] = torch.cuda.is_available()
        if cuda["cuda_available"]:
            try:
                cuda["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            except Exception:
                pass
            for i in range(torch.cuda.device_count()):
                cuda["cuda_devices"].append({
                    "name": torch.cuda.get_device_name(i),
                    "capability": list(torch.cuda.get_device_capability(i)),
                })
            x = torch.ones(8, device="cuda")
            (x * 2).sum().item()  # a real kernel: "no kernel image is available" shows here
    except Exception as exc:
        cuda["cuda_error"] = f"{type(exc).__name__}: {exc}".strip()
    return cuda


def exchange(timeout: float, build: dict[str, Any]) -> None:
    """Share this rank's payload (stdin) through the launcher's store; rank 0 prints every rank's."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    payload = json.loads(sys.stdin.readline() or "{}")
    payload["torch"] = {k: build.get(k) for k in ("version", "cuda", "cudnn", "hip", "nccl")}
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=None if agent else world,
                     is_master=(rank == 0 and not agent), timeout=timedelta(seconds=timeout),
                     wait_for_workers=False)
    prefix = "torchdoctor/env/" + os.environ.get("TORCHELASTIC_RUN_ID", "run") + "/"
    store.set(prefix + str(rank), json.dumps(payload))
    if rank != 0:
        try:  # keep a non-agent store's clients alive until rank 0 has read everything
            store.wait([prefix + "collected"], timedelta(seconds=timeout))
        except Exception:
            pass
        return
    deadline = time.monotonic() + timeout
    pending = set(range(world))
    ranks = []
    while pending and time.monotonic() < deadline:
        for r in sorted(pending):
            if store.check([prefix + str(r)]):
                ranks.append(json.loads(store.get(prefix + str(r))))
                pending.discard(r)
        if pending:
            time.sleep(0.05)
    store.set(prefix + "collected", "1")
    emit("ranks", {"ranks": ranks, "missing": sorted(pending)})


if __name__ == "__main__":
    main()
