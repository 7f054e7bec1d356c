"""train-mode-not-restored: training steps run with the model still in eval() after validation."""
from __future__ import annotations

from typing import Any, Iterator

from torchdoctor.sdk import Example, Finding, Location, Pitfall
from torchdoctor.sdk.runtime import ForwardEvent, RuntimeCheck, StepEvent

_SETUP = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.CrossEntropyLoss()
loader = [(torch.randn(16, 8), torch.randint(0, 3, (16,))) for _ in range(3)]
val_loader = loader[:1]
"""

TRAIN_MODE_NOT_RESTORED = Pitfall(
    code="TD314",
    name="train-mode-not-restored",
    severity="warning",
    summary="Training steps run while the model is still in eval() after validation: Dropout off, BatchNorm frozen.",
    why="""
        `model.eval()` switches every Dropout and BatchNorm layer to inference behaviour, and it stays that
        way until `model.train()` is called. When validation ends an epoch with `model.eval()` and the next
        epoch starts without `model.train()`, every later step trains a different network: Dropout no
        longer regularises, BatchNorm normalises with its running statistics and stops updating them. Nothing
        fails; the model just overfits or converges to something worse, and only from the second epoch on.
    """,
    fix="""
        Put the model back in training mode where the training loop starts (or right after validation):
        `model.train()` at the top of every epoch.
    """,
    bad=Example(
        """
        for epoch in range(2):
            for x, y in loader:
                optimizer.zero_grad()
                criterion(model(x), y).backward()
                optimizer.step()
            model.eval()
            with torch.no_grad():
                val_loss = sum(criterion(model(x), y).item() for x, y in val_loader)
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        for epoch in range(2):
            model.train()
            for x, y in loader:
                optimizer.zero_grad()
                criterion(model(x), y).backward()
                optimizer.step()
            model.eval()
            with torch.no_grad():
                val_loss = sum(criterion(model(x), y).item() for x, y in val_loader)
        """,
        setup=_SETUP,
    ),
    details={
        "runtime": """
            `watch` remembers, per model, whether the last forward with gradients enabled ran in `train()` or
            `eval()` mode. At each `optimizer.step()` that updates the model's parameters, it reports when
            that forward ran in `eval()` mode although earlier steps trained in `train()` mode, and the model
            has Dropout or BatchNorm layers in `eval()` mode. Quiet: BatchNorm layers frozen on purpose with
            `bn.eval()` while the model itself is in `train()` mode; models with neither Dropout nor
            BatchNorm; a frozen teacher in `eval()` whose parameters no optimizer updates; runs that train
            in `eval()` mode from the first step (a deliberate choice this check cannot tell from a mistake).
        """,
    },
)


_EFFECTS = {"Dropout": "Dropout drops nothing",
            "Norm": "BatchNorm normalises with its frozen running statistics and stops updating them"}


class _Mode:
    """Per model: the mode of its last forward with gradients, and whether it ever trained in train()."""

    def __init__(self) -> None:
        self.last_eval = False
        self.trained = False


@TRAIN_MODE_NOT_RESTORED.runtime
class TrainModeNotRestored(RuntimeCheck):
    """At each step: was the forward that produced this step's gradients run in eval() mode after train()?"""

    def on_start(self) -> None:
        self.modes: dict[str, _Mode] = {}

    def on_forward(self, event: ForwardEvent) -> None:
        if not event.grad_enabled:
            return  # validation under no_grad/inference_mode is what eval() is for
        mode = self.modes.setdefault(event.model.label, _Mode())
        mode.last_eval = not event.training

    def on_step_post(self, event: StepEvent) -> None:
        for mode in self.modes.values():
            mode.trained = mode.trained or not mode.last_eval

    def on_step_pre(self, event: StepEvent) -> Iterator[Finding]:
        stepped = {id(p) for p in event.optimizer.params()}
        for wm in self.ctx.models:
            mode = self.modes.get(wm.label)
            if mode is None or not mode.last_eval or not mode.trained:
                continue
            if not any(id(p) in stepped for _, p in wm.named_parameters()):
                continue  # a frozen teacher or reference model: eval() is right for it
            layers = _layers_in_eval(wm.inner)
            if not layers:
                continue
            effects = [text for kind, text in _EFFECTS.items() if any(kind in layer for layer in layers)]
            yield Finding(
                f"{event.optimizer.label}.step() applied gradients from a forward of {wm.label} in eval() mode, "
                f"although earlier steps trained it in train() mode: its {', '.join(layers)} layers run as in "
                f"inference ({'; '.join(effects)}). model.train() was probably not called again after validation.",
                fix="Switch back to training mode at the start of every epoch:\n"
                    "for epoch in range(epochs):\n"
                    "    model.train()\n"
                    "    for x, y in loader:\n"
                    "        ...\n"
                    "    model.eval()\n"
                    "    with torch.no_grad():\n"
                    "        validate(model)",
                location=Location(module=wm.label, step=event.step))


def _layers_in_eval(model: Any) -> list[str]:
    """Type names of the Dropout/BatchNorm layers in eval() mode (the ones eval() changes)."""
    from torch import nn

    kinds = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd)
    return sorted({type(m).__name__ for m in model.modules() if isinstance(m, kinds) and not m.training})
