"""The false-positive corpus: correct training code that NO lint rule may report (every rule runs on every
entry). Rule tests ask only their own rule; this is the one test where a new rule meets everyone's clean code,
and a failure names the rule that fired, where, and on which entry.
"""

import textwrap

import pytest
from conftest import SOURCE_CHECKS, lint_snippet

CORPUS = {
    "canonical-epoch": """
        import torch
        import torch.nn as nn

        def train_one_epoch(model, loader, optimizer, criterion, device):
            model.train()
            running = 0.0
            for step, (images, labels) in enumerate(loader):
                images, labels = images.to(device), labels.to(device)
                optimizer.zero_grad(set_to_none=True)
                loss = criterion(model(images), labels)
                loss.backward()
                optimizer.step()
                running += loss.item()
            return running / len(loader)

        @torch.no_grad()
        def evaluate(model, loader, device):
            model.eval()
            correct = 0
            for images, labels in loader:
                correct += (model(images.to(device)).argmax(1) == labels.to(device)).sum().item()
            model.train()
            return correct / len(loader.dataset)
    """,
    "dcgan-model-zero-grad": """
        for real in dataloader:
            netD.zero_grad()
            errD = criterion(netD(real), label)
            errD.backward()
            optimizerD.step()
            netG.zero_grad()
            errG = criterion(netD(netG(noise)), label)
            errG.backward()
            optimizerG.step()
    """,
    "gradient-accumulation": """
        import torch

        def train(model, loader, optimizer, scheduler, accum_steps=4):
            optimizer.zero_grad()
            for i, (x, y) in enumerate(loader):
                loss = model(x, labels=y).loss / accum_steps
                loss.backward()
                if (i + 1) % accum_steps == 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()
    """,
    "amp-with-scaler": """
        import torch

        def train(model, loader, optimizer, criterion):
            scaler = torch.amp.GradScaler("cuda")
            for x, y in loader:
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = criterion(model(x), y)
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
    """,
    "lbfgs-closure": """
        import torch

        optimizer = torch.optim.LBFGS(model.parameters())
        for x, y in loader:
            def closure():
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                return loss
            optimizer.step(closure)
    """,
    "ddp-with-set-epoch": """
        import os
        import torch
        import torch.distributed as dist
        from torch.utils.data import DataLoader
        from torch.utils.data.distributed import DistributedSampler

        def main(dataset, model, epochs):
            local_rank = int(os.environ["LOCAL_RANK"])
            dist.init_process_group("nccl")
            torch.cuda.set_device(local_rank)
            model = torch.nn.parallel.DistributedDataParallel(model.cuda(local_rank), device_ids=[local_rank])
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            sampler = DistributedSampler(dataset)
            loader = DataLoader(dataset, batch_size=32, sampler=sampler, shuffle=False)
            for epoch in range(epochs):
                sampler.set_epoch(epoch)
                for x, y in loader:
                    x, y = x.cuda(local_rank), y.cuda(local_rank)
                    optimizer.zero_grad()
                    torch.nn.functional.mse_loss(model(x), y).backward()
                    optimizer.step()
    """,
    "finetune-and-resume": """
        import torch
        import torch.nn as nn
        import torchvision

        def build(num_classes, device, path=None):
            model = torchvision.models.resnet18(weights="DEFAULT")
            model.fc = nn.Linear(model.fc.in_features, num_classes)
            model = model.to(device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            if path is not None:
                ckpt = torch.load(path, map_location=device, weights_only=True)
                model.load_state_dict(ckpt["model"])
                optimizer.load_state_dict(ckpt["optimizer"])
            return model, optimizer
    """,
    "distillation-frozen-teacher": """
        def distill(student, teacher, loader, optimizer):
            teacher.eval()
            for p in teacher.parameters():
                p.requires_grad = False
            for x, y in loader:
                optimizer.zero_grad()
                soft = teacher(x)
                loss = kd_loss(student(x), soft, y)
                loss.backward()
                optimizer.step()
        distill(student, teacher, loader, optimizer)
    """,
    "phases-with-set-grad-enabled": """
        import torch

        def run(model, loaders, optimizer, criterion):
            for phase in ["train", "val"]:
                if phase == "train":
                    model.train()
                else:
                    model.eval()
                for x, y in loaders[phase]:
                    optimizer.zero_grad()
                    with torch.set_grad_enabled(phase == "train"):
                        loss = criterion(model(x), y)
                        if phase == "train":
                            loss.backward()
                            optimizer.step()
        run(model, loaders, optimizer, criterion)
    """,
    "deterministic-setup": """
        import argparse
        import os
        import random

        import numpy as np
        import torch

        parser = argparse.ArgumentParser()
        parser.add_argument("--local-rank", "--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
        args = parser.parse_args()
        random.seed(0)
        np.random.seed(0)
        torch.manual_seed(0)
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True)
    """,
    "lightning-module": """
        import lightning as L
        import torch

        class LitModel(L.LightningModule):
            def __init__(self, net):
                super().__init__()
                self.net = net

            def training_step(self, batch, batch_idx):
                x, y = batch
                loss = torch.nn.functional.cross_entropy(self.net(x), y)
                self.log("train_loss", loss)
                return loss

            def validation_step(self, batch, batch_idx):
                x, y = batch
                self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x), y))

            def configure_optimizers(self):
                return torch.optim.Adam(self.parameters(), lr=1e-3)
    """,
    "inference-script-with-inference-mode": """
        import torch

        model = torch.jit.load("model.pt")
        model.eval()
        with torch.inference_mode():
            out = model(torch.randn(1, 3, 224, 224))
        print(out.argmax())
    """,
    "helper-in-another-file": {
        "train.py": """
            from engine import train_step

            def fit(model, loader, optimizer):
                for batch in loader:
                    train_step(model, batch, optimizer)
        """,
        "engine.py": """
            def train_step(model, batch, optimizer):
                optimizer.zero_grad()
                loss = model(*batch).mean()
                loss.backward()
                optimizer.step()
                return loss.item()
        """,
    },
    "dataparallel-prefix-strip": """
        import torch

        def load(model, path):
            state = torch.load(path, map_location="cpu", weights_only=True)
            torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state, "module.")
            model.load_state_dict(state)
    """,
}


@pytest.mark.parametrize("entry", sorted(CORPUS))
def test_no_rule_fires_on_correct_code(tmp_path, entry):
    files = CORPUS[entry] if isinstance(CORPUS[entry], dict) else {"train.py": CORPUS[entry]}
    files = {name: textwrap.dedent(text) for name, text in files.items()}
    fired = []
    for name in files:
        others = {other: text for other, text in files.items() if other != name}
        fired += lint_snippet(tmp_path, files[name], SOURCE_CHECKS, name, others)
    assert not fired, "false positive on corpus entry {!r}: {}".format(
        entry, "; ".join(f"{f.name} ({f.code}) at {f.location.file}:{f.location.line}: {f.message}" for f in fired)
    )
