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
