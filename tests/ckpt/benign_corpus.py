"""Build benign checkpoints the way real libraries write them (each library only if it is installed).

`python tests/ckpt/benign_corpus.py OUTDIR` writes the files and prints their names; the tests call
`build(outdir)` with whatever is installed (torch and numpy always). None of these may be `unsafe-pickle`,
and `needs-code-to-load` must fire exactly where `torch.load(weights_only=True)` refuses the file.
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import fractions
import os
import pathlib
import pickle
import sys
import types
import uuid
from collections import Counter, OrderedDict, defaultdict, deque
from typing import Callable

import numpy as np
import torch
from torch import nn


def _tiny() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))


def _torch_files(out: str) -> dict[str, str]:
    model = _tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 4)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 10)
    scaler = torch.amp.GradScaler("cpu")
    files = {
        "state_dict": model.state_dict(),
        "training": {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(),
            "scaler": scaler.state_dict(),
            "epoch": 3,
            "rng": torch.get_rng_state(),
        },
        "data_types": {
            "args": argparse.Namespace(lr=0.1, out=pathlib.PurePosixPath("runs/a")),
            "when": datetime.datetime(2024, 1, 2, 3, 4, 5),
            "delta": datetime.timedelta(days=1),
            "d": decimal.Decimal("1.5"),
            "f": fractions.Fraction(1, 3),
            "id": uuid.UUID(int=7),
            "c": Counter("aab"),
            "dd": defaultdict(list, {"a": [1]}),
            "q": deque([1, 2]),
            "s": slice(1, 5, 2),
            "r": range(3),
            "fs": frozenset({1, 2}),
            "ns": types.SimpleNamespace(a=1),
            "od": OrderedDict(a=1),
            "path": pathlib.Path("ckpt/last.pt"),
        },
        "numpy": {
            "arr": np.arange(6, dtype=np.float32).reshape(2, 3),
            "scalar": np.float64(0.5),
            "i": np.int64(3),
            "rng": np.random.get_state(),
            "gen": np.random.default_rng(0),
        },
        "quantized": {
            "q": torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8),
            "qc": torch.quantize_per_channel(
                torch.randn(2, 3), torch.tensor([0.1, 0.2]), torch.tensor([0, 0]), 0, torch.quint8
            ),
        },
        "sparse_nested_meta_f8": {
            "coo": torch.randn(3, 3).to_sparse(),
            "csr": torch.randn(3, 3).to_sparse_csr(),
            "nested": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
            "meta": torch.empty(3, 4, device="meta"),
            "f8": torch.ones(4).to(torch.float8_e4m3fn),
            "bf16": torch.ones(2, dtype=torch.bfloat16),
        },
        "whole_module": model,
        "protocol4": model.state_dict(),
    }
    out_files = {}
    for name, obj in files.items():
        path = os.path.join(out, f"{name}.pt")
        torch.save(obj, path, **({"pickle_protocol": 4} if name == "protocol4" else {}))
        out_files[name] = path
    legacy = os.path.join(out, "legacy.pt")
    torch.save(files["training"], legacy, _use_new_zipfile_serialization=False)
    out_files["legacy"] = legacy
    return out_files


def _dtensor(out: str) -> dict[str, str]:
    import torch.distributed as dist

    if not dist.is_available():
        return {}
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        path = os.path.join(out, "dtensor.pt")
        torch.save({"w": distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)])}, path)
        import torch.distributed.checkpoint as dcp

        dcp_dir = os.path.join(out, "dcp")
        dcp.save(
            {"w": torch.ones(3), "b": torch.zeros(2, 2), "step": 5, "extra": {"lr": 0.1, "names": ["a"]}},
            checkpoint_id=dcp_dir,
        )
        shards = {
            f"dcp_shard_{n}": os.path.join(dcp_dir, n) for n in sorted(os.listdir(dcp_dir)) if n.endswith(".distcp")
        }
        return {"dtensor": path, "dcp_metadata": os.path.join(dcp_dir, ".metadata"), **shards}
    finally:
        dist.destroy_process_group()


def _libraries(out: str) -> dict[str, str]:
    """Files written by transformers, timm, Lightning, accelerate, omegaconf, joblib (those installed)."""
    files: dict[str, str] = {}
    builders: list[tuple[str, Callable[[str], dict[str, str]]]] = [
        ("transformers", _transformers),
        ("timm", _timm),
        ("lightning", _lightning),
        ("accelerate", _accelerate),
        ("omegaconf", _omegaconf),
        ("joblib", _joblib),
    ]
    for module, build_one in builders:
        try:
            __import__(module)
            files.update(build_one(out))
        except Exception as exc:  # a library that is missing or broken in this environment is skipped
            print(f"skipped {module}: {type(exc).__name__}: {exc}"[:200], file=sys.stderr)
    return files


def _transformers(out: str) -> dict[str, str]:
    from transformers import BertConfig, BertModel, TrainingArguments

    model = BertModel(
        BertConfig(
            hidden_size=8,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=8,
            vocab_size=20,
            max_position_embeddings=16,
        )
    )
    model.save_pretrained(os.path.join(out, "hf"), safe_serialization=False)
    args = TrainingArguments(output_dir=os.path.join(out, "hf_run"), report_to=[])
    torch.save(args, os.path.join(out, "training_args.bin"))
    opt = torch.optim.AdamW(model.parameters())
    torch.save(opt.state_dict(), os.path.join(out, "hf_optimizer.pt"))
    torch.save(
        {
            "python": __import__("random").getstate(),
            "numpy": np.random.get_state(),
            "cpu": torch.random.get_rng_state(),
        },
        os.path.join(out, "rng_state.pth"),
    )
    return {
        "hf_weights": os.path.join(out, "hf", "pytorch_model.bin"),
        "hf_training_args": os.path.join(out, "training_args.bin"),
        "hf_optimizer": os.path.join(out, "hf_optimizer.pt"),
        "hf_rng_state": os.path.join(out, "rng_state.pth"),
    }


def _timm(out: str) -> dict[str, str]:
    import timm
    from timm.scheduler import CosineLRScheduler

    model = timm.create_model("resnet10t", num_classes=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = CosineLRScheduler(opt, t_initial=10)
    path = os.path.join(out, "timm.pth.tar")
    args = argparse.Namespace(model="resnet10t", lr=0.1, epochs=10)
    torch.save(
        {
            "epoch": 1,
            "arch": "resnet10t",
            "state_dict": model.state_dict(),
            "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(),
            "amp_scaler": torch.amp.GradScaler("cpu").state_dict(),
            "args": args,
            "version": 2,
            "metric": np.float64(0.5),
        },
        path,
    )
    return {"timm": path}


def _lightning(out: str) -> dict[str, str]:
    import lightning as L

    class Tiny(L.LightningModule):
        def __init__(self, lr: float = 0.1, hidden: int = 3) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = nn.Linear(4, 2)

        def training_step(self, batch, idx):  # type: ignore[no-untyped-def]
            return self.net(batch[0]).sum()

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=4)
    trainer = L.Trainer(
        max_epochs=1,
        default_root_dir=os.path.join(out, "pl"),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(Tiny(), data)
    path = os.path.join(out, "lightning.ckpt")
    trainer.save_checkpoint(path)
    return {"lightning": path}


def _accelerate(out: str) -> dict[str, str]:
    from accelerate import Accelerator

    acc = Accelerator(cpu=True, project_dir=os.path.join(out, "acc"))
    model, opt = acc.prepare(_tiny(), torch.optim.Adam(_tiny().parameters()))
    state_dir = os.path.join(out, "acc_state")
    acc.save_state(state_dir, safe_serialization=False)
    return {
        f"accelerate_{n}": os.path.join(state_dir, n)
        for n in sorted(os.listdir(state_dir))
        if n.endswith((".bin", ".pkl", ".pt", ".pth"))
    }


def _omegaconf(out: str) -> dict[str, str]:
    from omegaconf import OmegaConf

    path = os.path.join(out, "omegaconf.pt")
    torch.save({"cfg": OmegaConf.create({"lr": 0.1, "layers": [1, 2]}), "w": torch.ones(2)}, path)
    return {"omegaconf": path}


def _joblib(out: str) -> dict[str, str]:
    import joblib

    path = os.path.join(out, "arrays.joblib")
    joblib.dump({"x": np.arange(10.0), "y": [np.ones(3, dtype=np.int32)]}, path)
    return {"joblib": path}


def _export(out: str) -> dict[str, str]:
    """A torch.export archive (.pt2) of a small module with a buffer."""
    model = _tiny().eval()
    path = os.path.join(out, "exported.pt2")
    torch.export.save(torch.export.export(model, (torch.randn(2, 4),)), path)
    return {"pt2": path}


def _compressed(out: str) -> dict[str, str]:
    """What joblib.dump(..., compress=...) writes: a pickle stream compressed whole (zlib, gzip, bz2, xz, lzma),
    written with joblib itself when it is installed (a scikit-learn pipeline when that is too)."""
    import bz2
    import gzip
    import lzma
    import zlib

    data = pickle.dumps(
        {
            "coef": np.arange(6.0).reshape(2, 3),
            "classes": np.array([0, 1]),
            "n_iter": 7,
            "params": {"C": 1.0, "penalty": "l2"},
        },
        protocol=4,
    )
    files = {}
    for name, compress in (
        ("zlib", zlib.compress),
        ("gzip", gzip.compress),
        ("bz2", bz2.compress),
        ("xz", lzma.compress),
        ("lzma", lambda d: lzma.compress(d, format=lzma.FORMAT_ALONE)),
    ):
        files[f"compressed_{name}"] = os.path.join(out, f"model_{name}.joblib")
        with open(files[f"compressed_{name}"], "wb") as f:
            f.write(compress(data))
    try:
        import joblib  # type: ignore[import-not-found]
    except ImportError:
        return files
    obj: object = {"x": np.arange(10.0)}
    try:
        from sklearn.linear_model import LogisticRegression  # type: ignore[import-not-found]
        from sklearn.pipeline import make_pipeline  # type: ignore[import-not-found]
        from sklearn.preprocessing import StandardScaler  # type: ignore[import-not-found]

        x = np.random.default_rng(0).normal(size=(20, 3))
        obj = make_pipeline(StandardScaler(), LogisticRegression()).fit(x, (x[:, 0] > 0).astype(int))
    except ImportError:
        pass
    for level in (3, ("gzip", 3), ("bz2", 3), ("xz", 3), ("lzma", 3)):
        tag = level if isinstance(level, int) else level[0]
        files[f"joblib_{tag}"] = os.path.join(out, f"joblib_{tag}.joblib")
        joblib.dump(obj, files[f"joblib_{tag}"], compress=level)
    return files


def _library_objects(out: str) -> dict[str, str]:
    """Enums, dataclasses and plain objects of libraries installed beside torch, saved in training checkpoints
    (each library only if installed; transformers, accelerate, huggingface_hub, sympy, networkx, pygments,
    click, yaml are in the test environment). Loading calls or instantiates their code: needs-code-to-load,
    never unsafe-pickle."""
    objects: dict[str, object] = {}
    for module, build_one in (
        (
            "transformers",
            lambda: {
                "strategy": __import__("transformers.trainer_utils").trainer_utils.IntervalStrategy.STEPS,
                "scheduler": __import__("transformers.trainer_utils").trainer_utils.SchedulerType.COSINE,
                "config": __import__("transformers").BertConfig(hidden_size=8),
            },
        ),
        (
            "accelerate",
            lambda: {
                "dist": __import__("accelerate.utils").utils.DistributedType.NO,
                "precision": __import__("accelerate.utils").utils.PrecisionType.BF16,
            },
        ),
        ("sympy", lambda: {"expr": __import__("sympy").Symbol("x") * 2 + 1}),
        ("networkx", lambda: {"graph": __import__("networkx").path_graph(3)}),
        ("yaml", lambda: {"mark": __import__("yaml").Mark("f", 0, 1, 2, None, None)}),
        ("click", lambda: {"choice": __import__("click").Choice(["a", "b"])}),
        ("pygments", lambda: {"token": __import__("pygments.token").token.Keyword}),
    ):
        try:
            objects.update(build_one())
        except Exception as exc:  # a library that is missing in this environment adds nothing
            print(f"skipped {module}: {type(exc).__name__}: {exc}"[:200], file=sys.stderr)
    files = {}
    for name, obj in objects.items():
        files[f"lib_{name}"] = os.path.join(out, f"lib_{name}.pt")
        torch.save({"w": torch.ones(2), name: obj}, files[f"lib_{name}"])
    return files


def build(out: str, libraries: bool = True) -> dict[str, str]:
    """Write the corpus under `out`; name -> path."""
    os.makedirs(out, exist_ok=True)
    files = _torch_files(out)
    pkl = os.path.join(out, "plain.pkl")
    with open(pkl, "wb") as f:
        pickle.dump({"lr": 0.1, "arr": np.ones(3)}, f, protocol=5)
    files["plain_pickle_np"] = pkl
    files.update(_dtensor(out))
    files.update(_export(out))
    files.update(_compressed(out))
    files.update(_library_objects(out))
    if libraries:
        files.update(_libraries(out))
    return files


if __name__ == "__main__":
    for name, path in build(sys.argv[1]).items():
        print(name, path)
