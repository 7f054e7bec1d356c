"""Model wrappers — nn.DataParallel, DistributedDataParallel, torch.compile — known in one place: how to
see through them at run time, and the state-dict key prefix each one adds.

Torch-free at import; the walkers take live modules.
"""

from __future__ import annotations

from typing import Any

# The key prefix each wrapper adds to a state_dict, and who adds it.
WRAPPER_PREFIXES: dict[str, str] = {
    "module.": "nn.DataParallel / DistributedDataParallel",
    "_orig_mod.": "torch.compile",
}


def _inner(module: Any) -> Any:
    """The module `module` wraps, or None when it is not a wrapper."""
    from torch import nn

    if isinstance(module, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        return module.module
    if type(module).__name__ == "OptimizedModule" and isinstance(getattr(module, "_orig_mod", None), nn.Module):
        return module._orig_mod
    return None


def wrapper_chain(module: Any) -> list[Any]:
    """The wrappers around the user's model, outermost first (empty for a plain module)."""
    chain = []
    inner = _inner(module)
    while inner is not None:
        chain.append(module)
        module, inner = inner, _inner(inner)
    return chain


def unwrap(module: Any) -> tuple[Any, list[str]]:
    """The model inside every wrapper, and the wrappers' names (outermost first)."""
    chain = wrapper_chain(module)
    names = ["torch.compile" if type(w).__name__ == "OptimizedModule" else type(w).__name__ for w in chain]
    return (_inner(chain[-1]) if chain else module), names


# Attributes under which optimizer wrappers keep the optimizer they wrap: accelerate's AcceleratedOptimizer
# and DeepSpeed's ZeRO optimizers (`optimizer`), Lightning's LightningOptimizer (`_optimizer`).
_OPTIMIZER_ATTRS = ("optimizer", "_optimizer")


def unwrap_optimizer(optimizer: Any) -> tuple[Any, list[str]]:
    """The torch optimizer inside optimizer wrappers (accelerate, Lightning, HF Trainer, DeepSpeed-style),
    and the wrappers' type names (outermost first). A wrapper is an object that keeps a torch optimizer
    under `optimizer`/`_optimizer` and shows its param_groups (or has none of its own hook state)."""
    import torch

    names: list[str] = []
    for _ in range(4):
        inner = next(
            (
                v
                for a in _OPTIMIZER_ATTRS
                if isinstance(v := getattr(optimizer, a, None), torch.optim.Optimizer) and v is not optimizer
            ),
            None,
        )
        if inner is None:
            break
        own_groups = getattr(optimizer, "param_groups", None)
        if (
            own_groups is not None
            and own_groups is not inner.param_groups
            and "_optimizer_step_pre_hooks" in getattr(optimizer, "__dict__", {})
        ):
            break  # a real optimizer of its own that merely holds another one
        names.append(type(optimizer).__name__)
        optimizer = inner
    return optimizer, names
