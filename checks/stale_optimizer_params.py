"""stale-optimizer-params: the optimizer updates Parameter objects the model replaced after it was built."""

from __future__ import annotations

import ast
from typing import Any, Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import RuntimeCheck, StepEvent
from torchdoctor.sdk.source import FunctionScope, SourceFile, is_module_ctor, literal, ref

from ._optimizer_builds import optimizers_built_by_function, rebuilt_after
from ._user_names import name_of

_NET = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc(torch.relu(self.body(x)))


model = Net()
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

STALE_OPTIMIZER_PARAMS = Pitfall(
    code="TD302",
    name="stale-optimizer-params",
    severity="error",
    summary=(
        "The optimizer updates Parameter objects the model no longer uses (a module or parameter replaced "
        "after it was built)."
    ),
    why="""
        An optimizer holds references to the Parameter objects it was given. Replacing `model.fc` with a new layer
        (or re-binding an attribute to a new `nn.Parameter`, or rebuilding the model) after building the optimizer
        leaves the new weights out of it: they never train, while the optimizer keeps stepping the orphaned old
        ones, which the model no longer uses.
    """,
    fix="""
        Build the optimizer after the model is complete (after replacing heads, after re-wrapping), add the new
        parameters with `optimizer.add_param_group(...)`, or change the weights in place
        (`model.fc.reset_parameters()`, `with torch.no_grad(): model.fc.weight.copy_(w)`) so that the optimizer
        keeps holding the Parameters the model uses.
    """,
    bad=Example(
        "model.fc = nn.Linear(8, 2)  # a fresh head, after `optimizer` was built from the old one" + _LOOP,
        setup=_NET,
    ),
    good=Example(
        "model.fc = nn.Linear(8, 2)\n"
        "optimizer = torch.optim.SGD(model.parameters(), **optimizer.defaults)  # built again, after the change"
        + _LOOP,
        setup=_NET,
    ),
    details={
        "runtime": """
            At steps 0, `every`, ... below 32, then every `10 * every` steps and from step `100 * every` on every
            `100 * every`, right before the step, `watch`
            compares the identities of the parameters in each
            optimizer's `param_groups` with the parameters of the watched models. Parameters the optimizer updates
            that the model no longer has and that got no gradient are an error (tensors the model is called with
            through `torch.func.functional_call`, `torch.func.stack_module_state` ensembles under `vmap`, or
            parametrizations get gradients, and are quiet); a session that never steps is judged at its end
            from the identities alone; a model parameter with the same shape that no
            optimizer holds is named as the probable re-bound replacement (for example `fc.weight`). An optimizer
            whose parameters all lie outside the watched models is only reported when exactly one model and one
            optimizer are watched (the whole model was rebuilt or re-wrapped after the optimizer was made); with
            several, it may belong to a model you did not pass. Moving a model with `.to()` keeps the Parameter
            objects and is quiet; `set_overwrite_module_params_on_conversion(True)` is not.
        """,
        "source": """
            The lint rule finds `optimizer = torch.optim.X(model.parameters(), ...)` and a later assignment in the
            same function of a newly built module or parameter to `model`, `model.<attr>` or a parent of the modules
            the optimizer was built from, with no re-built optimizer or `add_param_group` after it, when the old
            optimizer is still used after the replacement and the two assignments are not in different arms of one
            `if` (only one of them runs). Moving the model
            with `.to()`/`.cuda()` after building the optimizer is fine by default (the Parameter objects are
            updated in place), so that is only reported under
            `torch.__future__.set_overwrite_module_params_on_conversion(True)`. Replacements it cannot see (in
            another function) are left to `watch`.
        """,
    },
)


def _qualname(optimizer: object) -> str:
    """How the optimizer's class is written in code: `torch.optim.SGD` for torch's own (re-exported there)."""
    import torch

    cls = type(optimizer)
    if cls.__module__.startswith("torch.optim.") and getattr(torch.optim, cls.__name__, None) is cls:
        return f"torch.optim.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


