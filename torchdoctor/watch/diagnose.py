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
]

_ADVICE = {
    "backward-twice": "A tensor from an earlier step (an RNN hidden state, a running loss) is still attached to its "
                      "graph: detach it each step (`h = h.detach()`, `total += loss.item()`). Use retain_graph=True "
                      "only when you really back-propagate the same graph twice.",
    "inplace-modified": "A tensor saved for backward was changed in place (`x += ...`, `relu(inplace=True)`, or "
                        "optimizer.step() between a forward and its backward, as in GANs). Run once under "
                        "`torch.autograd.set_detect_anomaly(True)` to get the forward line that saved it.",
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
    recent = [f for f in findings if (f.severity or Severity.INFO) >= Severity.WARNING][-3:]
    if recent:
        seen.append("findings before the error: " + "; ".join(f"{f.code} {f.name}" for f in recent))
    return {"error": f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}", "kind": kind,
            "seen": seen, "advice": _ADVICE[kind]}
