"""Exception diagnosis: when the watched body raises a known PyTorch error, say what the session saw.

The exception itself is never touched; the diagnosis goes into the report (facts["exception"]). Crashes
that a pitfall explains (out-of-memory, device-mismatch, state-dict-mismatch, ...: the ``CRASH`` event,
`torchdoctor.watch.crash`) are left to it; what remains here are the errors no pitfall covers yet.
"""
from __future__ import annotations

import re
from typing import Any, Optional

import torch

from torchdoctor.findings import Finding, Severity
from torchdoctor.watch.context import WatchContext

_KINDS = [
    ("backward-twice", re.compile(r"backward through the graph a second time")),
    ("inplace-modified", re.compile(r"modified by an inplace operation")),
    # binary_cross_entropy (CPU message, CUDA device assertion) and multinomial/bernoulli fed NaN probabilities
    ("nan-in-loss-input", re.compile(r"elements of input should be between 0 and 1|input_val >= zero && input_val <= one"
                                     r"|probability tensor contains either `inf`, `nan`|p_in >= 0 && p_in <= 1")),
]

_ADVICE = {
    "backward-twice": "A tensor from an earlier step (an RNN hidden state, a running loss) is still attached to its "
                      "graph: detach it each step (`h = h.detach()`, `total += loss.item()`). Use retain_graph=True "
                      "only when you really back-propagate the same graph twice.",
    "inplace-modified": "A tensor saved for backward was changed in place (`x += ...`, `relu(inplace=True)`, or "
                        "optimizer.step() between a forward and its backward, as in GANs). Run once under "
                        "`torch.autograd.set_detect_anomaly(True)` to get the forward line that saved it.",
    "nan-in-loss-input": "The loss (or sampling) received NaN or values outside [0, 1]: usually NaN from the forward, "
                         "which in turn comes from NaN weights or inputs. Use BCEWithLogitsLoss on raw logits "
                         "(numerically safe), and run `torchdoctor.watch` (nonfinite-values) to find where NaN began.",
}


def diagnose_exception(exc: BaseException, ctx: WatchContext, findings: list[Finding]) -> Optional[dict[str, Any]]:
    """A diagnosis for a known PyTorch error (None for others): kind, step, what the session saw, advice."""
    text = str(exc)
    kind = next((k for k, pattern in _KINDS if pattern.search(text)), None)
    if kind is None:
        return None
    seen: list[str] = [f"the error came at step {ctx.step}"
                       + (f" (completed steps: {', '.join(f'{wo.label} {wo.steps}' for wo in ctx.optimizers)})"
                          if ctx.optimizers else "")]
    if kind == "backward-twice":
        seen.append(f"autograd graphs of watched forwards still alive: {ctx.graphs.sentinels}")
    elif kind == "nan-in-loss-input":
        seen += _nonfinite_parameters(ctx)
    recent = [f for f in findings if (f.severity or Severity.INFO) >= Severity.WARNING][-3:]
    if recent:
        seen.append("findings before the error: " + "; ".join(f"{f.code} {f.name}" for f in recent))
    return {"error": f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}", "kind": kind,
            "seen": seen, "advice": _ADVICE[kind]}


def _nonfinite_parameters(ctx: WatchContext) -> list[str]:
    """Whether the watched models' parameters are still finite (the error stops the loop: one pass is cheap)."""
    lines = []
    for wm in ctx.models:
        named = [(n, p) for n, p in wm.named_parameters() if p.is_floating_point() and p.device.type != "meta"]
        bad = [n for n, p in named if not bool(torch.isfinite(p).all())]
        lines.append(f"{wm.label}: {len(bad)} of {len(named)} parameter tensors hold NaN/Inf"
                     + (f" (first `{bad[0]}`): the weights were already broken" if bad else
                        ": the weights are finite, so the NaN came from this batch or the forward"))
    return lines
