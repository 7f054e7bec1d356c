"""The torch probe: run as ``python -c <this file's source>`` in a subprocess by `torchdoctor env`.

It imports torch the way the user's own scripts would (the working directory first on sys.path, the
user's environment unchanged) and prints Python-literal lines prefixed with a marker: first the build
facts, then the CUDA facts, so a hang in CUDA initialisation still leaves the build facts behind, then a
"ready" line. Standard library and torch only; it never imports torchdoctor. Arguments: the seconds after
which faulthandler dumps every thread's stack (the parent kills it soon after), and under torchrun the
exchange timeout.

Under torchrun it then reads one JSON line from stdin, this rank's summary and findings, and shares it through the
launcher's TCPStore: every rank
writes its key, rank 0 collects all of them (waiting at most the timeout) and prints them as "ranks".
"""

import faulthandler
import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType

# Only built-in modules (and `os`, loaded before the search path is read) are imported before `import torch`:
# the user's `json.py` or `typing.py` must break torch's own import, never the probe's. Payloads are printed
# as Python literals (ascii), read back with `ast.literal_eval`, so no json is needed before torch.

MARKER = "@@torchdoctor-probe@@"
COMPANIONS = ("torchvision", "torchaudio")  # import-tested when their build differs from torch's


def plain(value: object) -> object:
    """`value` as a literal `ast.literal_eval` reads back (anything else becomes its str)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else str(value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return str(value)


def emit(kind: str, payload: "dict[str, object]") -> None:
    sys.stdout.write(MARKER + ascii(plain({"kind": kind, **payload})) + "\n")
    sys.stdout.flush()


def frames(tb: object) -> "list[str]":
    """The traceback's frames outside this probe, as "file:line in function" (no `traceback` module)."""
    out = []
    while tb is not None:
        code = tb.tb_frame.f_code  # type: ignore[attr-defined]
        if code.co_filename != "<string>":
            out.append(f"{code.co_filename}:{tb.tb_lineno} in {code.co_name}")  # type: ignore[attr-defined]
        tb = tb.tb_next  # type: ignore[attr-defined]
    return out[-8:]


def openmp_runtimes() -> "list[str]":
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


def config_highlights(torch: "ModuleType") -> "dict[str, str]":
    out: "dict[str, str]" = {}
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


def torch_location() -> "str | None":
    """Where `import torch` went (or would go), without importing anything else from the user's folders."""
    mod = sys.modules.get("torch")
    if mod is not None:
        return getattr(mod, "__file__", None)
    try:
        import importlib.util

        spec = importlib.util.find_spec("torch")
        return spec.origin if spec else None
    except Exception:
        return None


def schedstat() -> "tuple[float, float] | None":
    """(seconds on a CPU, seconds waiting for one) of the main thread so far (Linux `/proc/self/schedstat`)."""
    try:
        with open("/proc/self/schedstat") as f:
            on_cpu, waiting = f.read().split()[:2]
        return int(on_cpu) / 1e9, int(waiting) / 1e9
    except (OSError, ValueError):
        return None


class Clock:
    """How long `import torch` took, split into CPU time, time waiting for a CPU (a loaded machine) and the rest
    (blocked: reading files, a network file system, a lock), so that a busy machine is not mistaken for a slow
    install."""

    def __init__(self) -> None:
        self.wall, self.cpu, self.sched = time.perf_counter(), time.process_time(), schedstat()

    def times(self) -> "dict[str, object]":
        wall, cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu
        out: "dict[str, object]" = {"seconds": wall, "cpu_seconds": cpu}
        sched = schedstat()
        if self.sched is not None and sched is not None:
            on_cpu, waiting = sched[0] - self.sched[0], sched[1] - self.sched[1]
            out["cpu_wait_seconds"] = waiting
            out["blocked_seconds"] = max(0.0, wall - on_cpu - waiting)
        return out


