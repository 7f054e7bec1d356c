"""train-mode-in-eval: validation under no_grad that forgot model.eval(): Dropout and BatchNorm act as in training."""

from __future__ import annotations

import weakref
from typing import Any, Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import ForwardEvent, RuntimeCheck

_MODEL_AND_DATA = """
import torch
from torch import nn

model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.1), nn.Linear(8, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.CrossEntropyLoss()
train_loader = [(torch.randn(8, 4), torch.randint(0, 3, (8,))) for _ in range(3)]
val_loader = train_loader[:2]
"""

TRAIN_MODE_IN_EVAL = Pitfall(
    code="TD307",
    name="train-mode-in-eval",
    severity="warning",
    summary="Forwards under no_grad/inference_mode while the model (with Dropout/BatchNorm) is in train().",
    why="""
        Validation forgot `model.eval()`: `no_grad` only turns off autograd. In `train()` mode Dropout keeps
        dropping activations, so validation scores are noisy and too low, and BatchNorm normalises with the
        statistics of each validation batch and overwrites its running mean and variance with validation data,
        which changes the trained model.
    """,
    fix="Call `model.eval()` before validating and `model.train()` before training again.",
    bad=Example(
        """
        for x, y in train_loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()

        val_loss = 0.0
        with torch.no_grad():
            for x, y in val_loader:
                val_loss += criterion(model(x), y).item()
        """,
        setup=_MODEL_AND_DATA,
    ),
    good=Example(
        """
        for x, y in train_loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()

        val_loss = 0.0
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                val_loss += criterion(model(x), y).item()
        model.train()
        """,
        setup=_MODEL_AND_DATA,
    ),
    details={
        "runtime": """
            `watch` warns once per model when it sees two gradient-free forwards in a row in `train()` mode of a
            model that has BatchNorm or Dropout layers and that also ran training forwards (train mode, gradients
            on) in the session. Models that never train with gradients, such as a momentum (MoCo/BYOL) key
            encoder run in train mode under `no_grad` on purpose, are quiet, and so are models without
            mode-dependent layers. So are BatchNorm recalibration (`torch.optim.swa_utils.update_bn` sets every
            BatchNorm's momentum to None for a cumulative average) and MC-dropout sampling (the same input
            tensor fed again, in train mode on purpose, or dropout layers switched back on after `eval()`).
        """,
    },
)


class _ModeStreak:
    def __init__(self) -> None:
        self.trained = False  # the model ran a train()-mode forward with gradients in this session
        self.streak = 0  # consecutive train()-mode forwards without gradients
        self.last_input: Optional["weakref.ReferenceType[Any]"] = None  # of the last such forward
        self.last_version: Optional[int] = None  # that input's version counter (bumped by in-place writes)
        self.sampling = False  # the streak fed one input twice: MC-dropout sampling


def _recalibrating_batchnorm(model: Any) -> bool:
    """BatchNorm statistics being recomputed on purpose: every BatchNorm has momentum None (a cumulative
    average), as `torch.optim.swa_utils.update_bn` sets it."""
    from torchdoctor.sdk.runtime import MODE_DEPENDENT

    norms = [m for m in model.modules() if isinstance(m, MODE_DEPENDENT[0])]
    return bool(norms) and all(m.momentum is None for m in norms)


@TRAIN_MODE_IN_EVAL.runtime
class TrainModeInEval(RuntimeCheck):
    """Validation that forgot model.eval(): gradient-free forwards in train() mode of a model that trains."""

    min_forwards = 2

    def on_start(self) -> None:
        self.state: dict[str, _ModeStreak] = {}
        self.reported: set[str] = set()

    def on_forward(self, event: ForwardEvent) -> Optional[Iterator[Finding]]:
        st = self.state.get(event.model.label)
        if st is None:
            st = self.state[event.model.label] = _ModeStreak()
        if event.grad_enabled or not event.training:
            st.streak, st.sampling = 0, False
            st.trained = st.trained or (event.grad_enabled and event.training)
            return None
        return self._gradient_free(event, st)

    def _gradient_free(self, event: ForwardEvent, st: _ModeStreak) -> Iterator[Finding]:
        fed = event.input_ref() if event.input_ref is not None else None
        version = getattr(fed, "_version", None)
        st.sampling = st.sampling or (
            st.streak > 0
            and fed is not None
            and st.last_input is not None
            and st.last_input() is fed
            and version == st.last_version
        )
        st.streak, st.last_input, st.last_version = st.streak + 1, event.input_ref, version
        del fed
        label = event.model.label
        if st.streak < self.min_forwards or not st.trained or label in self.reported or st.sampling:
            return
        layers = event.model.mode_dependent_layers()
        if not layers or _recalibrating_batchnorm(event.model.inner):
            return
        self.reported.add(label)
        mode = "torch.inference_mode()" if event.inference_mode else "torch.no_grad()"
        yield Finding(
            f"{label} ran {st.streak} forwards under {mode} while in train() mode: this looks like validation "
            f"without model.eval(), so its {', '.join(layers)} layers behave as in training (Dropout drops, "
            "BatchNorm normalises with batch statistics and overwrites its running statistics with validation data).",
            fix=Fix(
                title="Switch modes around validation:",
                code="model.eval()\nwith torch.no_grad():\n    ...\nmodel.train()",
            ),
            location=Location(module=label, step=self.ctx.step),
        )
