"""The safe checkpoint reader: parses torch.save/TorchScript/legacy/pickle/safetensors files without torch
and without executing them, into a `CheckpointInfo` for the checkpoint checks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from torchdoctor.ckpt.errors import CheckpointError

if TYPE_CHECKING:
    from torchdoctor.ckpt.info import CheckpointInfo
    from torchdoctor.ckpt.unpickler import Limits


def read_checkpoint(path: str, limits: Optional[Limits] = None) -> CheckpointInfo:
    """Read and analyse `path`; raises `CheckpointError` (one-line message) when it is not a checkpoint."""
    from torchdoctor.ckpt.reader import read_archive
    from torchdoctor.ckpt.structure import analyze
    from torchdoctor.ckpt.unpickler import Limits

    return analyze(read_archive(str(path), limits or Limits()))


def __getattr__(name: str) -> Any:
    """`CheckpointInfo` and `Limits` are imported on first use (check modules stay cheap to import)."""
    if name == "CheckpointInfo":
        from torchdoctor.ckpt.info import CheckpointInfo

        return CheckpointInfo
    if name == "Limits":
        from torchdoctor.ckpt.unpickler import Limits

        return Limits
    raise AttributeError(f"module 'torchdoctor.ckpt' has no attribute {name!r}")


__all__ = ["CheckpointError", "CheckpointInfo", "Limits", "read_checkpoint"]
