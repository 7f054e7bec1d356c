"""torch-import-failure: `import torch` fails or hangs; names the likely cause."""
from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Location, Pitfall
from torchdoctor.sdk.env import EnvFacts

from ._envutil import MACHINE_STATE
from ._importcause import diagnose

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


@TORCH_IMPORT_FAILURE.env
def torch_import_failure(facts: EnvFacts) -> Iterator[Finding]:
    """When the probe's `import torch` failed or hung: the error and the one cause its evidence names, with
    that cause's fix (see `_importcause.diagnose`)."""
    probe = facts.torch
    if probe.ok:
        return
    cause = diagnose(facts)
    error = f"{probe.error_type}: {probe.error}" if probe.error_type else (probe.error or "unknown error")
    file = cause.file or probe.torch_file
    head = f"`import torch` hangs: {cause.cause}." if probe.timed_out else \
        f"`import torch` fails: {error}. Cause: {cause.cause}."
    # ranks fold by key: the same error on several ranks is one finding, a hang and a failure are two
    yield Finding(head, fix=cause.fix, location=Location(file=file) if file else None,
                  key="hang" if probe.timed_out else error)
