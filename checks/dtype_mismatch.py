"""dtype-mismatch: the program died because an operation got tensors of two floating dtypes; which ones."""

from __future__ import annotations

from typing import Any, Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import CrashEvent, RuntimeCheck

_SETUP = """
import numpy as np
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
features = np.random.rand(16, 8)  # numpy's default: float64
labels = torch.randint(0, 3, (16,))
"""

DTYPE_MISMATCH = Pitfall(
    code="TD335",
    name="dtype-mismatch",
    severity="error",
    summary="The program died because an operation got floating tensors of two dtypes (float64 input into a "
    "float32 model): which layer and which input.",
    why="""
        "mat1 and mat2 must have the same dtype, but got Double and Float" names two dtypes and no tensor.
        The usual cause is data from numpy or pandas (float64 by default) fed to a float32 model with
        `torch.from_numpy` or `torch.tensor`, which keep the dtype; also a half-precision model fed float32
        input outside `torch.autocast`, or a tensor built inside `forward` without `dtype=`.
    """,
    fix="""
        Convert the data once, where it is loaded (`torch.from_numpy(a).float()`, or
        `x.to(next(model.parameters()).dtype)`), or run mixed precision under `torch.autocast` instead of
        casting the model by hand.
    """,
    bad=Example(
        """
        x = torch.from_numpy(features)  # float64
        loss = nn.functional.cross_entropy(model(x), labels)
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        x = torch.from_numpy(features)  # float64
        x = x.to(torch.float32)
        loss = nn.functional.cross_entropy(model(x), labels)
        """,
        setup=_SETUP,
    ),
    details={
        "runtime": """
            When the watched code (or the program, under `torchdoctor run`) ends with an error that speaks of
            dtypes or scalar types, the check reads the failing frame of the traceback: the innermost module
            that was running, the dtypes of its parameters and of the floating tensors it was handed. It fires
            only when those hold two floating dtypes, and names the odd input. Quiet for other errors.
        """,
    },
)

_WORDS = ("dtype", "scalar type", "Double and Float", "Float and Double", "Half", "BFloat16")


@DTYPE_MISMATCH.runtime
class DtypeMismatch(RuntimeCheck):
    """At a crash about dtypes: the failing layer's parameter dtypes and its inputs'."""

    def on_crash(self, event: CrashEvent) -> Iterator[Finding]:
        from torchdoctor.sdk.runtime import evidence

        exc = event.exception
        if not isinstance(exc, (RuntimeError, TypeError)) or not any(w in str(exc) for w in _WORDS):
            return
        frame = next((f for f in reversed(evidence.frames(exc)) if _floats(f.f_locals)), None)
        if frame is None:
            return
        held = _floats(frame.f_locals)
        owner = frame.f_locals.get("self")
        params = (
            {n: str(p.dtype).replace("torch.", "") for n, p in owner.named_parameters(recurse=False)}
            if hasattr(owner, "named_parameters")
            else {}
        )
        dtypes = set(held.values()) | set(params.values())
        if len(dtypes) < 2:
            return
        yield self._finding(owner, params, held, evidence)

    def _finding(self, owner: Any, params: dict[str, str], held: dict[str, str], evidence: Any) -> Finding:
        name = evidence.module_path(self.ctx, owner) if params else None
        where = (f"{type(owner).__name__} `{name}`" if name else type(owner).__name__) if params else "the failing call"
        home = next(iter(params.values()), None)
        odd = [(n, d) for n, d in held.items() if home is not None and d != home]
        parts = []
        if params:
            parts.append(f"{where} holds {home} parameters ({', '.join(list(params)[:3])})")
        parts.append("it was handed " + ", ".join(f"`{n}` as {d}" for n, d in list(held.items())[:6]))
        text = (
            f"An operation got floating tensors of different dtypes at step {self.ctx.step}: " + "; ".join(parts) + "."
        )
        if odd and home is not None:
            fix = Fix(
                title=f"Convert `{odd[0][0]}` to {home} where the data is made (numpy arrays are float64):",
                code=f"x = x.to(torch.{home})",
            )
        else:
            fix = Fix(
                title="Convert the data to the model's dtype, or run under autocast:",
                code="x = x.to(next(model.parameters()).dtype)",
            )
        return Finding(text, fix=fix, location=Location(module=name))


def _floats(local: dict[str, Any]) -> dict[str, str]:
    """Floating tensors among a frame's locals (and the module's own parameters when `self` is one)."""
    import torch

    found = {
        n: str(v.dtype).replace("torch.", "")
        for n, v in list(local.items())
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() > 0
    }
    return found
