"""Helpers shared by the checkpoint pitfalls: the examples' tiny model, and how a fix loads a state dict."""

from __future__ import annotations

from torchdoctor.sdk.checkpoint import CheckpointInfo, StateDict

MAX_LISTED = 8  # tensors named in one finding

# The hidden setup of most checkpoint examples: a tiny model, and the code that builds it.
MODEL_SETUP = """
import torch
from torch import nn


def make_model():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


model = make_model()
"""


def load_line(info: CheckpointInfo, sd: StateDict) -> str:
    """The line of a fix that loads state dict `sd` from the checked file (a pickled module needs trust)."""
    access = "".join(f"[{part!r}]" for part in sd.path)
    if sd.source == "module":  # a pickled nn.Module: its weights come from .state_dict()
        return (
            f"sd = torch.load({info.path!r}, map_location='cpu', weights_only=False){access}.state_dict()"
            "  # only if you trust the file"
        )
    return f"sd = torch.load({info.path!r}, map_location='cpu'){access}"