def where_facts() -> "dict[str, object]":
    """Where Python looks for torch and why: the user site (on or off, and by what), every copy of torch on
    sys.path in search order (the first one wins), and the flags that change the search."""
    site = sys.modules.get("site")
    copies = []
    for entry in sys.path:
        folder = (entry or os.getcwd()).rstrip("/") + "/torch"
        if os.path.isfile(folder + "/__init__.py") and folder not in copies:
            copies.append(folder)
    versions = {}
    for folder in copies:
        try:
            with open(folder + "/version.py", encoding="utf-8", errors="replace") as f:
                for line in f:
                    if line.startswith("__version__"):
                        versions[folder] = line.split("=", 1)[1].split("#")[0].strip().strip("'\"")
        except OSError:
            pass
    return {
        "torch_copies": copies,
        "torch_copy_versions": versions,
        "user_site": getattr(site, "USER_SITE", None),
        "user_site_enabled": getattr(site, "ENABLE_USER_SITE", None),
        "isolated": bool(sys.flags.isolated),
        "no_user_site_flag": bool(sys.flags.no_user_site),
        "sys_prefix": sys.prefix,
    }


def limits() -> "dict[str, list[object]]":
    """This process's resource limits as /proc/self/limits shows them: name -> [soft, hard] (None: unlimited)."""
    out: "dict[str, list[object]]" = {}
    try:
        with open("/proc/self/limits") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return out
    for line in lines:
        parts = line[26:].split()
        if len(parts) >= 2:
            out[line[:26].strip()] = [None if v == "unlimited" else int(v) if v.isdigit() else v for v in parts[:2]]
    return out


def build_facts(torch: "ModuleType", clock: "dict[str, object]") -> "dict[str, object]":
    """The build facts; raises (AttributeError, ...) when what was imported is not a working torch."""
    build: "dict[str, object]" = {
        "ok": True,
        **clock,
        "torch_file": getattr(torch, "__file__", None),
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "debug": getattr(torch.version, "debug", None),
        "num_threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "git_version": getattr(torch.version, "git_version", None),
    }
    build.update(config_highlights(torch))
    for key, get in (
        ("xpu_available", lambda: torch.xpu.is_available()),
        ("xnnpack", lambda: bool(__import__("torch.backends.xnnpack").backends.xnnpack.enabled)),
    ):
        try:
            build[key] = get()
        except Exception:
            build[key] = None
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
    build["companion_errors"] = companion_errors(str(torch.__version__))
    return build


def companion_errors(torch_version: str) -> "dict[str, str]":
    """Import errors of torchvision/torchaudio, tried only when their version.py names another build than
    torch's (a `+cu130` torchvision on a `+cpu` torch fails with "operator torchvision::nms does not exist")."""
    import importlib.util

    errors = {}
    torch_tag = torch_version.partition("+")[2]
    for name in COMPANIONS:
        try:
            spec = importlib.util.find_spec(name)
            folder = spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else None
            if folder is None:
                continue
            with open(folder + "/version.py", encoding="utf-8", errors="replace") as f:
                text = f.read()
        except Exception:
            continue
        tag = text.partition("__version__ = ")[2].split("\n", 1)[0].strip("'\" ").partition("+")[2]
        if tag == torch_tag:
            continue
        try:
            __import__(name)
        except Exception as exc:
            errors[name] = f"{type(exc).__name__}: {exc}".strip()
    return errors


def main() -> None:
    dump_after = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
    faulthandler.enable()  # a crash (SIGBUS from a truncated library, SIGSEGV) leaves the stack where it happened
    if dump_after > 0:  # a hanging import: print where it hangs, then end (the parent counts from "armed")
        faulthandler.dump_traceback_later(dump_after, exit=True)
    emit("armed", {})
    start = time.perf_counter()
    clock = Clock()
    try:
        import torch

        build = build_facts(torch, clock.times())
        build.update(where_facts())
    except BaseException as exc:  # noqa: B902 - SystemExit from a broken package counts too
        emit(
            "build",
            {
                "ok": False,
                **clock.times(),
                "error_type": type(exc).__name__,
                "error": str(exc),
                "error_errno": getattr(exc, "errno", None) if isinstance(exc, OSError) else None,
                "error_filename": getattr(exc, "filename", None) if isinstance(exc, OSError) else None,
                "error_module": getattr(exc, "name", None) if isinstance(exc, ImportError) else None,
                "traceback_tail": frames(exc.__traceback__),
                "torch_file": torch_location(),
                "limits": limits(),
                **where_facts(),
            },
        )
        return
    emit("build", build)

    rendezvous = None
    if len(sys.argv) > 2:  # under torchrun; the parent extends its deadline by the time spent connecting
        faulthandler.cancel_dump_traceback_later()
        emit("connecting", {})
        before = time.perf_counter()
        try:
            rendezvous = Rendezvous(float(sys.argv[2]))
        except Exception as exc:
            emit("unreachable", {"error": f"{type(exc).__name__}: {exc}"})
        waited = time.perf_counter() - before
        emit("rendezvous", {"waited": waited})
        if dump_after > 0:
            faulthandler.dump_traceback_later(max(0.1, dump_after - (before - start)), exit=True)
    cuda: "dict[str, object]" = {}
    if build["cuda"] or build["hip"]:
        if rendezvous:
            rendezvous.status("initialising CUDA")
        cuda = cuda_facts(torch)
        emit("cuda", cuda)
    faulthandler.cancel_dump_traceback_later()
    if rendezvous:
        rendezvous.status("checking its machine (torch-free facts, NVML, the checks)")
    emit("ready", {})
    if rendezvous:
        rendezvous.exchange({**build, **cuda})