@STALE_OPTIMIZER_PARAMS.runtime
class StaleOptimizerParams(RuntimeCheck):
    """Compare the optimizer's parameter identities with the model's at the set-up steps (`ctx.setup_due`), right
    before a step.
    A tensor outside the model that got a gradient is in use (`torch.func.functional_call`,
    `stack_module_state` ensembles, parametrizations): only those without one are stale. A session that
    never steps is judged at its end from identities alone."""

    setup = True  # what it judges changes seldom

    def on_start(self) -> None:
        self.reported: set[frozenset[int]] = set()
        self.judged = False

    def on_periodic(self, event: StepEvent) -> Iterator[Finding]:
        self.judged = True
        yield from self._check(evidence=True, stepping=event.optimizer)

    def on_stop(self) -> Iterator[Finding]:
        if not self.judged:
            yield from self._check(evidence=False)

    def _check(self, evidence: bool, stepping: Any = None) -> Iterator[Finding]:
        """With `stepping`, only the optimizer about to step is judged: one that stopped stepping (replaced by
        an optimizer built again after the model changed) changes nothing any more."""
        model_ids = self.ctx.model_param_ids()
        held = self.ctx.optimizer_param_ids()
        lone = len(self.ctx.models) == 1 and len(self.ctx.optimizers) == 1
        for wo in [stepping] if stepping is not None else self.ctx.optimizers:
            foreign = [
                (g, i, p)
                for g, group in enumerate(wo.optimizer.param_groups)
                for i, p in enumerate(group["params"])
                if id(p) not in model_ids
            ]
            if foreign and evidence:
                foreign = [(g, i, p) for g, i, p in foreign if not _has_gradient(p)]
            if not foreign or frozenset(id(p) for _, _, p in foreign) in self.reported:
                continue
            if len(foreign) == len(wo.params()) and not lone:
                continue  # maybe the optimizer of a model that was not given to watch()
            self.reported.add(frozenset(id(p) for _, _, p in foreign))
            yield self._finding(wo, foreign, held)

    def _finding(self, wo: Any, foreign: list[tuple[int, int, Any]], held: set[int]) -> Finding:
        orphans = {
            tuple(p.shape): name
            for wm in self.ctx.models
            for name, p in wm.named_parameters()
            if p.requires_grad and id(p) not in held
        }
        listed = ", ".join(f"param_groups[{g}]['params'][{i}] {tuple(p.shape)}" for g, i, p in foreign[:4])
        twins = [orphans[tuple(p.shape)] for _, _, p in foreign if tuple(p.shape) in orphans]
        guess = (
            (
                f" The model's `{'`, `'.join(twins[:4])}` (same shape, in no optimizer) were probably re-bound "
                "after the optimizer was built."
            )
            if twins
            else ""
        )
        opt = name_of(wo.optimizer, "optimizer")
        model = (
            name_of(self.ctx.models[0].module, "model", None, self.ctx.models[0].inner)
            if len(self.ctx.models) == 1
            else "model"
        )
        return Finding(
            f"{wo.label} updates {len(foreign)} of its {len(wo.params())} parameters that are not in the model "
            f"any more ({listed}{', ...' if len(foreign) > 4 else ''}) and get no gradient: its steps change "
            "nothing the model uses." + guess,
            fix=Fix(
                f"Build `{opt}` again after the last change to `{model}` (re-assigning a layer, replacing or "
                "re-wrapping the model), with the same settings: paste this right after that change (or change "
                "the weights in place, so that it keeps holding the Parameters the model uses)",
                f"{opt} = {_qualname(wo.optimizer)}({model}.parameters(), **{opt}.defaults)",
            ),
            location=Location(param=twins[0] if twins else None, step=self.ctx.step),
            key=wo.label,
        )


def _has_gradient(p: Any) -> bool:
    """The backward before this step reached `p` (a gradient that is not all zero: an old one kept by
    ``zero_grad(set_to_none=False)`` is zero)."""
    grad = p.grad
    return grad is not None and grad.device.type != "meta" and bool(grad.any())


def _wraps(value: ast.Call, target: str) -> bool:
    """`model = DDP(model)`: the new module wraps the old one (same parameters), nothing goes stale."""
    return any(ref(a) == target for a in [*value.args, *(k.value for k in value.keywords)])


