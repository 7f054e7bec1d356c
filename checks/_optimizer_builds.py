"""Lint helpers shared by the optimizer rules: where an optimizer is built from a model's parameters, and
whether it is built again (or given new parameter groups) later in the same function."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterator

from torchdoctor.sdk.source import Binding, FunctionScope, ModuleIndex, first_method_call, optimizer_bindings, ref


@dataclass
class Built:
    """`optimizer = torch.optim.X(model.parameters(), ...)`: which optimizer, from which model, where."""

    optimizer: str
    model: str
    binding: Binding


def optimizers_built_by_function(index: ModuleIndex) -> list[tuple[FunctionScope, list[Built]]]:
    """The functions of the module that build optimizers, with what each builds, in the module's order (worked
    out once per module: the rules that ask go through these few functions, not every function)."""
    question = ("optimizers built, by function",)
    found = index.memo.get(question)
    if found is None:
        found = index.memo[question] = [(s, built) for s in index.scopes if (built := list(_built(s, index)))]
    return found


def _built(scope: FunctionScope, index: ModuleIndex) -> Iterator[Built]:
    for b in optimizer_bindings(scope, index):
        if b.augmented or type(b.value) is not ast.Call:
            continue
        found = first_method_call(b.value, _PARAMETERS)
        model = ref(found.func.value) if found is not None and isinstance(found.func, ast.Attribute) else None
        if model:
            yield Built(b.target, model, b)


_PARAMETERS = frozenset({"parameters", "named_parameters"})


def rebuilt_after(scope: FunctionScope, built: Built, pos: tuple) -> bool:
    """The optimizer is built again (or given new parameter groups) after `pos`."""
    return any(b.target == built.optimizer and b.pos > pos for b in scope.bindings) or any(
        c.receiver == built.optimizer and c.attr == "add_param_group" and c.pos > pos for c in scope.calls
    )
