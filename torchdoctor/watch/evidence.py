"""Evidence for explaining a crash (``on_crash``): what the failing frames held, where the session's tensors
live, how memory was spent. Each helper returns plain numbers and strings and keeps no tensor.

The traceback of the exception is the program's state at the failure: the innermost frames hold the
module that raised and the tensors it was given. Memory figures come from torch's allocator statistics
(`cuda_memory`) and NVML; both are module-level functions so that tests can stand in for a GPU.
"""

from __future__ import annotations

import gc
import os
import re
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any, Iterator, Optional

import torch
from torch import nn

if TYPE_CHECKING:
    from torchdoctor.watch.context import WatchContext


def frames(exc: BaseException) -> list[FrameType]:
    """The frames of the exception's traceback, outermost first (the failing line's frame last)."""
    out = []
    tb = exc.__traceback__
    while tb is not None:
        out.append(tb.tb_frame)
        tb = tb.tb_next
    return out


@dataclass
class FailingCall:
    """The innermost frame of the traceback that holds tensors: the function, the module it belongs to (when
    it is a module's method), and the device of each tensor it was handed or holds."""

    function: str
    file: str
    line: int
    module: Optional[nn.Module] = None
    tensors: dict[str, str] = field(default_factory=dict)  # local name -> device
    params: dict[str, str] = field(default_factory=dict)  # the module's own parameters/buffers -> device

    def devices(self) -> set[str]:
        return set(self.tensors.values()) | set(self.params.values())


def _tensor_locals(frame: FrameType) -> dict[str, str]:
    found = {}
    for name, value in list(frame.f_locals.items()):
        if isinstance(value, torch.Tensor) and not (value.dim() == 0 and value.device.type == "cpu"):
            found[name] = str(value.device)  # a CPU scalar mixes with any device: not evidence
        elif isinstance(value, (tuple, list)) and name in ("args", "input", "inputs"):
            for i, item in enumerate(value[:8]):
                if isinstance(item, torch.Tensor):
                    found[f"{name}[{i}]"] = str(item.device)
    return found


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def failing_call(exc: BaseException) -> Optional[FailingCall]:
    """The innermost module method in the traceback (a layer's forward), else the innermost frame outside
    torch that holds tensors; None when no frame holds any."""
    chosen: Optional[FrameType] = None
    for frame in reversed(frames(exc)):
        if frame.f_globals.get("__name__", "").startswith("torchdoctor."):  # watch's own wrappers of torch calls
            continue
        if isinstance(frame.f_locals.get("self"), nn.Module) and _tensor_locals(frame):
            chosen = frame
            break
        if chosen is None and not frame.f_code.co_filename.startswith(_TORCH_DIR) and _tensor_locals(frame):
            chosen = frame
    if chosen is None:
        return None
    owner = chosen.f_locals.get("self")
    module = owner if isinstance(owner, nn.Module) else None
    params = {}
    if module is not None:
        params = {
            n: str(t.device) for n, t in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        }
    return FailingCall(
        chosen.f_code.co_name, chosen.f_code.co_filename, chosen.f_lineno, module, _tensor_locals(chosen), params
    )


def module_path(ctx: "WatchContext", module: nn.Module) -> Optional[str]:
    """`module`'s qualified name in a watched model (``Net.fc1``, or ``fc1`` with one model), or None."""
    for wm in ctx.models:
        for name, sub in wm.inner.named_modules():
            if sub is module:
                prefix = wm.label if len(ctx.models) > 1 or not name else ""
                return ".".join(p for p in (prefix, name) if p) or wm.label
    return None


def placement(ctx: "WatchContext") -> list[str]:
    """Where each watched model's parameters and each optimizer's state live ('Net: 4 parameters on cuda:0')."""
    lines = []
    for wm in ctx.models:
        where: dict[str, int] = {}
        for p in wm.inner.parameters():
            where[str(p.device)] = where.get(str(p.device), 0) + 1
        if where:
            lines.append(f"{wm.label}: " + ", ".join(f"{n} parameter tensors on {d}" for d, n in where.items()))
    for wo in ctx.optimizers:
        state: dict[str, int] = {}
        for s in wo.optimizer.state.values():
            for v in s.values():
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    state[str(v.device)] = state.get(str(v.device), 0) + 1
        if state:
            lines.append(f"{wo.label} state: " + ", ".join(f"{n} tensors on {d}" for d, n in state.items()))
    return lines


# -- memory ---------------------------------------------------------------------------------------------


@dataclass
class MemoryBreakdown:
    """Bytes held on one device by the watched models' parameters, their gradients, and optimizer state."""

    params: int = 0
    grads: int = 0
    optimizer_state: int = 0
    optimizer_kinds: list[str] = field(default_factory=list)
    trainable_params: int = 0  # bytes of parameters that require grad


def _storage_key(t: torch.Tensor) -> tuple[Any, ...]:
    try:
        return (t.untyped_storage().data_ptr(), t.device)
    except (RuntimeError, NotImplementedError):
        return (id(t),)


