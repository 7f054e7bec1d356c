"""`torchdoctor run` on unmodified Lightning and transformers scripts: no callback, models found, quiet."""

from __future__ import annotations

import sys
import textwrap

import pytest
from frameworks import need

from torchdoctor.findings import Severity
from torchdoctor.run.doctor import run_script
from torchdoctor.run.script import Target


@pytest.fixture
def run_program(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(tmp_path)

    def run(source: str):
        path = tmp_path / "train.py"
        path.write_text(textwrap.dedent(source))
        return run_script(Target(path=str(path)), on_finding=lambda f: None)

    return run


def _problems(result) -> list[str]:
    return sorted({f.name for f in result.report.findings if (f.severity or Severity.INFO) >= Severity.WARNING})


LIGHTNING = """
    import torch, lightning as L
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    class Task(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.enc = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
            self.head = nn.Linear(16, 3)
        def training_step(self, batch, i):
            x, y = batch
            return nn.functional.cross_entropy(self.head(self.enc(x)), y)
        def configure_optimizers(self):
            return torch.optim.Adam({params}, lr=1e-3)

    data = DataLoader(TensorDataset(torch.randn(48, 8), torch.randint(0, 3, (48,))), batch_size=4)
    L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, accelerator="cpu").fit(Task(), data)
"""


def test_a_lightning_script_is_watched_through_its_module_without_a_callback(run_program):
    need("lightning")
    quiet = run_program(LIGHTNING.format(params="self.parameters()"))
    assert quiet.exit_status == 0 and _problems(quiet) == []
    assert [m["label"] for m in quiet.report.facts["models"]] == ["Task"]
    assert quiet.report.facts["optimizers"] == [{"label": "Adam", "steps": 12}]
    planted = run_program(LIGHTNING.format(params="self.head.parameters()"))  # the encoder never trains
    assert _problems(planted) == ["param-not-in-optimizer"]


def test_a_transformers_trainer_script_is_watched_without_a_callback(run_program):
    need("transformers")
    result = run_program("""
        import torch
        from torch.utils.data import Dataset
        from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

        class Data(Dataset):
            def __len__(self):
                return 16
            def __getitem__(self, i):
                g = torch.Generator().manual_seed(i)
                return {"input_ids": torch.randint(0, 100, (8,), generator=g), "labels": torch.tensor(i % 2)}

        config = BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=32, num_labels=2)
        args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, num_train_epochs=2, report_to=[],
                                 save_strategy="no", logging_strategy="no", use_cpu=True, disable_tqdm=True)
        Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=Data()).train()
    """)
    assert result.exit_status == 0 and _problems(result) == []
    assert [m["label"] for m in result.report.facts["models"]] == ["BertForSequenceClassification"]
    assert result.report.facts["optimizers"] == [{"label": "AdamW", "steps": 4}]
