"""param-not-in-optimizer: a trainable parameter gets gradients but no optimizer holds it, so it never changes."""

from __future__ import annotations

from collections import Counter
from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import RuntimeCheck, StepEvent

_BODY = """
import torch
from torch import nn

model = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.MSELoss()
loader = [(torch.randn(8, 4), torch.randn(8, 2)) for _ in range(3)]
"""

_LOOP = """
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""

PARAM_NOT_IN_OPTIMIZER = Pitfall(
    code="TD303",
    name="param-not-in-optimizer",
    severity="warning",
    summary="A trainable parameter receives gradients but no optimizer holds it, so it never changes.",
    why="""
        An optimizer only updates the parameters it was given. A head added to the model after the optimizer was
        built, a parameter group list that forgot a submodule, or a layer re-bound after the optimizer was created
        all get gradients on every backward and are never updated: that part of the model stays at its
        initialisation while the loss still goes down a little, which hides the bug.
    """,
    fix="""
        Build the optimizer from `model.parameters()` after the last change to the model, give it the new
        parameters with `optimizer.add_param_group({"params": ...})`, or freeze the parameters you do not want to
        train (`requires_grad_(False)`) so that no gradient is computed for them.
    """,
    bad=Example(
        "model.append(nn.Linear(8, 2))  # a head added after the optimizer was built: never trained" + _LOOP,
        setup=_BODY,
    ),
    good=Example(
        'model.append(nn.Linear(8, 2))\noptimizer.add_param_group({"params": model[2].parameters()})' + _LOOP,
        setup=_BODY,
    ),
    details={
        "runtime": """
            At steps 0, `every`, ... below 32, then every `10 * every` steps and from step `100 * every` on every
            `100 * every`, just before a step, `watch` lists
            the parameters of each watched model that have
            `requires_grad=True` and a `.grad`, but are in none of the optimizers given to `watch()`. Frozen
            parameters are quiet. A model none of whose parameters is in a watched optimizer is skipped (for example
            the discriminator of a GAN when only the generator's optimizer is passed), because its optimizer may
            simply not have been given to `watch()`. A parameter that replaced one an optimizer still holds (a
            layer re-bound after the optimizer was built: same shape, gone from the model) is left to
            stale-optimizer-params, which reports that layer with its cause.
        """,
    },
)


def _module_expr(path: str) -> str:
    """`model` followed by the access to the submodule at `path` ("head" -> model.head, "2" -> model[2])."""
    return "model" + "".join(f"[{part}]" if part.isdigit() else f".{part}" for part in path.split(".") if part)


def _fix(missing: list[str], names: list[str]) -> Fix:
    """Give the optimizer the modules that own the missing parameters (or freeze them); a module some of whose
    parameters the optimizer already holds gets only the missing ones (a parameter in two groups is an error)."""
    owners = list(dict.fromkeys(name.rpartition(".")[0] for name in missing))[:3]
    lost = set(missing)

    def params(owner: str) -> str:
        inside = [n for n in names if n.startswith(owner + ".")] if owner else []
        if inside and all(n in lost for n in inside):
            return f"{_module_expr(owner)}.parameters()"
        return "[" + ", ".join(_module_expr(n) for n in missing if n.rpartition(".")[0] == owner) + "]"

    own = [params(o) for o in owners]
    adds = "\n".join(f'optimizer.add_param_group({{"params": {params}}})' for params in own)
    return Fix(
        title="Give them to the optimizer (or build the optimizer after adding the layers), or freeze them:",
        code=f"{adds}\n# or: {_module_expr(owners[0] or missing[0])}.requires_grad_(False)",
    )


@PARAM_NOT_IN_OPTIMIZER.runtime
class ParamNotInOptimizer(RuntimeCheck):
    """At the set-up steps (`ctx.setup_due`): parameters of a model some optimizer trains that have a .grad but no
    optimizer."""

    setup = True  # what it judges changes seldom

    def on_start(self) -> None:
        self.reported: set[str] = set()

    def on_periodic(self, event: StepEvent) -> Iterator[Finding]:
        held = self.ctx.optimizer_param_ids()
        # a parameter with a same-shaped twin that an optimizer holds but the model lost was re-bound after the
        # optimizer was built: stale-optimizer-params reports that layer, with the cause
        in_models = self.ctx.model_param_ids()
        replaced = Counter(
            tuple(p.shape)
            for wo in self.ctx.optimizers
            for group in wo.optimizer.param_groups
            for p in group["params"]
            if id(p) not in in_models
        )
        for wm in self.ctx.models:
            params = list(wm.named_parameters())
            if not any(id(p) in held for _, p in params):
                continue  # no optimizer given to watch() trains this model
            missing = []
            for name, p in params:
                if not p.requires_grad or id(p) in held:
                    continue
                if replaced[tuple(p.shape)] > 0:  # each lost parameter explains one new one
                    replaced[tuple(p.shape)] -= 1
                elif p.grad is not None and name not in self.reported:
                    missing.append(name)
            if not missing:
                continue
            self.reported.update(missing)
            names = ", ".join(f"`{n}`" for n in missing[:6]) + (", ..." if len(missing) > 6 else "")
            yield Finding(
                f"{len(missing)} parameter(s) of {wm.label} receive gradients but no optimizer given to watch() "
                f"holds them, so they never change: {names}.",
                fix=_fix(missing, [name for name, _ in params]),
                location=Location(module=wm.label, param=missing[0], step=event.step),
            )
