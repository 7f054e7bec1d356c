"""clip-before-unscale: gradients clipped while GradScaler still holds them scaled, so the clip does nothing."""

from __future__ import annotations

from typing import Any, Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import MethodPatch, RuntimeCheck, unwrap_optimizer
from torchdoctor.sdk.source import SourceFile

_SETUP = """
import torch
from torch import nn

model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu")
loader = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(3)]
"""

CLIP_BEFORE_UNSCALE = Pitfall(
    code="TD316",
    name="clip-before-unscale",
    severity="error",
    summary="Gradients are clipped before `scaler.unscale_(optimizer)`: the clip sees gradients scaled by ~65536.",
    why="""
        Under mixed precision, `scaler.scale(loss).backward()` leaves every gradient multiplied by the loss
        scale (65536 at first). `clip_grad_norm_(params, 1.0)` on those gradients measures a norm tens of
        thousands of times too large and shrinks them to a norm of 1 *in scaled units*; `scaler.step()` then
        divides by the scale, so the update is ~65536 times smaller than intended (and the threshold means
        nothing). Training crawls or stalls, with no error.
    """,
    fix="""
        Unscale first, then clip, then step: `scaler.unscale_(optimizer)` right after `backward()` and
        before `clip_grad_norm_`/`clip_grad_value_` (`scaler.step` knows not to unscale twice).
    """,
    bad=Example(
        """
        for x, y in loader:
            optimizer.zero_grad()
            scaler.scale(nn.functional.mse_loss(model(x), y)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        for x, y in loader:
            optimizer.zero_grad()
            scaler.scale(nn.functional.mse_loss(model(x), y)).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
        """,
        setup=_SETUP,
    ),
    details={
        "runtime": """
            While a session runs, `torch.nn.utils.clip_grad_norm_` and `clip_grad_value_` (called through
            `torch.nn.utils`) note that a clip happened, and `GradScaler.step(optimizer)` reports an error
            when a clip happened since the previous scaler step and the scaler is enabled but has not
            unscaled this optimizer's gradients (`unscale_` was not called). The names imported with
            `from torch.nn.utils import clip_grad_norm_` before the session are not seen; the lint rule covers
            them. Quiet: `unscale_` before the clip, clipping without a GradScaler, a disabled scaler.
        """,
        "source": """
            In one function, a `clip_grad_norm_`/`clip_grad_value_` of torch (not accelerate's
            `accelerator.clip_grad_norm_`, which unscales itself) that runs between `<scaler>.scale(...)`
            and `<scaler>.step(...)` of a scaler, with no `<scaler>.unscale_(...)` before it in that function.
        """,
    },
    since="0.1.0",
)

_CLIPS = ("clip_grad_norm_", "clip_grad_value_")
_FIX = Fix(
    title="Unscale before clipping: add this line after `scaler.scale(loss).backward()` and before the clip "
    "(scaler.step then does not unscale again):",
    code="scaler.unscale_(optimizer)",
)


@CLIP_BEFORE_UNSCALE.runtime
class ClipBeforeUnscale(RuntimeCheck):
    """A torch clip since the last scaler step, and a GradScaler.step(optimizer) whose gradients are still scaled."""

    needs_optimizer = True

    def on_start(self) -> None:
        import torch

        self.clipped = False
        self.reported = False
        scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler is None:  # optimizers may come later (`torchdoctor run` adopts them as they step)
            return
        for name in _CLIPS:
            self.ctx.hooks.add(MethodPatch(torch.nn.utils, name, before=self._clip))
        self.ctx.hooks.add(MethodPatch(scaler, "step", before=self._scaler_step))

    def _clip(self, module: Any, args: tuple, kwargs: dict) -> None:
        self.clipped = True  # the arguments are left alone: `parameters` may be a generator

    def _scaler_step(self, cls: Any, args: tuple, kwargs: dict) -> None:
        """Runs in the user's scaler.step(): emits at most one finding, never raises."""
        clipped, self.clipped = self.clipped, False
        if not clipped or self.reported:
            return
        try:
            scaler, optimizer = args[0], args[1] if len(args) > 1 else kwargs.get("optimizer")
            inner = unwrap_optimizer(optimizer)[0]
            wo = next((wo for wo in self.ctx.optimizers if wo.optimizer is inner), None)
            if wo is None or not scaler.is_enabled():
                return
            stage = scaler._per_optimizer_states[id(optimizer)]["stage"]
            if getattr(stage, "name", "") != "READY":  # UNSCALED: unscale_ ran before the clip
                return
            self.reported = True
            self.ctx.emit(
                self,
                Finding(
                    f"Gradients were clipped before scaler.unscale_({wo.label}): the clip measured gradients still "
                    f"multiplied by the loss scale ({scaler.get_scale():g}), so it shrank them far too much and "
                    f"{wo.label}'s updates are about {scaler.get_scale():g} times smaller than intended.",
                    fix=_FIX,
                    location=Location(step=wo.steps),
                ),
            )
        except Exception as exc:  # never break the user's scaler.step()
            self.ctx.fault(self, exc)


@CLIP_BEFORE_UNSCALE.source
def clip_before_unscale(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or "clip_grad_" not in src.text or ".scale(" not in src.text:
        return
    for scope in src.index.scopes:
        attrs = scope.call_attrs
        if "scale" not in attrs or "step" not in attrs:
            continue
        scalers = {c.receiver for c in scope.calls_named("scale") if c.receiver} & {
            c.receiver for c in scope.calls_named("step") if c.receiver and c.node.args
        }
        for scaler in sorted(s for s in scalers if s is not None):
            scaled = [c.pos for c in scope.calls_named("scale") if c.receiver == scaler]
            step_calls = [c for c in scope.calls_named("step") if c.receiver == scaler]
            steps = [c.pos for c in step_calls]
            unscales = [c.pos for c in scope.calls_named("unscale_") if c.receiver == scaler]
            for clip in scope.calls_named(*_CLIPS):
                if not (clip.receiver is None or "torch" in clip.qualname):
                    continue
                if (
                    any(p < clip.pos for p in scaled)
                    and any(p > clip.pos for p in steps)
                    and not any(p < clip.pos for p in unscales)
                ):
                    yield Finding(
                        f"`{src.snippet(clip.node)}` clips the gradients between `{scaler}.scale(...)` and "
                        f"`{scaler}.step(...)` with no `{scaler}.unscale_(...)` before it: it clips gradients "
                        "multiplied by the loss scale, so the updates become far smaller than intended.",
                        fix=_source_fix(src, scaler, clip, step_calls),
                        location=src.location(clip.node),
                    )


def _source_fix(src: SourceFile, scaler: str, clip: Any, steps: list[Any]) -> Fix:
    """Unscale with the optimizer the scaler steps, on a line of its own just before the clip."""
    after = [c for c in steps if c.pos > clip.pos]
    optimizer = src.snippet(after[0].node.args[0]) if after and after[0].node.args else "optimizer"
    return Fix(
        title=f"Unscale first: insert this line just before line {clip.node.lineno}, at its indentation:",
        code=f"{scaler}.unscale_({optimizer})",
    )
