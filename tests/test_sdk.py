"""The SDK's shared services: one wrapper walker, one batch fingerprint, one table of wrapper prefixes."""

import subprocess
import sys

import torch
from torch import nn

from torchdoctor.sdk import WRAPPER_PREFIXES
from torchdoctor.sdk.runtime import fingerprint, unwrap, wrapper_chain


def test_unwrap_sees_through_stacked_wrappers_outermost_first():
    inner = nn.Linear(2, 2)
    compiled = torch.compile(nn.DataParallel(inner))
    assert unwrap(compiled) == (inner, ["torch.compile", "DataParallel"])
    assert [type(w).__name__ for w in wrapper_chain(compiled)] == ["OptimizedModule", "DataParallel"]
    assert unwrap(inner) == (inner, []) and wrapper_chain(inner) == []


def test_a_module_attribute_is_not_a_wrapper():
    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.module = nn.Linear(2, 2)  # an ordinary submodule named `module`

    holder = Holder()
    assert unwrap(holder) == (holder, [])


def test_wrapper_prefixes_match_what_the_wrappers_write():
    inner = nn.Linear(2, 2)
    for wrapped in (nn.DataParallel(inner), torch.compile(inner)):
        prefix = next(iter(wrapped.state_dict())).split(".")[0] + "."
        assert prefix in WRAPPER_PREFIXES


def test_fingerprint_tells_batches_apart_and_equal_batches_equal():
    x = torch.arange(12.0).reshape(4, 3)
    assert fingerprint([x, {"y": torch.ones(4)}]) == fingerprint([x.clone(), {"y": torch.ones(4)}])
    swapped = x[[1, 0, 2, 3]]
    assert fingerprint(x) != fingerprint(swapped) != fingerprint(x + 1e-3)


def test_importing_the_sdk_does_not_import_torch():
    code = (
        "import sys, torchdoctor.sdk, torchdoctor.sdk.runtime, torchdoctor.sdk.source, "
        "torchdoctor.sdk.env, torchdoctor.sdk.checkpoint; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
