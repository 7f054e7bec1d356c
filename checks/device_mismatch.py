"""device-mismatch: the program died because one operation got tensors on two devices; which ones."""

from __future__ import annotations

from typing import Any, Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import CrashEvent, RuntimeCheck

_SETUP = """
import torch
from torch import nn

torch.manual_seed(0)
device = "meta"  # stands in for "cuda" on a machine without a GPU: a second device all the same
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = [(torch.randn(4, 8), torch.randint(0, 3, (4,))) for _ in range(2)]
"""

DEVICE_MISMATCH = Pitfall(
    code="TD331",
    name="device-mismatch",
    severity="error",
    summary="The program died because an operation got tensors on two devices: which module, parameter or "
    "input was where.",
    why="""
        "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
        names two devices and no tensor. The usual causes: a batch that was never moved (`x.to(device)`
        without assigning the result: tensors are not moved in place), a layer created or replaced after
        `model.to(device)`, a tensor made inside `forward` without `device=` (a mask, positional indices,
        `torch.zeros(...)`), or a checkpoint loaded onto another device.
    """,
    fix="""
        Move what the finding names: assign the moved batch (`x = x.to(device)`), call `model.to(device)`
        after the last change to the model, and create tensors inside `forward` on the device of the input
        (`torch.zeros(n, device=x.device)`) or register them as buffers.
    """,
    bad=Example(
        """
        model.to(device)
        for x, y in loader:
            x.to(device)  # the result is dropped: x stays on the CPU
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y.to(device))
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        model.to(device)
        for x, y in loader:
            x = x.to(device)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y.to(device))
        """,
        setup=_SETUP,
    ),
    details={
        "runtime": """
            When the watched code (or the program, under `torchdoctor run`) ends with an error that speaks
            of devices, the check reads the failing frames of the traceback: the innermost module that was
            running (named in the watched model), the devices of its own parameters and buffers, and the
            devices of the tensors it was handed; and where every watched model's parameters and each
            optimizer's state live. It names the tensor on the odd device. CPU scalars (0-dim tensors) mix
            with any device and are not counted. Quiet for errors that do not concern devices.
        """,
    },
)


@DEVICE_MISMATCH.runtime
class DeviceMismatch(RuntimeCheck):
    """At a crash about devices: what the failing module and its inputs held, and where."""

    def on_crash(self, event: CrashEvent) -> Iterator[Finding]:
        from torchdoctor.sdk.runtime import evidence

        exc = event.exception
        if not isinstance(exc, (RuntimeError, ValueError)) or "device" not in str(exc).lower():
            return
        call = evidence.failing_call(exc)
        devices = call.devices() if call is not None else set()
        placement = evidence.placement(self.ctx)
        placed = {d for line in placement for d in _devices_in(line)}
        if len(devices) < 2 and len(placed) < 2 and not (devices and placed and devices != placed):
            return  # no evidence of two devices: not this pitfall's to explain
        yield self._finding(call, placement, evidence)

    def _finding(self, call: Any, placement: list[str], evidence: Any) -> Finding:
        where = "the failing operation"
        module_name = None
        if call is not None and call.module is not None:
            module_name = evidence.module_path(self.ctx, call.module)
            where = f"{type(call.module).__name__} `{module_name}`" if module_name else type(call.module).__name__
        parts = []
        odd_name, odd_device, fix = None, None, None
        if call is not None:
            params = _by_device(call.params)
            inputs = {n: d for n, d in call.tensors.items()}
            if params:
                parts.append(
                    f"{where} holds its parameters on "
                    + ", ".join(f"{d} ({', '.join(names[:3])})" for d, names in params.items())
                )
            if inputs:
                parts.append("it was handed " + ", ".join(f"`{n}` on {d}" for n, d in list(inputs.items())[:6]))
            home = next(iter(params), None)
            odd = [(n, d) for n, d in inputs.items() if home is not None and d != home]
            if odd:
                odd_name, odd_device = odd[0]
                fix = Fix(
                    title=f"Move `{odd_name}` to {home}, the device of the model (`device` below), where the batch "
                    "is prepared, assigning the result (tensors are not moved in place):",
                    code="x = x.to(device)",
                )
            elif len(params) > 1:
                stray = sorted(params.items(), key=lambda kv: len(kv[1]))[0]
                fix = Fix(
                    title=f"{where} has parameters on two devices ({stray[1][0]} on {stray[0]}): a layer was "
                    "replaced or added after model.to(device). Move the model after its last change:",
                    code="model.to(device)",
                )
        if fix is None:
            fix = Fix(
                title="Move the model and every batch to one device, assigning the result:",
                code="model = model.to(device)\nx, y = x.to(device), y.to(device)",
            )
        text = (
            f"An operation got tensors on different devices at step {self.ctx.step}: "
            + ("; ".join(parts) if parts else "the failing frame held no tensors")
            + "."
            + (f" Where the watched tensors live: {'; '.join(placement)}." if placement else "")
        )
        return Finding(text, fix=fix, location=Location(module=module_name, device=odd_device))


def _by_device(named: dict[str, str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, device in named.items():
        out.setdefault(device, []).append(name)
    return out


def _devices_in(line: str) -> set[str]:
    """The devices a placement line names ('... 4 parameter tensors on cuda:0, 2 ... on cpu')."""
    return {part.split(" on ", 1)[1].split(",")[0].strip() for part in line.split(", ") if " on " in part}
