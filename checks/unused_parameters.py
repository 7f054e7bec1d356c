"""unused-parameters: parameters the optimizer holds never receive a gradient over several checked steps."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall, Severity
from torchdoctor.sdk.runtime import RuntimeCheck, StepEvent, user_frame

from ._user_names import find_name, name_of

# 21 steps: with watch's default every=10, steps 0, 10 and 20 are the three checked ones.
_TWO_HEADS = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.head = nn.Linear(8, 2)
        self.aux_head = nn.Linear(8, 2)

    def forward(self, x):
        features = torch.relu(self.body(x))
        return self.head(features), self.aux_head(features)


model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.MSELoss()
loader = [(torch.randn(8, 4), torch.randn(8, 2)) for _ in range(21)]
"""

UNUSED_PARAMETERS = Pitfall(
    code="TD305",
    name="unused-parameters",
    severity="info",
    summary="Parameters the optimizer holds never receive a gradient over several checked steps.",
    why="""
        A layer whose output never reaches the loss — `forward()` does not call it, or the loss leaves out the
        output it feeds — wastes memory and optimizer state, and often means a bug: a branch left out by a typo,
        an auxiliary loss forgotten, a module replaced by a new one under another name. Under
        `DistributedDataParallel` it is an error in waiting: DDP expects a gradient for every parameter and fails
        with "Expected to have finished reduction in the prior iteration" unless `find_unused_parameters=True`.
    """,
    fix="""
        Put the layer's output into the loss (or call it in `forward()`), remove the layer, or freeze it with
        `requires_grad_(False)`. Under DDP, if some parameters are unused on purpose in some steps, pass
        `find_unused_parameters=True`.
    """,
    bad=Example(
        """
        for x, y in loader:
            optimizer.zero_grad()
            logits, aux_logits = model(x)
            loss = criterion(logits, y)  # aux_logits never reach the loss: aux_head gets no gradient
            loss.backward()
            optimizer.step()
        """,
        setup=_TWO_HEADS,
    ),
    good=Example(
        """
        model.aux_head.requires_grad_(False)  # not trained on purpose (or add criterion(aux_logits, y) to the loss)
        for x, y in loader:
            optimizer.zero_grad()
            logits, aux_logits = model(x)
            loss = criterion(logits, y)
            loss.backward()
            optimizer.step()
        """,
        setup=_TWO_HEADS,
    ),
    details={
        "runtime": """
            At steps 0, `every`, ... below 32, then every `10 * every` steps and from step `100 * every` on every
            `100 * every`, just before a step, `watch` looks at
            the optimizer's parameters that belong to a
            watched model and require grad. A parameter whose `.grad` is `None` at three checked steps in a row is
            reported once (info; a warning under DDP). Frozen parameters are quiet. With
            `zero_grad(set_to_none=False)` an unused parameter that once had a gradient keeps a zero one and is not
            reported.
        """,
    },
)


def _owner_expr(path: str, model: str = "model") -> str:
    """The user's name for the model followed by the access to the module or parameter at `path`
    ("aux_head" -> model.aux_head)."""
    return model + "".join(f"[{part}]" if part.isdigit() else f".{part}" for part in path.split(".") if part)


@UNUSED_PARAMETERS.runtime
class UnusedParameters(RuntimeCheck):
    """At the set-up steps (`ctx.setup_due`): optimizer parameters of the model whose .grad is None at step time."""

    setup = True  # what it judges changes seldom
    checks_needed = 3

    def on_start(self) -> None:
        self.misses: dict[int, int] = {}
        self.reported: set[int] = set()

    def on_periodic(self, event: StepEvent) -> Iterator[Finding]:
        in_model = self.ctx.model_param_ids()
        unused: list[str] = []
        for p in event.optimizer.params():
            if not p.requires_grad or id(p) not in in_model:
                continue
            if p.grad is not None:
                self.misses.pop(id(p), None)
                continue
            self.misses[id(p)] = n = self.misses.get(id(p), 0) + 1
            if n >= self.checks_needed and id(p) not in self.reported:
                self.reported.add(id(p))
                unused.append(self.ctx.param_name(p) or "?")
        if not unused:
            return
        ddp = any("DistributedDataParallel" in wm.wrappers for wm in self.ctx.models)
        model = _model_name(self.ctx.models)
        names = ", ".join(f"`{n}`" for n in unused[:6]) + (", ..." if len(unused) > 6 else "")
        yield Finding(
            f"{len(unused)} parameter(s) in {event.optimizer.label} got no gradient at {self.checks_needed} checked "
            f"steps in a row: {names}. Their output never reaches the loss: forward() does not use them, or the "
            "loss leaves out what they compute"
            + (" (DDP needs find_unused_parameters=True for that)." if ddp else "."),
            fix=Fix(
                "Freeze them before the loop if they are not meant to learn (or put their output into the loss, "
                "or remove them)",
                "\n".join(
                    f"{_owner_expr(n, model)}.requires_grad_(False)"
                    for n in dict.fromkeys(n.rpartition(".")[0] or n for n in unused[:6] if n != "?")
                ),
            ),
            location=Location(param=unused[0], step=event.step),
            severity=Severity.WARNING if ddp else None,
        )


def _model_name(models: list) -> str:
    """The user's name for the watched model (the one model watched), else `model`."""
    if len(models) != 1:
        return "model"
    wm = models[0]
    inner = find_name(wm.inner, user_frame(2))
    if inner is not None:
        return inner
    outer = name_of(wm.module, "model")
    return outer + ".module" if any("DataParallel" in w for w in wm.wrappers) else outer  # DDP's model inside