def _branch_arms(scope: FunctionScope) -> dict[int, set[tuple[int, int]]]:
    """id(statement) -> the (if statement, arm) pairs it sits in (0: the body, 1: the else part)."""
    arms: dict[int, set[tuple[int, int]]] = {}

    def visit(stmts: list[ast.stmt], inherited: frozenset[tuple[int, int]]) -> None:
        for stmt in stmts:
            arms[id(stmt)] = set(inherited)
            if isinstance(stmt, ast.If):
                visit(stmt.body, inherited | {(id(stmt), 0)})
                visit(stmt.orelse, inherited | {(id(stmt), 1)})
            elif not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for field in ("body", "orelse", "finalbody"):
                    visit(getattr(stmt, field, None) or [], inherited)
                for handler in getattr(stmt, "handlers", None) or []:
                    visit(handler.body, inherited)

    visit(getattr(scope.node, "body", []), frozenset())
    return arms


def _exclusive(arms: dict[int, set[tuple[int, int]]], a: ast.AST, b: ast.AST) -> bool:
    """The two statements sit in different arms of one `if`: at most one of them runs."""
    first, second = arms.get(id(a), set()), arms.get(id(b), set())
    return any((node, 1 - arm) in second for node, arm in first)


def _used_after(scope: FunctionScope, name: str, pos: tuple) -> bool:
    """`name` is read after `pos` in this function (the old optimizer still takes part in something)."""
    for node in ast.walk(scope.node):
        if (
            isinstance(node, (ast.Name, ast.Attribute))
            and isinstance(node.ctx, ast.Load)
            and (node.lineno, node.col_offset) > pos
            and ref(node) == name
        ):
            return True
    return False


@STALE_OPTIMIZER_PARAMS.source
def stale_optimizer_params(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or "parameters()" not in src.text:
        return
    index = src.index
    overwrite = "set_overwrite_module_params_on_conversion" in src.text and any(
        c.attr == "set_overwrite_module_params_on_conversion" and c.node.args and literal(c.node.args[0]) is True
        for c in index.all_calls()
    )
    for scope, builds in optimizers_built_by_function(index):
        arms: dict[int, set[tuple[int, int]]] = {}
        for built in builds:
            model = built.model
            inside = model + "."  # a part of the model: `model.fc`
            # what holds the model: `self` for `self.model` (every target `model` starts with, up to a dot)
            holders = {model[:i] for i, char in enumerate(model) if char == "."}
            for b in scope.bindings:
                target = b.target
                replaced = target == model or target in holders or target.startswith(inside)
                if not replaced or b.pos <= built.binding.pos or b.augmented or rebuilt_after(scope, built, b.pos):
                    continue
                arms = arms or _branch_arms(scope)  # built once per function, and only when needed
                if _exclusive(arms, built.binding.node, b.node) or not _used_after(scope, built.optimizer, b.pos):
                    continue  # the two never run together, or the old optimizer is never used again
                if isinstance(b.value, ast.Call) and is_module_ctor(b.value, index) and not _wraps(b.value, b.target):
                    yield Finding(
                        f"`{src.snippet(b.node)}` (line {b.pos[0]}) replaces part of `{built.model}` after "
                        f"`{built.optimizer}` was built from its parameters (line {built.binding.pos[0]}): the "
                        "optimizer keeps updating the old Parameter objects and never the new ones.",
                        fix=Fix(
                            f"Build `{built.optimizer}` after the model is complete (or add the new parameters "
                            f"with `{built.optimizer}.add_param_group(...)`)."
                        ),
                        location=src.location(b.node),
                    )
                    break
            if overwrite:
                for c in scope.calls:
                    if (
                        c.receiver == built.model
                        and c.attr in ("to", "cuda")
                        and c.pos > built.binding.pos
                        and not rebuilt_after(scope, built, c.pos)
                    ):
                        yield Finding(
                            f"`{src.snippet(c.node)}` runs after `{built.optimizer}` was built (line "
                            f"{built.binding.pos[0]}) while `set_overwrite_module_params_on_conversion(True)` is on: "
                            "the move creates new Parameter objects and the optimizer keeps the old ones.",
                            fix=Fix(f"Move the model first, then build `{built.optimizer}`."),
                            location=src.location(c.node),
                        )
                        break
