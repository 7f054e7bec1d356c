"""Runtime checks on the setup a loop starts with: reproducibility settings, DataParallel placement."""
from __future__ import annotations

import os
from typing import Any, Iterator

from torchdoctor.findings import Finding, Location, Severity
from torchdoctor.registry import Scope, check
from torchdoctor.watch.contract import RuntimeCheck, StepEvent

RECIPE = """import os, random, numpy as np, torch
os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"    # before CUDA starts
random.seed(0); np.random.seed(0); torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
torch.backends.cudnn.benchmark = False
g = torch.Generator().manual_seed(0)
loader = DataLoader(ds, shuffle=True, num_workers=4, generator=g, worker_init_fn=seed_worker)"""


def reproducibility_problems(loaders: list[Any], deterministic: bool) -> list[str]:
    """What makes this run non-reproducible; without `deterministic`, only settings that actively hurt."""
    import torch

    cudnn = torch.backends.cudnn
    cuda = torch.cuda.is_available()
    problems = []
    if cudnn.benchmark and cudnn.deterministic:
        problems.append("cudnn.benchmark=True overrides cudnn.deterministic=True (pytorch/pytorch#6351)")
    elif cudnn.benchmark and (deterministic or cuda):
        problems.append("cudnn.benchmark=True picks convolution algorithms by timing, which can differ between runs")
    if not deterministic:
        return problems
    if not torch.are_deterministic_algorithms_enabled():
        problems.append("deterministic algorithms are off (torch.use_deterministic_algorithms(True))")
    elif cuda and not os.environ.get("CUBLAS_WORKSPACE_CONFIG"):
        problems.append("CUBLAS_WORKSPACE_CONFIG is unset, which deterministic cuBLAS needs")
    if torch.initial_seed() >= 2**32:
        problems.append(f"torch.manual_seed() was not called (the seed is the random {torch.initial_seed()})")
    for loader in loaders:
        if getattr(loader, "num_workers", 0) > 0 and loader.worker_init_fn is None and loader.generator is None:
            problems.append(f"the DataLoader over {type(loader.dataset).__name__} uses {loader.num_workers} workers "
                            "without generator= or worker_init_fn= to seed them")
    return problems


@check(code="TD310", name="nondeterministic-settings", scope=Scope.RUNTIME, severity="info",
       summary="Settings that make runs non-reproducible (a warning under watch(..., deterministic=True)).")
class NondeterministicSettings(RuntimeCheck):
    """Reads cuDNN/determinism flags, the seed and the loaders at start and every `every` steps."""

    def on_start(self) -> Iterator[Finding]:
        self.reported: set[str] = set()
        yield from self._check()

    def on_periodic(self, event: StepEvent) -> Iterator[Finding]:
        yield from self._check()

    def _check(self) -> Iterator[Finding]:
        deterministic = self.ctx.deterministic
        for problem in reproducibility_problems(self.ctx.loaders, deterministic):
            if problem in self.reported:
                continue
            self.reported.add(problem)
            asked = " (watch(..., deterministic=True) asks for a reproducible run)" if deterministic else ""
            yield Finding(f"This run is not reproducible: {problem}{asked}.", fix="The reproducibility recipe:\n" + RECIPE,
                          severity=Severity.WARNING if deterministic else Severity.INFO,
                          location=Location(step=self.ctx.step))


@check(code="TD313", name="dataparallel-device", scope=Scope.RUNTIME, severity="error",
       summary="nn.DataParallel whose module is not on device_ids[0].")
class DataParallelDevice(RuntimeCheck):
    """At start: every DataParallel wrapper's parameters and buffers must sit on its source device."""

    def on_start(self) -> Iterator[Finding]:
        from torch import nn

        for wm in self.ctx.models:
            module: Any = wm.module  # walked by duck typing: `.module` of (D)DP, `._orig_mod` of torch.compile
            while isinstance(module, (nn.DataParallel, nn.parallel.DistributedDataParallel)) or hasattr(module, "_orig_mod"):
                inner = module._orig_mod if hasattr(module, "_orig_mod") else module.module
                if isinstance(module, nn.DataParallel) and module.device_ids:
                    yield from self._check(wm.label, module)
                module = inner

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
            fix="Move the model to the first device, then wrap it (and build the optimizer from it):\n"
                "model = model.to('cuda:0')\n"
                "model = nn.DataParallel(model, device_ids=[0, 1])\n"
                "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)",
            location=Location(module=label, param=name, device=str(tensor.device)))
