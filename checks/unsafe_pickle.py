"""unsafe-pickle: the pickle names or calls code that runs commands, evaluates code or touches files."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.checkpoint import CheckpointInfo, Use, Verdict, dangerous_reason, show_args

from ._ckptutil import MODEL_SETUP

UNSAFE_PICKLE = Pitfall(
    code="TD201",
    name="unsafe-pickle",
    severity="error",
    summary=(
        "The pickle calls or names code outside the allowlist that runs commands, evaluates code or writes files."
    ),
    why="""
        The checkpoint's pickle calls or names code that runs commands, evaluates code, imports modules or
        touches files when the file is loaded. torchdoctor decides by an exact allowlist, never by a module
        prefix: a global is safe only if its `(module, name)` pair is in torch's own `weights_only` allowlist or
        a short measured list of data types (`argparse.Namespace`, `pathlib` paths, `datetime`, numpy's array
        and scalar reconstructors, DTensor, ...). Unsafe are: a name with an attribute path (`pathlib` +
        `os.system`, `enum` + `bltns.exec`: the name part reaches any object), a standard-library, torch or
        numpy callable outside the allowlist that the pickle *calls* (REDUCE, INST, OBJ, or passed to an
        allowlisted rebuild function that calls it: `imaplib.IMAP4_stream('id')`, `logging.FileHandler(path)`),
        known code-running names (`os.system`, `builtins.eval`/`exec`/`getattr`, `torch.load`, ...), a BUILD
        that sets a dunder such as `__setstate__`, opcode tricks that run code on imported objects (a call of a
        value the pickle computed, `BUILD`/`SETITEM`/`APPEND` on an imported object, extension codes), and
        containers that read differently in different readers (two zip central directories, a file that is
        both safetensors and a pickle, TorchScript code that loads or maps files). torchdoctor interprets every
        pickle a loader would read (stacked pickles, protocol 0, `.npy` object arrays, pickles nested as bytes)
        opcode by opcode into inert placeholders: it never imports or calls anything the file names.

        `torch.load(path, weights_only=False)` and `pickle.load` execute whatever the pickle asks for. A model
        downloaded from the internet can run a shell command the moment it is loaded, and scanners with a
        denylist are bypassed regularly (CVE-2025-10155/10156/10157, picklescan and modelscan advisories). Since
        torch 2.6 `torch.load` defaults to `weights_only=True`, but many scripts still pass
        `weights_only=False` to silence "Weights only load failed".
    """,
    fix="""
        Do not load the file. torchdoctor's finding says exactly what would run (for example
        `posix.system('curl … | sh')`). Ask the publisher for a safetensors file or a plain state_dict. If the
        file is yours and you know why it contains that call, re-save only tensors and plain values.
    """,
    bad=Example(
        """
            class Payload:  # what a hostile "model.pt" carries next to real weights
                def __reduce__(self):
                    return (os.system, ("echo pwned",))  # unpickling calls os.system("echo pwned")

            torch.save({"state_dict": model.state_dict(), "config": Payload()}, "model.pt")
            # torch.load("model.pt", weights_only=False) or pickle.load would now run `echo pwned`
        """,
        setup=MODEL_SETUP + "import os\n",
    ),
    good=Example(
        """
            torch.save(model.state_dict(), "model.pt")  # tensors and plain containers only
            state_dict = torch.load("model.pt")  # weights_only=True, the default: refuses anything that runs code
            model.load_state_dict(state_dict)
        """,
        setup=MODEL_SETUP,
    ),
)


@UNSAFE_PICKLE.checkpoint
def unsafe_pickle(info: CheckpointInfo) -> Iterator[Finding]:
    """Dangerous globals the pickles name or call, and opcode tricks that run code on imported objects."""
    for g in info.globals:
        if g.verdict is not Verdict.DANGEROUS:
            continue
        where = ", ".join(g.pickles)
        shown = f"`{g.module}` attribute `{g.name}`" if "." in g.name else f"`{g.qualname}`"
        runs = "; ".join(
            dict.fromkeys(
                f"{g.qualname}({show_args(args)})" + (f" {how}" if how.startswith("via") else "")
                for how, args in g.calls
            )
        )
        if g.use is Use.CALLED:
            what = f"calls `{runs}`"
        elif g.use is Use.NEW:
            what = f"instantiates it (`{runs}`)"
        else:
            what = "imports it (the payload may call it through another object)"
        yield Finding(
            f"{where} names {shown} and {what}: {g.reason or dangerous_reason(g.module, g.name, g.use)}. Loading this "
            f"file with "
            "`torch.load(..., weights_only=False)` or `pickle.load` executes that; torchdoctor only read it.",
            fix=Fix(
                title="Do not load this file. If you trust its source anyway, know that loading runs exactly: "
                + (runs if g.calls else f"an import of {g.qualname}")
                + ". Ask for a safetensors or plain state_dict copy instead."
            ),
            location=Location(file=info.path, key=where),
            key=g.qualname,
        )
    for where, event in info.events:
        yield Finding(
            f"{where}, byte {event.pos}: {event.what}. A data-only checkpoint never does this; it is how "
            "pickle payloads hide the code they run from scanners.",
            fix=Fix(title="Do not load this file with torch.load(weights_only=False) or pickle.load."),
            location=Location(file=info.path, key=where),
            key=f"byte {event.pos}",
        )