def memory_breakdown(ctx: "WatchContext", device: torch.device) -> MemoryBreakdown:
    """What the session's tensors hold on `device`, each storage counted once."""
    out = MemoryBreakdown()
    seen: set[tuple[Any, ...]] = set()

    def size(t: torch.Tensor) -> int:
        if t.device != device or t.is_meta:
            return 0
        key = _storage_key(t)
        if key in seen:
            return 0
        seen.add(key)
        return t.untyped_storage().nbytes() if hasattr(t, "untyped_storage") else t.numel() * t.element_size()

    for wm in ctx.models:
        for p in wm.inner.parameters():
            n = size(p)
            out.params += n
            if p.requires_grad:
                out.trainable_params += p.numel() * p.element_size() if p.device == device else 0
            if p.grad is not None:
                out.grads += size(p.grad)
    for wo in ctx.optimizers:
        out.optimizer_kinds.append(type(wo.optimizer).__name__)
        for p in wo.params():
            if p.grad is not None:
                out.grads += size(p.grad)
            for v in wo.optimizer.state.get(p, {}).values():
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    out.optimizer_state += size(v)
    return out


@dataclass
class DeviceMemory:
    """The caching allocator's view of one device (bytes); `None` where unknown."""

    allocated: Optional[int] = None
    reserved: Optional[int] = None
    total: Optional[int] = None
    free: Optional[int] = None  # free on the device, as the driver says (other processes' use included)


def cuda_memory(device: torch.device) -> DeviceMemory:
    """torch.cuda's statistics for `device` (nothing when CUDA is not initialised)."""
    if device.type != "cuda" or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return DeviceMemory()
    index = device.index if device.index is not None else torch.cuda.current_device()
    out = DeviceMemory(torch.cuda.memory_allocated(index), torch.cuda.memory_reserved(index))
    try:
        out.free, out.total = torch.cuda.mem_get_info(index)
    except RuntimeError:
        pass
    return out


def other_gpu_processes(device: torch.device) -> list[tuple[int, Optional[int]]]:
    """(pid, bytes used) of the other processes NVML sees on `device`'s GPU (empty without NVML)."""
    if device.type != "cuda":
        return []
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        index = device.index if device.index is not None else torch.cuda.current_device()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        if ids and index < len(ids) and ids[index].isdigit():
            index = int(ids[index])
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        procs = []
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if int(p.pid) != os.getpid():
                used = getattr(p, "usedGpuMemory", None)
                procs.append((int(p.pid), int(used) if isinstance(used, int) else None))
        return procs
    except Exception:
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def largest_tensors(
    device: torch.device, n: int = 3, at_least: int = 1 << 20
) -> list[tuple[tuple[int, ...], str, int]]:
    """(shape, dtype, bytes) of the `n` largest tensors of `at_least` bytes alive on `device` (a pass over the
    collector's objects: only after a crash)."""
    sizes: dict[tuple[Any, ...], tuple[tuple[int, ...], str, int]] = {}
    tensors = [obj for obj in gc.get_objects() if issubclass(type(obj), torch.Tensor)]  # no __class__ lookups
    for obj in tensors:
        try:
            if obj.device == device and not obj.is_meta:
                nbytes = obj.untyped_storage().nbytes()
                key = _storage_key(obj)
                if nbytes >= at_least and (key not in sizes or sizes[key][2] < nbytes):
                    sizes[key] = (tuple(obj.shape), str(obj.dtype).replace("torch.", ""), nbytes)
        except Exception:
            continue
    return sorted(sizes.values(), key=lambda s: -s[2])[:n]


_GIB = re.compile(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)")
_BYTES = re.compile(r"tried to allocate (\d+) bytes")
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_GPU = re.compile(r"GPU (\d+)")


def requested_bytes(message: str) -> Optional[int]:
    """The size of the allocation that failed, as the allocator's message states it."""
    m = _GIB.search(message)
    if m:
        return int(float(m.group(1)) * _UNITS[m.group(2)])
    m = _BYTES.search(message)
    return int(m.group(1)) if m else None


def oom_device(exc: BaseException) -> Optional[torch.device]:
    """The device whose allocator failed: ``cuda:N`` for torch.OutOfMemoryError ("GPU N"), ``cpu`` for the
    CPU allocator's error; None for anything else."""
    message = str(exc)
    if isinstance(exc, torch.OutOfMemoryError):
        m = _GPU.search(message)
        return torch.device("cuda", int(m.group(1))) if m else torch.device("cuda")
    if isinstance(exc, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in message:
        return torch.device("cpu")
    return None


def iter_exceptions(exc: BaseException) -> Iterator[BaseException]:
    """The exception and those it was raised from or during (``__cause__``/``__context__``), a few deep."""
    seen = 0
    current: Optional[BaseException] = exc
    while current is not None and seen < 5:
        yield current
        seen += 1
        current = current.__cause__ or current.__context__
