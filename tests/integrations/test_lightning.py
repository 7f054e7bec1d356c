"""torchdoctor.integrations.lightning on real Lightning fits (CPU, a few steps each)."""

from __future__ import annotations

import torch
from frameworks import need, problems, quiet
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

L = need("lightning")
from torchdoctor.integrations.lightning import TorchDoctorCallback  # noqa: E402


def _data(n: int = 64, nan_from: int | None = None) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)
    if nan_from is not None:
        x[nan_from:] = float("nan")
    return DataLoader(TensorDataset(x, y), batch_size=8)


class Classifier(L.LightningModule):
    """As in Lightning's docs: training_step calls the submodules, never self(x)."""

    def __init__(self, keep_losses: bool = False) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU())
        self.head = nn.Linear(16, 3)
        self.keep_losses = keep_losses
        self.losses: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.head(self.encoder(x)), y)
        if self.keep_losses:
            self.losses.append(loss)  # planted: every step's graph stays alive
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.head(self.encoder(x)), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class ManualNoZeroGrad(Classifier):
    """Manual optimization that forgets optimizer.zero_grad()."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt = self.optimizers()
        self.manual_backward(nn.functional.cross_entropy(self.head(self.encoder(x)), y))
        opt.step()


class RunningSum(Classifier):
    """Keeps a running total of the loss tensor itself: every step's graph stays chained to it."""

    def __init__(self) -> None:
        super().__init__()
        self.running = 0.0

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.head(self.encoder(x)), y)
        self.running = self.running + loss  # planted
        return loss


def _fit(module, loader: DataLoader, epochs: int = 2, validate: bool = True, **watch_kwargs) -> TorchDoctorCallback:
    callback = TorchDoctorCallback(**quiet(**watch_kwargs))
    trainer = L.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    trainer.fit(module, loader, _data(16) if validate else None)
    return callback


def test_a_correct_fit_is_quiet_and_sees_the_real_forwards():
    callback = _fit(Classifier(), _data())
    s = callback.session
    assert problems(s) == [] and not s.active
    assert s.facts["optimizers"][0]["steps"] == 16
    assert s.facts["models"][0]["forward_seen_through"] == "Linear"


def test_losses_kept_in_training_step_are_a_graph_leak():
    s = _fit(Classifier(keep_losses=True), _data(), epochs=3).session
    assert "graph-retention-leak" in problems(s)


def test_a_running_loss_total_is_found_without_a_validation_loop():
    """No sanity-check validation runs the submodules before the first step: the forward of the first step
    runs inside Lightning's closure, and the module is still seen through its head."""
    s = _fit(RunningSum(), _data(), epochs=3, validate=False).session
    assert s.facts["models"][0]["forward_seen_through"] == "Linear"
    [leak] = [f for f in s.findings if f.name == "graph-retention-leak"]
    assert leak.location.step <= 16


def test_manual_optimization_without_zero_grad_is_found_at_step_1():
    s = _fit(ManualNoZeroGrad(), _data()).session
    [f] = [f for f in s.findings if f.name == "missing-zero-grad"]
    assert f.location.step == 1 and f.location.param


def test_nan_batches_are_found_at_the_step_they_start():
    s = _fit(Classifier(), _data(nan_from=24)).session  # batch 3 of epoch 0 onwards
    first = s.findings[0]
    assert (first.name, first.location.step) == ("nonfinite-values", 3)
    assert any("the input batch" in f.message for f in s.findings)
