"""nonfinite-weights: floating-point tensors hold NaN or Inf values (found by --scan-values)."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.checkpoint import CheckpointInfo, show_path

from ._ckptutil import MAX_LISTED, MODEL_SETUP

NONFINITE_WEIGHTS = Pitfall(
    code="TD208",
    name="nonfinite-weights",
    severity="error",
    summary="Floating-point tensors hold NaN or Inf values (found by --scan-values).",
    why="""
        Floating-point tensors in the file hold NaN or Inf values. Found with `--scan-values`, which streams the
        tensor bytes from the file in fixed-size chunks (bounded memory, no torch) and counts NaN/Inf for
        float16/32/64, bfloat16, complex and float8 tensors, only over the elements each tensor covers.

        A checkpoint saved after training diverged produces NaN outputs for every input, and resuming from it
        keeps training on garbage. The loss curve may have looked fine up to the save if the divergence happened
        in the last steps.
    """,
    fix="""
        Resume from an earlier checkpoint and find where the loss first became non-finite: lower the learning
        rate, clip gradients, use a loss scaler with fp16, or watch the run with `torchdoctor.watch` /
        `torch.autograd.set_detect_anomaly(True)`. Check values before saving.
    """,
    bad=Example(
        """
            optimizer = torch.optim.SGD(model.parameters(), lr=1e6)  # far too high: training diverges
            for _ in range(10):
                loss = model(torch.randn(8, 4)).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            torch.save(model.state_dict(), "last.pt")  # saved after the loss became NaN
        """,
        setup=MODEL_SETUP,
    ),
    good=Example(
        """
            state = model.state_dict()
            if all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point()):
                torch.save(state, "last.pt")
            else:
                raise RuntimeError("non-finite weights: not saving over the last good checkpoint")
        """,
        setup=MODEL_SETUP,
    ),
)


@NONFINITE_WEIGHTS.checkpoint
def nonfinite_weights(info: CheckpointInfo) -> Iterator[Finding]:
    """Tensors the value scan found holding NaN or Inf."""
    if info.values is None or not info.values.nonfinite:
        return
    bad = info.values.nonfinite
    for n in bad[:MAX_LISTED]:
        parts = [f"{n.nan:,} NaN" if n.nan else "", f"{n.inf:,} Inf" if n.inf else ""]
        yield Finding(
            f"{show_path(n.path)} holds {' and '.join(p for p in parts if p)} of its {n.numel:,} values; a model "
            "loaded from it produces NaN outputs (training had already diverged when this was saved).",
            fix=Fix(
                title="Resume from an earlier checkpoint and find where the loss first became non-finite "
                "(torch.autograd.set_detect_anomaly(True), a lower learning rate, gradient clipping, "
                "or torchdoctor.watch)."
            ),
            location=Location(file=info.path, key=show_path(n.path)),
        )
    if len(bad) > MAX_LISTED:
        yield Finding(
            f"{len(bad) - MAX_LISTED} more tensor(s) hold NaN/Inf values (see the values facts).",
            fix=Fix(title="As above."),
            location=Location(file=info.path),
        )
