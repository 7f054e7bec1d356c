"""needs-code-to-load: the file needs globals outside torch's weights_only allowlist, so torch.load refuses it."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.checkpoint import CheckpointInfo, Use, Verdict, show_args

from ._ckptutil import MODEL_SETUP

_TORCH_LOAD_FORMATS = ("zip", "legacy")  # plain pickles: serialization-format explains

NEEDS_CODE_TO_LOAD = Pitfall(
    code="TD202",
    name="needs-code-to-load",
    severity="warning",
    summary="The file needs globals outside torch's weights_only allowlist: torch.load's default refuses it.",
    why="""
        The file names globals outside PyTorch's `weights_only` allowlist (numpy arrays and scalars,
        `argparse.Namespace`, your own classes, `torch.nn` module classes, …), or it was pickled with protocol
        4/5 opcodes the weights-only unpickler does not implement. `torch.load(path)` (weights_only=True, the
        default since torch 2.6) then refuses it.

        Checkpoints that loaded for years fail after a torch upgrade with:

        ```text
        _pickle.UnpicklingError: Weights only load failed. ... WeightsUnpickler error: Unsupported global:
        GLOBAL argparse.Namespace was not an allowed global by default. Please use
        `torch.serialization.add_safe_globals([Namespace])` ...
        ```

        The tempting fix, `weights_only=False`, turns off the protection against code execution for every file
        the script loads. Files saved with `pickle_protocol=4` fail with "Unsupported operand 149" even when
        every global is allowed.
    """,
    fix="""
        When the pickle *calls* third-party or user code on load (a library enum rebuilt by value, a user
        class's reduce function), torchdoctor says exactly what runs, with its arguments; it never proposes
        allowlisting a callable or anything in a file that is also `unsafe-pickle`.
        For a file you trust, allow exactly the globals torchdoctor lists with
        `torch.serialization.add_safe_globals([...])` (or the `torch.serialization.safe_globals([...])` context
        manager). Better, save only tensors and plain Python values: `model.state_dict()`,
        `optimizer.state_dict()`, `vars(args)` instead of an `argparse.Namespace`, `float(x)` instead of a
        numpy scalar, and torch's default pickle protocol.
    """,
    bad=Example(
        """
            args = argparse.Namespace(lr=0.1, epochs=10)
            torch.save({"model": model.state_dict(), "args": args}, "ckpt.pt")
            # torch.load("ckpt.pt") -> Weights only load failed ... Unsupported global: GLOBAL argparse.Namespace
        """,
        setup=MODEL_SETUP + "import argparse\n",
    ),
    good=Example(
        """
            args = argparse.Namespace(lr=0.1, epochs=10)
            torch.save({"model": model.state_dict(), "args": vars(args)}, "ckpt.pt")  # a plain dict
            ckpt = torch.load("ckpt.pt")  # loads with weights_only=True
        """,
        setup=MODEL_SETUP + "import argparse\n",
    ),
)


# numpy.dtype(code) builds an instance of one of these classes, which weights_only=True must allow as well
_NUMPY_DTYPE_CLASSES = {
    "f2": "Float16DType",
    "f4": "Float32DType",
    "f8": "Float64DType",
    "f16": "LongDoubleDType",
    "i1": "Int8DType",
    "i2": "Int16DType",
    "i4": "Int32DType",
    "i8": "Int64DType",
    "u1": "UInt8DType",
    "u2": "UInt16DType",
    "u4": "UInt32DType",
    "u8": "UInt64DType",
    "b1": "BoolDType",
    "c8": "Complex64DType",
    "c16": "Complex128DType",
}


def _numpy_dtype_classes(allowed: list) -> list[str]:
    """The `numpy.dtypes.*DType` classes of the dtypes the file builds with `numpy.dtype(code)`."""
    return sorted(
        {
            f"numpy.dtypes.{_NUMPY_DTYPE_CLASSES[args[0]]}"
            for g in allowed
            if g.qualname == "numpy.dtype"
            for _, args in g.calls
            if isinstance(args, tuple) and args and args[0] in _NUMPY_DTYPE_CLASSES
        }
    )


@NEEDS_CODE_TO_LOAD.checkpoint
def needs_code_to_load(info: CheckpointInfo) -> Iterator[Finding]:
    """Globals or opcodes the weights_only unpickler refuses, and third-party code the pickle calls on load."""
    unsafe = bool(info.events) or any(g.verdict is Verdict.DANGEROUS for g in info.globals)
    called = [g for g in info.globals if g.verdict is Verdict.UNKNOWN and g.use is Use.CALLED]
    if called:
        runs = "; ".join(f"{g.qualname}({show_args(args)})" for g in called[:6] for _, args in g.calls[:1])
        yield Finding(
            f"Loading this file with `torch.load(..., weights_only=False)` or `pickle.load` calls third-party or "
            f"user code: {runs}. That is how some libraries pickle their objects (an enum rebuilt by value), and "
            f"exactly how a payload would run; {called[0].qualname}: {called[0].reason or 'not inspected'}.",
            fix=Fix(
                title="Load it only if you trust both the file and the code it calls; better, re-save plain values "
                "(str/int/float/dicts) instead of library objects."
            ),
            location=Location(file=info.path),
            key="calls",
        )
    if info.format not in _TORCH_LOAD_FORMATS:
        code = [g for g in info.globals if g.verdict is Verdict.UNKNOWN and g.use is not Use.CALLED]
        if code:  # never silent on code: pickle.load imports each of these and builds objects with it
            yield Finding(
                f"Loading this file needs code outside torch's and torchdoctor's allowlists: "
                f"{', '.join(g.qualname for g in code[:12])}{' …' if len(code) > 12 else ''}. pickle.load imports "
                f"it and builds objects with it; {code[0].qualname}: {code[0].reason or 'not inspected'}.",
                fix=Fix(title="Load it only if you trust both the file and that code; better, re-save plain values."),
                location=Location(file=info.path),
                key="code",
            )
        return
    extra = [g for g in info.globals if g.verdict in (Verdict.BENIGN, Verdict.UNKNOWN)]
    if extra:
        names = [g.qualname for g in extra]
        shown = ", ".join(names[:12]) + (f", … ({len(names) - 12} more)" if len(names) > 12 else "")
        message = (
            f"`torch.load(path)` (weights_only=True, the default since torch 2.6) fails with "
            f'"Weights only load failed … Unsupported global: GLOBAL {names[0]}": the file names '
            f"{len(names)} global(s) outside the allowlist: {shown}."
        )
        # only names the file merely constructs may be allowed; never anything it calls or anything unsafe
        safe = [g.qualname for g in extra if g.use is not Use.CALLED or g.verdict is Verdict.BENIGN]
        if unsafe:
            fix = Fix(
                title="Do not allowlist anything from this file: it is unsafe (see unsafe-pickle). Ask for a "
                "safetensors or plain state_dict copy."
            )
        elif safe:
            allowed = [g for g in extra if g.qualname in safe[:12]]
            dtype_classes = _numpy_dtype_classes(allowed)
            scripts = [g for g in allowed if g.module.startswith("__")]  # saved from a script: `__main__.Net`
            modules = sorted(
                {g.module for g in allowed if g.module and g not in scripts}
                | ({"numpy.dtypes"} if dtype_classes else set())
            )
            snippet = (
                "".join(f"import {m}\n" for m in modules)
                + "".join(
                    f"# {g.name}: the class the file was saved with, defined or imported in this script "
                    f"(it names it {g.qualname}: it was saved from a script)\n"
                    for g in scripts
                )
                + "torch.serialization.add_safe_globals(["
                + ", ".join(
                    [*(f"({g.name}, {g.qualname!r})" if g in scripts else g.qualname for g in allowed), *dtype_classes]
                )
                + "])\n"
                f"ckpt = torch.load({info.path!r})\n"
                "# Better: re-save only tensors and plain Python values (model.state_dict(), optimizer.state_dict(), "
                "int/float/str instead of numpy scalars, vars(args) instead of argparse.Namespace)."
            )
            if called:
                snippet += (
                    "\n# The file also calls " + ", ".join(g.qualname for g in called[:6]) + ": torchdoctor does "
                    "not propose allowlisting callables (any file could then call them), so re-saving is the fix."
                )
            fix = Fix(title="If you trust the file, allow exactly these globals:", code=snippet)
        else:
            fix = Fix(
                title="Re-save only tensors and plain Python values; the globals it needs are code it calls, which "
                "add_safe_globals would let any file call."
            )
        yield Finding(message, fix=fix, location=Location(file=info.path))
    if info.unsupported_opcodes:
        ops = ", ".join(sorted(info.unsupported_opcodes))
        protocol = max((scan.protocol for _, scan in info.archive.pickles), default=0)
        yield Finding(
            f"The pickle uses opcodes the weights_only unpickler does not implement ({ops}; pickle protocol "
            f'{protocol}), so `torch.load(path)` fails with "Weights only load failed … Unsupported operand" '
            "even though every global is allowed.",
            fix=Fix(title="Re-save with torch's default protocol (2): torch.save(obj, path)  # no pickle_protocol=4/5"),
            location=Location(file=info.path),
        )
