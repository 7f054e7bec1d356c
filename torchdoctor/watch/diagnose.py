"""Exception diagnosis: when the watched body raises a known PyTorch error, say what the session saw.

The exception itself is never touched; the diagnosis goes into the report (facts["exception"]).
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any, Optional

import torch

from torchdoctor.findings import Finding, Severity
from torchdoctor.watch.context import WatchContext

_KINDS = [
    ("device-mismatch", re.compile(r"same device|found at least two devices|must have its parameters and buffers on device"
                                   r"|is not on the expected device|Input type \(.*\) and weight type", re.I)),
    ("dtype-mismatch", re.compile(r"expected scalar type|same dtype|dtype mismatch|expected .* dtype|Found dtype", re.I)),
    ("backward-twice", re.compile(r"backward through the graph a second time")),
    ("inplace-modified", re.compile(r"modified by an inplace operation")),
    ("no-grad", re.compile(r"does not require grad and does not have a grad_fn")),
    ("out-of-memory", re.compile(r"out of memory", re.I)),
    ("state-dict-keys", re.compile(r"Error\(s\) in loading state_dict")),
    # binary_cross_entropy (CPU message, CUDA device assertion) and multinomial/bernoulli fed NaN probabilities
    ("nan-in-loss-input", re.compile(r"elements of input should be between 0 and 1|input_val >= zero && input_val <= one"
                                     r"|probability tensor contains either `inf`, `nan`|p_in >= 0 && p_in <= 1")),
]

_ADVICE = {
    "device-mismatch": "Move the model before building the optimizer or loading its state, and move every batch "
                       "with the result assigned: `x = x.to(device)` (tensors are not moved in place).",
    "dtype-mismatch": "Cast inputs to the parameters' dtype (`x = x.to(next(model.parameters()).dtype)`), or run the "
                      "mixed-precision part under `torch.autocast`.",
    "backward-twice": "A tensor from an earlier step (an RNN hidden state, a running loss) is still attached to its "
                      "graph: detach it each step (`h = h.detach()`, `total += loss.item()`). Use retain_graph=True "
                      "only when you really back-propagate the same graph twice.",
    "inplace-modified": "A tensor saved for backward was changed in place (`x += ...`, `relu(inplace=True)`, or "
                        "optimizer.step() between a forward and its backward, as in GANs). Run once under "
                        "`torch.autograd.set_detect_anomaly(True)` to get the forward line that saved it.",
    "no-grad": "The loss has no graph: the forward ran under torch.no_grad()/inference_mode, the parameters are "
               "frozen, or the loss was rebuilt from `.item()`/`.detach()` values.",
    "out-of-memory": "Lower the batch size, free tensors kept across steps (`.item()` for logged losses), validate "
                     "under torch.no_grad(), or use autocast / gradient checkpointing.",
    "nan-in-loss-input": "The loss (or sampling) received NaN or values outside [0, 1]: usually NaN from the forward, "
                         "which in turn comes from NaN weights or inputs. Use BCEWithLogitsLoss on raw logits "
                         "(numerically safe); this session's nonfinite-values finding names the variables that held NaN.",
    "state-dict-keys": "Strip or add the wrapper prefix so that the keys match: "
                       "`torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(sd, 'module.')`.",
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
    if kind in ("device-mismatch", "dtype-mismatch"):
        seen += _placement(ctx)
    elif kind == "no-grad" and ctx.last_forward is not None:
        lf = ctx.last_forward
        mode = "inference_mode" if lf.inference_mode else ("grad enabled" if lf.grad_enabled else "torch.no_grad()")
        seen.append(f"the last forward of {lf.label} ran in {'train' if lf.training else 'eval'}() mode under {mode}")
        for wm in ctx.models:
            trainable = sum(p.requires_grad for p in wm.inner.parameters())
            seen.append(f"{wm.label} has {trainable} parameter tensor(s) with requires_grad=True")
    elif kind in ("backward-twice", "out-of-memory"):
        seen.append(f"autograd graphs of watched forwards still alive: {ctx.graphs.sentinels}")
        if kind == "out-of-memory" and torch.cuda.is_available() and torch.cuda.is_initialized():
            seen.append(f"CUDA memory allocated {torch.cuda.memory_allocated()} bytes, "
                        f"reserved {torch.cuda.memory_reserved()} bytes")
    elif kind == "state-dict-keys":
        seen += _key_prefixes(text)
    elif kind == "nan-in-loss-input":
        seen += _nonfinite_parameters(ctx)
    recent = [f for f in findings if (f.severity or Severity.INFO) >= Severity.WARNING][-3:]
    if recent:
        seen.append("findings before the error: " + "; ".join(f"{f.code} {f.name}" for f in recent))
    return {"error": f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}", "kind": kind,
            "seen": seen, "advice": _ADVICE[kind]}


def _placement(ctx: WatchContext) -> list[str]:
    """Where parameters and optimizer state live, e.g. 'Net parameters: 4 on cpu/torch.float32'."""
    lines = []
    for wm in ctx.models:
        where = Counter(f"{p.device}/{p.dtype}" for p in wm.inner.parameters())
        lines.append(f"{wm.label} parameters: " + ", ".join(f"{n} on {k}" for k, n in where.items()))
        buffers = Counter(f"{b.device}/{b.dtype}" for b in wm.inner.buffers())
        if buffers:
            lines.append(f"{wm.label} buffers: " + ", ".join(f"{n} on {k}" for k, n in buffers.items()))
    for wo in ctx.optimizers:
        state = Counter(f"{v.device}/{v.dtype}" for s in wo.optimizer.state.values() for v in s.values()
                        if isinstance(v, torch.Tensor) and v.dim() > 0)
        if state:
            lines.append(f"{wo.label} state: " + ", ".join(f"{n} on {k}" for k, n in state.items()))
    return lines


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


def _key_prefixes(text: str) -> list[str]:
    """Missing/unexpected keys from a load_state_dict error, and the prefix that explains them."""
    def keys(label: str) -> list[str]:
        m = re.search(label + r" key\(s\) in state_dict: (.*?)(?:\.\s*$|\.\s*\n)", text, re.S | re.M)
        return re.findall(r'"([^"]+)"', m.group(1)) if m else []

    missing, unexpected = keys("Missing"), keys("Unexpected")
    lines = [f"{len(missing)} missing key(s), {len(unexpected)} unexpected key(s)"]
    for have, want, where in ((unexpected, missing, "the checkpoint's keys"), (missing, unexpected, "the model's keys")):
        if have and want:
            prefix = _common_prefix(have)
            if prefix and {k[len(prefix):] for k in have} & set(want):
                lines.append(f"{where} carry the prefix {prefix!r} that the other side lacks")
    return lines


def _common_prefix(keys: list[str]) -> str:
    first = keys[0].split(".")[0] + "."
    return first if all(k.startswith(first) for k in keys) else ""