def cuda_facts(torch: "ModuleType") -> "dict[str, object]":
    devices: "list[dict[str, object]]" = []
    cuda: "dict[str, object]" = {"cuda_available": False, "cuda_device_count": 0, "cuda_devices": devices}
    try:
        cuda["cuda_device_count"] = torch.cuda.device_count()
        cuda["cuda_available"] = torch.cuda.is_available()
        if cuda["cuda_available"]:
            try:
                cuda["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            except Exception:
                pass
            for i in range(torch.cuda.device_count()):
                devices.append(
                    {
                        "name": torch.cuda.get_device_name(i),
                        "capability": list(torch.cuda.get_device_capability(i)),
                    }
                )
            x = torch.ones(8, device="cuda")
            (x * 2).sum().item()  # a real kernel: "no kernel image is available" shows here
    except Exception as exc:
        cuda["cuda_error"] = f"{type(exc).__name__}: {exc}".strip()
    return cuda


class Rendezvous:
    """This rank's connection to the launcher's TCPStore: it posts what the rank is doing (so rank 0 can say
    what a rank that never reported was doing), then shares the summary; rank 0 prints every rank's."""

    def __init__(self, timeout: float) -> None:
        from datetime import timedelta

        from torch.distributed import TCPStore

        self.timeout = timeout
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.prefix = "torchdoctor/env/" + os.environ.get("TORCHELASTIC_RUN_ID", "run") + "/"
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        self.store = TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            world_size=None if agent else self.world,
            is_master=(self.rank == 0 and not agent),
            timeout=timedelta(seconds=timeout),
            wait_for_workers=False,
        )

    def status(self, doing: str) -> None:
        self.store.set(f"{self.prefix}doing/{self.rank}", doing)

    def exchange(self, build: "dict[str, object]") -> None:
        """Share this rank's payload (stdin); rank 0 collects every rank's, waiting at most the timeout."""
        import json
        from datetime import timedelta

        payload = json.loads(sys.stdin.readline() or "{}")
        payload["torch"] = {k: build.get(k) for k in ("version", "cuda", "cudnn", "hip", "nccl")}
        store, prefix = self.store, self.prefix
        store.set(prefix + str(self.rank), json.dumps(payload))
        if self.rank != 0:
            emit("sent", {})
            try:  # keep a non-agent store's clients alive until rank 0 has read everything
                store.wait([prefix + "collected"], timedelta(seconds=self.timeout))
            except Exception:
                pass
            return
        deadline = time.monotonic() + self.timeout
        pending = set(range(self.world))
        ranks = []
        while pending and time.monotonic() < deadline:
            for r in sorted(pending):
                if store.check([prefix + str(r)]):
                    ranks.append(json.loads(store.get(prefix + str(r))))
                    pending.discard(r)
            if pending:
                time.sleep(0.05)
        doing = {}
        for r in pending:
            key = f"{prefix}doing/{r}"
            if store.check([key]):
                doing[str(r)] = store.get(key).decode("utf-8", "replace")
        store.set(prefix + "collected", "1")
        emit("ranks", {"ranks": ranks, "missing": sorted(pending), "doing": doing})


if __name__ == "__main__":
    main()
