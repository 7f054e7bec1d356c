"""Runtime checks on train()/eval() and grad mode: validation that builds graphs, or runs in train mode."""
from __future__ import annotations

from typing import Any, Iterator

from torchdoctor.findings import Finding, Location, Severity
from torchdoctor.registry import Scope, check
from torchdoctor.units import byte_size
from torchdoctor.watch.contract import ForwardEvent, RuntimeCheck, StepEvent


class _EvalGraphs:
    """Per model: eval-mode forwards with a graph, and what became of their graphs."""

    def __init__(self) -> None:
        self.live = 0          # graphs alive and not (yet) back-propagated
        self.dropped = 0       # graphs freed without backward
        self.backprop = 0      # graphs that backward went through
        self.forwards = 0


@check(code="TD306", name="eval-without-no-grad", scope=Scope.RUNTIME, severity="warning",
       summary="Forwards in eval() mode with gradients enabled that are never back-propagated.")
class EvalWithoutNoGrad(RuntimeCheck):
    """A sentinel on each eval-mode forward's graph tells whether backward ever reached it."""

    min_forwards = 2

    def on_start(self) -> None:
        self.state: dict[str, _EvalGraphs] = {}
        self.reported: set[str] = set()
        self.per_forward: dict[str, int] = {}  # bytes saved for backward by one eval forward, per model

    def on_forward(self, event: ForwardEvent) -> Iterator[Finding]:
        if event.training or not event.grad_enabled:
            return
        from torchdoctor.watch.context import first_graph_tensor

        out = first_graph_tensor(event.output)
        if out is None:
            return  # no graph: frozen model and inputs without grad
        st = self.state.setdefault(event.model.label, _EvalGraphs())

        def backward() -> None:
            st.backprop += 1
            st.live -= 1

        def freed(reached: bool) -> None:
            if not reached:
                st.live -= 1
                st.dropped += 1

        if self.ctx.graphs.track(out, on_backward=backward, on_free=freed):
            st.live += 1
            st.forwards += 1
            if event.model.label not in self.per_forward:  # measured once: eval graphs differ from training's
                from torchdoctor.watch.graphs import footprint

                owned = [*event.model.inner.parameters(), *event.model.inner.buffers()]
                self.per_forward[event.model.label] = footprint(out, owned)[1]
        yield from self._verdict(event.model)

    def on_step_pre(self, event: StepEvent) -> Iterator[Finding]:
        for wm in self.ctx.models:
            yield from self._verdict(wm)

    def on_stop(self) -> Iterator[Finding]:
        for wm in self.ctx.models:
            yield from self._verdict(wm)

    def _verdict(self, wm: Any) -> Iterator[Finding]:
        st = self.state.get(wm.label)
        if st is None or wm.label in self.reported:
            return
        if st.dropped + st.live >= self.min_forwards and st.backprop == 0:
            self.reported.add(wm.label)
            per = byte_size(self.per_forward.get(wm.label, 0))
            yield Finding(
                f"{wm.label} ran {st.forwards} forward(s) in eval() mode with gradients enabled and none was "
                f"back-propagated: each one records the autograd graph and keeps its activations (about {per} "
                f"per forward) alive for as long as its output is; {st.live} such graph(s) are alive now. "
                "eval() changes Dropout/BatchNorm, it does not turn off autograd.",
                fix="Validate without autograd:\n"
                    "model.eval()\n"
                    "with torch.inference_mode():  # or torch.no_grad()\n"
                    "    for x, y in val_loader:\n"
                    "        val_loss += loss_fn(model(x), y).item()\n"
                    "model.train()",
                location=Location(module=wm.label, step=self.ctx.step))
        elif st.backprop and self.ctx.optimizers and (wm.label + ":teacher") not in self.reported:
            held = self.ctx.optimizer_param_ids()
            if not any(id(p) in held for _, p in wm.named_parameters()):
                self.reported.add(wm.label + ":teacher")
                yield Finding(
                    f"backward() goes through {wm.label}, which runs in eval() mode and has no parameter in any "
                    "optimizer given to watch(): if it is a frozen teacher or reference model, autograd computes "
                    "gradients for it that nobody uses.",
                    fix="Freeze it, and run it without autograd if nothing needs gradients through it:\n"
                        "teacher.requires_grad_(False)\n"
                        "with torch.no_grad():\n"
                        "    target = teacher(x)",
                    location=Location(module=wm.label, step=self.ctx.step),
                    severity=Severity.INFO)


class _ModeStreak:
    def __init__(self) -> None:
        self.trained = False   # the model ran a train()-mode forward with gradients in this session
        self.streak = 0        # consecutive train()-mode forwards without gradients


@check(code="TD307", name="train-mode-in-eval", scope=Scope.RUNTIME, severity="warning",
       summary="Forwards under no_grad/inference_mode while the model (with Dropout/BatchNorm) is in train().")
class TrainModeInEval(RuntimeCheck):
    """Validation that forgot model.eval(): gradient-free forwards in train() mode of a model that trains."""

    min_forwards = 2

    def on_start(self) -> None:
        self.state: dict[str, _ModeStreak] = {}
        self.reported: set[str] = set()

    def on_forward(self, event: ForwardEvent) -> Iterator[Finding]:
        st = self.state.setdefault(event.model.label, _ModeStreak())
        if event.grad_enabled or not event.training:
            st.streak = 0
            st.trained = st.trained or (event.grad_enabled and event.training)
            return
        st.streak += 1
        label = event.model.label
        if st.streak < self.min_forwards or not st.trained or label in self.reported:
            return
        layers = event.model.mode_dependent_layers()
        if not layers:
            return
        self.reported.add(label)
        mode = "torch.inference_mode()" if event.inference_mode else "torch.no_grad()"
        yield Finding(
            f"{label} ran {st.streak} forwards under {mode} while in train() mode: this looks like validation "
            f"without model.eval(), so its {', '.join(layers)} layers behave as in training (Dropout drops, "
            "BatchNorm normalises with batch statistics and overwrites its running statistics with validation data).",
            fix="Switch modes around validation:\n"
                "model.eval()\n"
                "with torch.no_grad():\n"
                "    ...\n"
                "model.train()",
            location=Location(module=label, step=self.ctx.step))
