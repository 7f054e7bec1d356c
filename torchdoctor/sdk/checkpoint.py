"""What a checkpoint detector (``@pitfall.checkpoint``) receives, read without executing the file, and the
state-dict key services (wrapper prefixes, key matching) shared with ``check-ckpt --model``/``--fix``."""

from torchdoctor.ckpt.info import UNREADABLE, CheckpointInfo, ModelKeys, StateDict, TensorEntry, TensorTable, show_path
from torchdoctor.ckpt.keys import LOOSE_PREFIXES, Match, best_match, share, wrapper_prefix
from torchdoctor.ckpt.objects import GlobalRef, Instance, TensorMeta, show_args
from torchdoctor.ckpt.policy import Use, Verdict, dangerous_reason

__all__ = [
    "CheckpointInfo",
    "GlobalRef",
    "Instance",
    "LOOSE_PREFIXES",
    "Match",
    "ModelKeys",
    "StateDict",
    "TensorEntry",
    "TensorMeta",
    "TensorTable",
    "UNREADABLE",
    "Use",
    "Verdict",
    "best_match",
    "dangerous_reason",
    "share",
    "show_args",
    "show_path",
    "wrapper_prefix",
]
