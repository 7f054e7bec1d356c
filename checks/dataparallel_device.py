"""dataparallel-device: an nn.DataParallel whose module is not on device_ids[0] fails at its first forward."""

from __future__ import annotations

from typing import Any, Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import RuntimeCheck, wrapper_chain

_NEEDS_GPUS = (
    "it takes two GPUs, and the examples run on the CPU, where `nn.DataParallel` keeps no device ids "
    "and just calls the module, so there is nothing to check."
)

DATAPARALLEL_DEVICE = Pitfall(
    code="TD313",
    name="dataparallel-device",
    severity="error",
    summary="nn.DataParallel whose module is not on device_ids[0].",
    why="""
        `DataParallel` replicates the module from `device_ids[0]` to the other GPUs on every forward, so the
        module must already live there. Otherwise the first forward fails with "module must have its parameters
        and buffers on device cuda:0 (device_ids[0]) but found one of them on device: cpu".
    """,
    fix="Move the model to the first device, then wrap it, then build the optimizer from it.",
    bad=Example(
        """
        model = nn.DataParallel(Net(), device_ids=[0, 1])   # still on the CPU
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        """,
        unseen={"runtime": _NEEDS_GPUS},
    ),
    good=Example(
        """
        model = nn.DataParallel(Net().to("cuda:0"), device_ids=[0, 1])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        """,
        unseen={"runtime": _NEEDS_GPUS},
    ),
    details={
        "runtime": """
            At the start of the session `watch` looks through each watched model's wrappers; for every
            `DataParallel` with device ids it checks that all parameters and buffers of the wrapped module are on
            `src_device_obj` (`device_ids[0]`) and names the first one that is not. Passing a `DataParallel` object
            as the optimizer is refused by `watch()` itself with a one-line `TypeError`.
        """,
    },
)


@DATAPARALLEL_DEVICE.runtime
class DataParallelDevice(RuntimeCheck):
    """At start: every DataParallel wrapper's parameters and buffers must sit on its source device."""

    def on_start(self) -> Iterator[Finding]:
        from torch import nn

        for wm in self.ctx.models:
            for wrapper in wrapper_chain(wm.module):
                if isinstance(wrapper, nn.DataParallel) and wrapper.device_ids:
                    yield from self._check(wm.label, wrapper)

    def _check(self, label: str, dp: Any) -> Iterator[Finding]:
        source = dp.src_device_obj
        named = [*dp.module.named_parameters(), *dp.module.named_buffers()]
        wrong = [(name, t) for name, t in named if t.device != source]
        if not wrong:
            return
        name, tensor = wrong[0]
        yield Finding(
            f"{label} is wrapped in nn.DataParallel(device_ids={dp.device_ids}) but {len(wrong)} of its "
            f"{len(named)} parameters/buffers are not on {source} (e.g. `{name}` on {tensor.device}): forward() "
            "will fail with 'module must have its parameters and buffers on device'.",
            fix=Fix(
                title="Move the model to the first device, then wrap it (and build the optimizer from it):",
                code="model = model.to('cuda:0')\n"
                "model = nn.DataParallel(model, device_ids=[0, 1])\n"
                "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)",
            ),
            location=Location(module=label, param=name, device=str(tensor.device)),
        )
