"""Checkpoint storage checks: tensors saved on GPUs, views that drag whole storages along, NaN/Inf values."""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Iterator

from torchdoctor.findings import Finding, Location, Severity
from torchdoctor.registry import Scope, check
from torchdoctor.units import byte_size

if TYPE_CHECKING:
    from torchdoctor.ckpt.info import CheckpointInfo, TensorEntry

BLOAT_MIN_WASTE = 1 << 20  # bytes
BLOAT_MIN_RATIO = 2.0
_MAX_LISTED = 8


@check(code="TD205", name="cuda-tensors", scope=Scope.CHECKPOINT, severity="warning",
       summary="Tensors were saved on a GPU: loading on a CPU-only or smaller machine fails without map_location.")
def cuda_tensors(info: CheckpointInfo) -> Iterator[Finding]:
    from torchdoctor.ckpt.info import show_path

    devices: Counter[str] = Counter()
    first: dict[str, str] = {}
    for e in info.unique_tensors():
        dev = e.tensor.device
        if dev in ("cpu", "meta", "unknown"):
            continue
        devices[dev] += 1
        first.setdefault(dev, show_path(e.path))
    if not devices:
        return
    listed = ", ".join(f"{n} on {d}" for d, n in sorted(devices.items()))
    others = [d for d in devices if d != "cuda:0"]
    message = (f"{sum(devices.values())} tensor(s) were saved on accelerators ({listed}). On a CPU-only machine "
               "torch.load raises \"Attempting to deserialize object on a CUDA device but "
               "torch.cuda.is_available() is False\".")
    fix = f"torch.load({info.path!r}, map_location='cpu')"
    if any(d.startswith("cuda:") and d != "cuda:0" for d in others):
        message += " Tensors on cuda:1 or higher also fail on machines with fewer GPUs."
        remap = ", ".join(f"'{d}': 'cuda:0'" for d in sorted(others) if d.startswith("cuda:"))
        fix += f"  # or map_location={{{remap}}}"
    fix += "\nor write a CPU copy: torchdoctor check-ckpt FILE --fix cpu.pt"
    device = sorted(devices)[0]
    yield Finding(message, fix=fix, location=Location(file=info.path, key=first[device], device=device),
                  severity=Severity.WARNING if others else Severity.INFO)


def _covered(spans: list[tuple[int, int]]) -> int:
    total, end = 0, -1
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


@check(code="TD207", name="storage-bloat", scope=Scope.CHECKPOINT, severity="warning",
       summary="A tensor was saved as a view of a much larger storage, so the file is far larger than its tensors.")
def storage_bloat(info: CheckpointInfo) -> Iterator[Finding]:
    from torchdoctor.ckpt.info import show_path

    users: dict[str, list[TensorEntry]] = defaultdict(list)
    for e in info.tensors:
        if e.tensor.storage is not None:
            users[e.tensor.storage.key].append(e)
    bloated = []
    for key, entries in users.items():
        storage = entries[0].tensor.storage
        assert storage is not None
        used = _covered([e.tensor.byte_span() for e in entries])
        waste = storage.nbytes - used
        if waste >= BLOAT_MIN_WASTE and storage.nbytes >= BLOAT_MIN_RATIO * max(used, 1):
            bloated.append((waste, storage.nbytes, used, entries[0]))
    if not bloated:
        return
    bloated.sort(key=lambda b: -b[0])
    total = sum(b[0] for b in bloated)
    rows = "; ".join(f"{show_path(e.path)} {list(e.tensor.shape)} uses {byte_size(used)} of a {byte_size(size)} storage"
                     for _, size, used, e in bloated[:_MAX_LISTED])
    yield Finding(
        f"{len(bloated)} tensor(s) were saved as views of larger tensors, and torch.save writes the whole "
        f"underlying storage: {byte_size(total)} of the file's {byte_size(info.archive.file_size)} hold data no tensor "
        f"uses. {rows}.",
        fix="Clone views before saving so each tensor owns a storage of its own size:\n"
            "torch.save({k: v.clone() for k, v in state_dict.items()}, path)\n"
            "or write a compact copy: torchdoctor check-ckpt FILE --fix compact.pt",
        location=Location(file=info.path, key=show_path(bloated[0][3].path)),
    )


@check(code="TD208", name="nonfinite-weights", scope=Scope.CHECKPOINT, severity="error",
       summary="Floating-point tensors hold NaN or Inf values (found by --scan-values).")
def nonfinite_weights(info: CheckpointInfo) -> Iterator[Finding]:
    from torchdoctor.ckpt.info import show_path

    if info.values is None or not info.values.nonfinite:
        return
    bad = info.values.nonfinite
    for n in bad[:_MAX_LISTED]:
        parts = [f"{n.nan:,} NaN" if n.nan else "", f"{n.inf:,} Inf" if n.inf else ""]
        yield Finding(
            f"{show_path(n.path)} holds {' and '.join(p for p in parts if p)} of its {n.numel:,} values; a model "
            "loaded from it produces NaN outputs (training had already diverged when this was saved).",
            fix="Resume from an earlier checkpoint and find where the loss first became non-finite "
                "(torch.autograd.set_detect_anomaly(True), a lower learning rate, gradient clipping, "
                "or torchdoctor.watch).",
            location=Location(file=info.path, key=show_path(n.path)),
        )
    if len(bad) > _MAX_LISTED:
        yield Finding(f"{len(bad) - _MAX_LISTED} more tensor(s) hold NaN/Inf values (see the values facts).",
                      fix="As above.", location=Location(file=info.path))
