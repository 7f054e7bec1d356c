"""Inside ``torch.func`` transforms: a module's parameters are the transforms' wrappers (a BatchedTensor
under vmap, a GradTrackingTensor under grad); what they wrap, level by level, is the tensor the user passed
in (an ensemble's stacked parameters from ``stack_module_state``). Read through functorch's C functions,
which torch.func itself uses; a torch without them reads nothing."""

from __future__ import annotations

from typing import Any

import torch

_functorch: Any = getattr(torch._C, "_functorch", None)
_READY = all(
    hasattr(_functorch, name)
    for name in ("get_interpreter_stack", "TransformType", "is_functorch_wrapped_tensor", "get_unwrapped")
)


def only_vmap() -> bool:
    """Whether transforms run now and every one is vmap: nothing differentiates the call inside them (no
    grad, vjp, jvp, jacrev, ...), so a graph its output carries belongs to plain autograd outside."""
    if not _READY:
        return False
    stack = _functorch.get_interpreter_stack()
    vmap = _functorch.TransformType.Vmap
    return bool(stack) and all(i.key() == vmap for i in stack)


def transformed_leaves(module: torch.nn.Module) -> list[torch.Tensor]:
    """The tensors outside every transform that `module`'s parameters (its submodules' too) stand for,
    those that autograd tracks as leaves requiring grad: a backward through the call's output reaches them."""
    if not _READY:
        return []
    out: list[torch.Tensor] = []
    for p in module.parameters():
        t = p
        while _functorch.is_functorch_wrapped_tensor(t):
            t = _functorch.get_unwrapped(t)
        if t.requires_grad and t.is_leaf:
            out.append(t)
    return out
