"""torch-import-failure: `import torch` fails or hangs; names the likely cause."""
from __future__ import annotations

import os
import re
from typing import Iterator, Optional

from torchdoctor.sdk import Example, Finding, Location, Pitfall
from torchdoctor.sdk.env import EnvFacts, PathEntry

from ._envutil import MACHINE_STATE, best_wheel_cuda, has_nvidia, major_minor, pip, pip_install, rename_fix, torch_pin

TORCH_IMPORT_FAILURE = Pitfall(
    code="TD101",
    name="torch-import-failure",
    severity="error",
    summary="`import torch` fails or hangs; names the likely cause.",
    why="""
        `import torch` itself fails or hangs. torchdoctor imports torch in a separate process, so the doctor still
        runs, shows the exception, and names the most likely cause: torch not installed for this Python, a folder or
        file shadowing torch, a missing CUDA/cuDNN shared library, undefined symbols from mixed installs, a NumPy
        ABI error, or an import that never finishes.

        Nothing else works until `import torch` does, and the error text rarely says what to change. Typical messages:

        - `ModuleNotFoundError: No module named 'torch'` (installed into another interpreter or venv)
        - `ImportError: libcudnn.so.9: cannot open shared object file: No such file or directory`
        - `ImportError: .../torch/lib/libtorch_cuda.so: undefined symbol: ...` (pip and conda torch mixed, or
          `LD_LIBRARY_PATH` pointing at another CUDA)
        - `AttributeError: partially initialized module 'torch' has no attribute 'cuda' (most likely due to a circular
          import)`
        - `ImportError: No module named torch._C` (a `torch/` source folder in the working directory)
        - `A module that was compiled using NumPy 1.x cannot be run in NumPy 2.x`
    """,
    fix="""
        Follow the fix printed with the finding; it depends on the cause:

        ```console
        # not installed for this interpreter
        $ python -m pip install torch --index-url https://download.pytorch.org/whl/cu126
        # mixed installs or missing libraries: uninstall until pip says torch is not installed, then reinstall
        $ pip uninstall -y torch && pip uninstall -y torch
        $ conda remove pytorch                 # conda environments only
        $ unset LD_LIBRARY_PATH
        $ pip install --force-reinstall torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124
        # a hanging import: see where it stops
        $ python -X importtime -c "import torch" 2>&1 | tail
        ```

        For a shadowing `torch` folder or a circular import, rename the offending file or folder (see
        [module-shadowing](module-shadowing.md)) and delete the `__pycache__` next to it.
    """,
    bad=Example(
        """
            $ pip install torch --index-url https://download.pytorch.org/whl/cu124
            $ export LD_LIBRARY_PATH=/usr/local/cuda-11.8/lib64:$LD_LIBRARY_PATH
            $ python -c "import torch"
            ImportError: /venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so: undefined symbol: ...
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    good=Example(
        """
            $ unset LD_LIBRARY_PATH
            $ pip install --force-reinstall torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124
            $ python -c "import torch; print(torch.__version__, torch.version.cuda)"
            2.5.1+cu124 12.4
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    details={
        "env": """
            `torchdoctor env` runs `import torch` in a subprocess of the same Python interpreter, started in the working
            directory with your environment unchanged (as your scripts see it), with a time limit (`--timeout`, 60 s by
            default). If the import raises, exits without reporting, or runs past the limit, this check fires as an
            error with one cause and that cause's fix, picked in order: a hang (with the stack where it was, dumped by
            `faulthandler` just before the probe is stopped, and how long it ran); a `torch` found outside the
            installed torch package; a shadowing file the error or the hanging stack names (the fix renames it, never
            a reinstall); torch not installed at all; a circular import; `cannot open shared object file`;
            `undefined symbol`; a NumPy 1.x/2.x ABI error; other shadowing files; otherwise it quotes the exception
            and suggests a clean reinstall of the same version. Every pip command names the interpreter
            (`/path/to/python -m pip`). When the import succeeds this check is silent; a slow import is
            [slow-torch-import](slow-torch-import.md).
        """,
    },
)


def _culprit(facts: EnvFacts, text: str) -> Optional[PathEntry]:
    """The shadowing file that the error (or the hanging stack) points at, if one does."""
    for entry in facts.shadowing:
        if entry.path in text or f"'{entry.name}'" in text or f"module {entry.name} " in text:
            return entry
    return None


def _hang(facts: EnvFacts) -> "tuple[str, str]":
    probe = facts.torch
    ran = f" after {probe.seconds:.0f} s" if probe.seconds else ""
    where = ""
    if probe.hang_stack:
        where = f"; it was at {probe.hang_stack[0]}"
        if len(probe.hang_stack) > 1:
            where += " (called from " + ", ".join(probe.hang_stack[1:4]) + ")"
    culprit = _culprit(facts, " ".join(probe.hang_stack))
    if culprit:
        return f"it hung in {culprit.path}, which shadows `{culprit.name}`{where}{ran}", rename_fix(culprit)
    return (f"it was stopped{ran} without finishing{where}",
            "Look at the code at that line; to time every module: `python -X importtime -c \"import torch\" 2>&1 | "
            "tail`. Usual culprits: torch on a slow network filesystem, a sitecustomize/usercustomize doing I/O, "
            "a stale lock in ~/.cache.")


@TORCH_IMPORT_FAILURE.env
def torch_import_failure(facts: EnvFacts) -> Iterator[Finding]:
    """When the probe's `import torch` failed or hung: the error and its one most likely cause, with that
    cause's fix (a shadowing file is renamed, never answered with a reinstall)."""
    probe = facts.torch
    if probe.ok:
        return
    error = f"{probe.error_type}: {probe.error}" if probe.error_type else (probe.error or "unknown error")
    installed = facts.torch_dist_location
    text = " ".join([error, *probe.traceback_tail, *probe.stderr_tail])
    reinstall = pip_install(facts, major_minor(facts.torch_cuda))
    where = Location(file=probe.torch_file) if probe.torch_file else None
    culprit = _culprit(facts, text)
    if probe.timed_out:
        cause, fix = _hang(facts)
        error = ""
    elif probe.torch_file and installed and not probe.torch_file.startswith(installed.rstrip("/") + "/"):
        found = os.path.dirname(probe.torch_file) if probe.torch_file.endswith("__init__.py") else probe.torch_file
        cause = f"Python found {found} first, not the installed torch in {installed}"
        torch_entry = next((e for e in facts.shadowing if e.name == "torch"), None)
        fix = rename_fix(torch_entry) if torch_entry else \
            f"Rename or move {found} (or take its folder off PYTHONPATH), and delete the __pycache__ beside it."
    elif culprit is not None:
        what = "torch" if culprit.name == "torch" else f"the module `{culprit.name}` that torch imports"
        cause = f"{culprit.path} shadows {what}"
        fix = rename_fix(culprit)
        where = Location(file=culprit.path)
    elif facts.torch_dist_version is None and ("No module named 'torch'" in text or probe.torch_file):
        cause = f"torch is not installed for {facts.system.python_executable or 'this Python'}"
        cuda = best_wheel_cuda(major_minor(facts.nvidia.driver_cuda)) if has_nvidia(facts) else None
        fix = "Install it into this interpreter: " + pip_install(facts, cuda, force=False)
        if probe.torch_file:
            cause = f"torch is not installed, and Python found {probe.torch_file} instead"
            fix = f"Move {probe.torch_file} out of the way, then: " + fix
    elif "partially initialized module" in text or "circular import" in text:
        cause = "a circular import: a file named like a module torch imports (e.g. random.py, copy.py) shadows it"
        fix = ("Rename the file in your script's folder or on PYTHONPATH named like the module in the error, "
               "and delete the __pycache__ beside it.")
    elif m := re.search(r"(lib[\w.+-]+\.so[\w.]*): cannot open shared object file", text):
        cause = f"the shared library {m.group(1)} that this torch build links against is missing"
        fix = ("Reinstall torch so pip brings its CUDA libraries (nvidia-* packages) again, and unset "
               f"LD_LIBRARY_PATH entries that point at other CUDA installs: {reinstall}")
    elif "undefined symbol" in text:
        cause = "undefined symbols: parts of two different torch/CUDA installs are mixed (pip over conda, LD_LIBRARY_PATH, a stale copy)"
        fix = (f"Run `{pip(facts)} uninstall torch` until it says it is not installed (and `conda remove pytorch` "
               f"in conda envs), unset LD_LIBRARY_PATH, then: {reinstall}")
    elif "numpy" in text.lower() and ("multiarray" in text or "NumPy 1.x" in text or "_ARRAY_API" in text):
        cause = "a NumPy ABI mismatch: a package compiled against NumPy 1.x meets NumPy 2.x"
        fix = f"{pip(facts)} install \"numpy<2\" {torch_pin(facts)} (or upgrade the packages compiled against NumPy 1.x)"
    elif facts.shadowing:
        names = ", ".join(e.path for e in facts.shadowing)
        cause = f"most likely {names}, shadowing modules that torch imports (see module-shadowing)"
        fix = rename_fix(facts.shadowing[0])
    else:
        cause = "no known cause matched; the error is the exception `import torch` raised"
        fix = f"Reinstall torch cleanly: {reinstall}"
    head = f"`import torch` fails: {error}. Cause: {cause}." if error else f"`import torch` hangs: {cause}."
    yield Finding(head, fix=fix, location=where)
