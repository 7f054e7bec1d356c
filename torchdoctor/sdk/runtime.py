"""Runtime detectors (``@pitfall.runtime`` / ``@pitfall.distributed``): the `RuntimeCheck` base class, the
watch events it handles, and the services a check uses from its handlers.

The contract (events, their order, and the rules for handlers) is documented in
`torchdoctor.watch.contract`. The services that need torch — graph sentinels and footprints, batch
fingerprints, the cross-rank exchange — are imported on first use, so a checks module can import this one
at load time without importing torch.
"""

from typing import Any

from torchdoctor.watch.contract import (
    CrashEvent,
    Event,
    Findings,
    ForwardEvent,
    LoaderEvent,
    RuntimeCheck,
    StepEvent,
    TransformedForwardEvent,
    ZeroGradEvent,
)
from torchdoctor.watch.handles import Restore
from torchdoctor.watch.patches import MethodPatch
from torchdoctor.watch.userframe import frame_variables, is_library, user_frame, user_frames, user_line
from torchdoctor.wrappers import unwrap, unwrap_optimizer, wrapper_chain

_LAZY = {
    "MODE_DEPENDENT": "torchdoctor.watch.context",
    "first_graph_tensor": "torchdoctor.watch.context",
    "WatchedModel": "torchdoctor.watch.context",
    "footprint": "torchdoctor.watch.graphs",
    "batch_sums": "torchdoctor.watch.fingerprint",
    "digest": "torchdoctor.watch.fingerprint",
    "fingerprint": "torchdoctor.watch.fingerprint",
    "RankExchange": "torchdoctor.watch.distributed",
    "Round": "torchdoctor.watch.distributed",
    "exchange_for": "torchdoctor.watch.distributed",
    "ddp_over_world": "torchdoctor.watch.distributed",
    "stats_differ": "torchdoctor.watch.distributed",
    # inside torch.func transforms: what the wrapped parameters wrap (`TransformedForwardEvent`)
    "transformed_leaves": "torchdoctor.watch.transformed",
    "only_vmap": "torchdoctor.watch.transformed",
    # the step clock (``uses_clock``): phase indices of its readings, and its types
    "PHASES": "torchdoctor.watch.timing",
    "DATA": "torchdoctor.watch.timing",
    "FORWARD": "torchdoctor.watch.timing",
    "BACKWARD": "torchdoctor.watch.timing",
    "OPTIMIZER": "torchdoctor.watch.timing",
    "OTHER": "torchdoctor.watch.timing",
    "LoaderWait": "torchdoctor.watch.timing",
    "StepClock": "torchdoctor.watch.timing",
}
# Modules offered whole: `evidence` for crash checks (failing frames, placement, memory held)
_MODULES = {"evidence": "torchdoctor.watch.evidence"}

__all__ = [
    "CrashEvent",
    "Event",
    "ForwardEvent",
    "Findings",
    "LoaderEvent",
    "MethodPatch",
    "Restore",
    "RuntimeCheck",
    "StepEvent",
    "TransformedForwardEvent",
    "ZeroGradEvent",
    "frame_variables",
    "is_library",
    "unwrap",
    "unwrap_optimizer",
    "user_frame",
    "user_frames",
    "user_line",
    "wrapper_chain",
    *_LAZY,
    *_MODULES,
]


def __getattr__(name: str) -> Any:
    """Load the torch-backed services on first use."""
    import importlib

    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'torchdoctor.sdk.runtime' has no attribute {name!r}")
