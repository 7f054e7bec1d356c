"""cuda-tensors: tensors were saved on a GPU, so loading on a CPU-only or smaller machine fails."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall, Severity
from torchdoctor.sdk.checkpoint import CheckpointInfo, show_path

from ._ckptutil import MODEL_SETUP

CUDA_TENSORS = Pitfall(
    code="TD205",
    name="cuda-tensors",
    severity="warning",
    summary="Tensors were saved on a GPU: loading on a CPU-only or smaller machine fails without map_location.",
    why="""
        Tensors were saved on an accelerator (`cuda:N`, `mps`, `xpu`, …); torchdoctor reads the device tag of
        every storage and counts tensors per device. Only `cuda:0` is a note; `cuda:1` and higher, or other
        backends, are a warning because they fail on more machines.

        `torch.load` puts every tensor back on the device it was saved from. On a CPU-only machine:

        ```text
        RuntimeError: Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is False.
        If you are running on a CPU-only machine, please use torch.load with map_location=torch.device('cpu')
        ```

        A file saved from `cuda:1` also fails on a single-GPU machine, and loading a big GPU checkpoint onto one
        GPU can run out of memory before the model is even built.
    """,
    fix="""
        Pass `map_location` when loading (`"cpu"`, or a mapping such as `{"cuda:1": "cuda:0"}`), or move the
        state dict to the CPU before saving. `torchdoctor check-ckpt FILE --fix cpu.pt` writes a CPU copy.
    """,
    bad=Example(
        """
            model = model.cuda()
            torch.save(model.state_dict(), "ckpt.pt")  # every tensor records device cuda:0
            # torch.load("ckpt.pt") on a CPU-only machine -> "Attempting to deserialize object on a CUDA device"
        """,
        setup=MODEL_SETUP,
        unseen={
            "checkpoint": "it is not run, since no CUDA tensor can be created on the CPU-only machines that run "
            "the examples; on a GPU machine `check-ckpt` reports the file it writes."
        },
    ),
    good=Example(
        """
            torch.save({k: v.cpu() for k, v in model.state_dict().items()}, "ckpt.pt")  # CPU tensors load anywhere
            state = torch.load("ckpt.pt", map_location="cpu")  # map_location also rescues files saved on a GPU
            model.load_state_dict(state)
        """,
        setup=MODEL_SETUP,
    ),
)


@CUDA_TENSORS.checkpoint
def cuda_tensors(info: CheckpointInfo) -> Iterator[Finding]:
    """Tensors whose saved device is an accelerator (a warning beyond cuda:0, else info)."""
    table = info.table
    devices = table.device_counts()
    for dev in ("cpu", "meta", "unknown"):
        devices.pop(dev, None)
    first = {dev: show_path(table.path(table.locations.index(dev))) for dev in devices}
    if not devices:
        return
    listed = ", ".join(f"{n} on {d}" for d, n in sorted(devices.items()))
    others = [d for d in devices if d != "cuda:0"]
    message = (
        f"{sum(devices.values())} tensor(s) were saved on accelerators ({listed}). On a CPU-only machine "
        'torch.load raises "Attempting to deserialize object on a CUDA device but '
        'torch.cuda.is_available() is False".'
    )
    load = f"torch.load({info.path!r}, map_location='cpu')"
    if any(d.startswith("cuda:") and d != "cuda:0" for d in others):
        message += " Tensors on cuda:1 or higher also fail on machines with fewer GPUs."
        remap = ", ".join(f"'{d}': 'cuda:0'" for d in sorted(others) if d.startswith("cuda:"))
        load += f"  # or map_location={{{remap}}}"
    fix = Fix(code=f"{load}\n# or write a CPU copy: torchdoctor check-ckpt {info.path} --fix cpu.pt")
    device = sorted(devices)[0]
    yield Finding(
        message,
        fix=fix,
        location=Location(file=info.path, key=first[device], device=device),
        severity=Severity.WARNING if others else Severity.INFO,
    )
