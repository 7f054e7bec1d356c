"""Optimizer rules in source: built before the model changed, state loaded before the move, wrapped in DataParallel."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterator, Optional

from torchdoctor.findings import Finding
from torchdoctor.lint.flow import is_module_ctor, is_optimizer, is_optimizer_ctor, literal
from torchdoctor.lint.index import Binding, FunctionScope, ModuleIndex, last, ref
from torchdoctor.lint.source import SourceFile
from torchdoctor.registry import Scope, check


@dataclass
class _Built:
    """`optimizer = torch.optim.X(model.parameters(), ...)`: which optimizer, from which model, where."""

    optimizer: str
    model: str
    binding: Binding


def _optimizers_built(scope: FunctionScope, index: ModuleIndex) -> Iterator[_Built]:
    for b in scope.bindings:
        if b.augmented or not isinstance(b.value, ast.Call) or not is_optimizer_ctor(b.value, index):
            continue
        for node in ast.walk(b.value):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("parameters", "named_parameters"):
                model = ref(node.func.value)
                if model:
                    yield _Built(b.target, model, b)
                break


def _rebuilt_after(scope: FunctionScope, built: _Built, pos: tuple) -> bool:
    """The optimizer is built again (or given new parameter groups) after `pos`."""
    return any(b.target == built.optimizer and b.pos > pos for b in scope.bindings) or any(
        c.receiver == built.optimizer and c.attr == "add_param_group" and c.pos > pos for c in scope.calls)


def _wraps(value: ast.Call, target: str) -> bool:
    """`model = DDP(model)`: the new module wraps the old one (same parameters), nothing goes stale."""
    return any(ref(a) == target for a in [*value.args, *(k.value for k in value.keywords)])


@check(code="TD302", name="stale-optimizer-params", scope=Scope.SOURCE, severity="error",
       summary="The optimizer updates Parameter objects the model no longer uses (a module or parameter replaced after it was built).")
def stale_optimizer_params(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or "parameters()" not in src.text:
        return
    index = src.index
    overwrite = any(c.attr == "set_overwrite_module_params_on_conversion" and c.node.args
                    and literal(c.node.args[0]) is True for c in index.all_calls())
    for scope in index.scopes:
        for built in _optimizers_built(scope, index):
            for b in scope.bindings:
                replaced = b.target == built.model or b.target.startswith(built.model + ".") \
                    or built.model.startswith(b.target + ".")
                if not replaced or b.pos <= built.binding.pos or b.augmented or _rebuilt_after(scope, built, b.pos):
                    continue
                if isinstance(b.value, ast.Call) and is_module_ctor(b.value, index) and not _wraps(b.value, b.target):
                    yield Finding(
                        f"`{src.snippet(b.node)}` (line {b.pos[0]}) replaces part of `{built.model}` after "
                        f"`{built.optimizer}` was built from its parameters (line {built.binding.pos[0]}): the "
                        "optimizer keeps updating the old Parameter objects and never the new ones.",
                        fix=f"Build `{built.optimizer}` after the model is complete (or add the new parameters with "
                            f"`{built.optimizer}.add_param_group(...)`).",
                        location=src.location(b.node),
                    )
                    break
            if overwrite:
                for c in scope.calls:
                    if c.receiver == built.model and c.attr in ("to", "cuda") and c.pos > built.binding.pos \
                            and not _rebuilt_after(scope, built, c.pos):
                        yield Finding(
                            f"`{src.snippet(c.node)}` runs after `{built.optimizer}` was built (line "
                            f"{built.binding.pos[0]}) while `set_overwrite_module_params_on_conversion(True)` is on: "
                            "the move creates new Parameter objects and the optimizer keeps the old ones.",
                            fix=f"Move the model first, then build `{built.optimizer}`.",
                            location=src.location(c.node),
                        )
                        break


def _moves_off_cpu(call: ast.Call) -> bool:
    target = call.args[0] if call.args else None
    for kw in call.keywords:
        if kw.arg == "device":
            target = kw.value
    if isinstance(target, ast.Call) and target.args:
        target = target.args[0]  # torch.device("cpu")
    value = literal(target)
    return not (isinstance(value, str) and value.startswith("cpu"))


def _moved_before(scope: FunctionScope, model: str, pos: tuple) -> bool:
    """The model was moved before `pos` (`model = Net().to(device)`, `model.cuda()`): a later move may be a no-op."""
    return any(c.pos < pos and c.attr in ("to", "cuda") and (c.receiver == model or any(
        b.target == model and b.value is not None and c.node in ast.walk(b.value) for b in scope.bindings))
        for c in scope.calls)


@check(code="TD304", name="optimizer-state-device", scope=Scope.SOURCE, severity="error",
       summary="Optimizer state (exp_avg, momentum_buffer, ...) is on another device than its parameters.")
def optimizer_state_device(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or "load_state_dict" not in src.text:
        return
    index = src.index
    for scope in index.scopes:
        for built in _optimizers_built(scope, index):
            loads = [c for c in scope.calls if c.receiver == built.optimizer and c.attr == "load_state_dict"
                     and c.pos > built.binding.pos]
            for load in loads[:1]:
                move = next((c for c in scope.calls if c.pos > load.pos and c.receiver == built.model
                             and (c.attr == "cuda" or c.attr == "to" and _moves_off_cpu(c.node))), None)
                if move is None or _moved_before(scope, built.model, load.pos) \
                        or _rebuilt_after(scope, built, move.pos) \
                        or any(c.receiver == built.optimizer and c.attr == "load_state_dict" and c.pos > move.pos
                               for c in scope.calls):
                    continue
                yield Finding(
                    f"`{src.snippet(load.node)}` (line {load.pos[0]}) runs before `{src.snippet(move.node)}` "
                    f"(line {move.pos[0]}): load_state_dict casts the state to the device the parameters are on "
                    "at that moment, so it stays behind when the model moves, and `step()` fails with "
                    "'Expected all tensors to be on the same device'.",
                    fix=f"Move the model first, then build `{built.optimizer}` and load its state:\n"
                        f"{built.model}.to(device)\n{built.optimizer} = ...({built.model}.parameters())\n"
                        f"{built.optimizer}.load_state_dict(checkpoint['optimizer'])",
                    location=src.location(load.node),
                )


@check(code="TD505", name="dataparallel-optimizer", scope=Scope.SOURCE, severity="error",
       summary="An optimizer is wrapped in DataParallel/DistributedDataParallel, which only wraps modules.")
def dataparallel_optimizer(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or "DataParallel" not in src.text:
        return
    index = src.index
    for scope in index.scopes:
        for call in scope.calls:
            if last(call.qualname) not in ("DataParallel", "DistributedDataParallel") or not call.node.args:
                continue
            wrapped: Optional[str] = ref(call.node.args[0])
            if is_optimizer(wrapped, scope, index):
                yield Finding(
                    f"`{src.snippet(call.node)}` wraps the optimizer `{wrapped}`: DataParallel only parallelises "
                    "modules; the optimizer is not a module and must stay as it is.",
                    fix=f"Wrap the model, then build the optimizer from it:\nmodel = {last(call.qualname)}(model)\n"
                        f"{wrapped} = torch.optim.SGD(model.parameters(), lr=...)",
                    location=src.location(call.node),
                )
