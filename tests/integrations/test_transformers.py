"""torchdoctor.integrations.transformers on real Trainer runs, and accelerate's prepare() outputs passed to
watch directly (CPU, a few steps each)."""

from __future__ import annotations

import torch
from frameworks import need, problems, quiet
from torch import nn

transformers = need("transformers")
accelerate = need("accelerate")
import torchdoctor  # noqa: E402
from torchdoctor.integrations.transformers import TorchDoctorCallback  # noqa: E402


class Regressor(nn.Module):
    """A model as the Trainer calls it: keyword inputs, a dict with the loss."""

    def __init__(self, nan_at_call: int = 0) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 1))
        self.calls, self.nan_at_call = 0, nan_at_call

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        self.calls += 1
        if self.calls == self.nan_at_call:
            x = x / 0 * 0  # planted: a NaN batch
        return {"loss": nn.functional.mse_loss(self.body(x).squeeze(-1), labels)}


def _rows(n: int = 64) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(8, generator=g), "labels": torch.randn((), generator=g)} for _ in range(n)]


def _train(model: Regressor, tmp_path, **watch_kwargs) -> torchdoctor.watch:
    callback = TorchDoctorCallback(**quiet(**watch_kwargs))
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        num_train_epochs=2,
        learning_rate=1e-2,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_rows(), callbacks=[callback])
    trainer.train()
    return callback.session


def test_a_correct_trainer_run_is_quiet_and_watches_the_accelerated_optimizer(tmp_path):
    s = _train(Regressor(), tmp_path)
    assert problems(s) == [] and not s.active and s.hook_errors == []
    [opt] = s.facts["optimizers"]
    assert (opt["label"], opt["steps"], opt["wrappers"]) == ("AdamW", 16, ["AcceleratedOptimizer"])


def test_a_nan_batch_under_the_trainer_is_found_at_its_step(tmp_path):
    s = _train(Regressor(nan_at_call=6), tmp_path)
    first = s.findings[0]
    assert (first.name, first.location.step) == ("nonfinite-values", 5)
    assert "all 6 parameters have non-finite gradients" in first.message


def _accelerate_loop(zero: bool):
    acc = accelerate.Accelerator(cpu=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(48, 8), torch.randn(48, 1)), batch_size=8
    )
    model, opt, data = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05), data)
    with torchdoctor.watch(model, opt, **quiet()) as s:
        for x, y in data:
            if zero:
                opt.zero_grad()
            acc.backward(nn.functional.mse_loss(model(x), y))
            opt.step()
    return s


def test_accelerate_prepare_outputs_are_watched_directly():
    assert problems(_accelerate_loop(zero=True)) == []
    s = _accelerate_loop(zero=False)
    assert [(f.name, f.location.step) for f in s.findings] == [("missing-zero-grad", 1)]
    assert s.facts["optimizers"][0]["wrappers"] == ["AcceleratedOptimizer"]
