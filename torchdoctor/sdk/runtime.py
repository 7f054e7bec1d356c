"""Runtime detectors (``@pitfall.runtime`` / ``@pitfall.distributed``): the `RuntimeCheck` base class, the
watch events it handles, and the services a check uses from its handlers.

The contract (events, their order, and the rules for handlers) is documented in
`torchdoctor.watch.contract`. The services that need torch — graph sentinels and footprints, batch
fingerprints, the cross-rank exchange — are imported on first use, so a checks module can import this one
at load time without importing torch.
"""

from typing import TYPE_CHECKING, Any

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
from torchdoctor.wrappers import unwrap, unwrap_optimizer, wrapper_chain

if TYPE_CHECKING:
    from torchdoctor.watch.calls import dynamo_tracing as dynamo_tracing
    from torchdoctor.watch.handles import Restore as Restore
    from torchdoctor.watch.patches import MethodPatch as MethodPatch
    from torchdoctor.watch.userframe import frame_variables as frame_variables
    from torchdoctor.watch.userframe import is_library as is_library
    from torchdoctor.watch.userframe import user_frame as user_frame
    from torchdoctor.watch.userframe import user_frames as user_frames
    from torchdoctor.watch.userframe import user_line as user_line

_LAZY = {
    # helpers for handlers, loaded when first asked for: a checks module imports this one whatever door loads it
    # (`torchdoctor check-ckpt` imports only the contract, for the base class of its runtime detectors)
    "Restore": "torchdoctor.watch.handles",
    "dynamo_tracing": "torchdoctor.watch.calls",  # True while dynamo inlines a hook into a compiled forward
    "MethodPatch": "torchdoctor.watch.patches",
    "frame_variables": "torchdoctor.watch.userframe",
    "is_library": "torchdoctor.watch.userframe",
    "user_frame": "torchdoctor.watch.userframe",
    "user_frames": "torchdoctor.watch.userframe",
    "user_line": "torchdoctor.watch.userframe",
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
    "run_delay": "torchdoctor.watch.run_delay",
}
# Modules offered whole: `evidence` for crash checks (failing frames, placement, memory held)
_MODULES = {"evidence": "torchdoctor.watch.evidence"}

__all__ = [
    "CrashEvent",
    "Event",
    "ForwardEvent",
    "Findings",
    "LoaderEvent",
    "RuntimeCheck",
    "StepEvent",
    "TransformedForwardEvent",
    "ZeroGradEvent",
    "unwrap",
    "unwrap_optimizer",
    "wrapper_chain",
    *_LAZY,
    *_MODULES,
]


def __getattr__(name: str) -> Any:
    """Load the helpers and the torch-backed services on first use."""
    import importlib

    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'torchdoctor.sdk.runtime' has no attribute {name!r}")
