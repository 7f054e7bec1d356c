"""torch-import-failure: `import torch` fails or hangs; names the likely cause."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
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
        runs, shows the exception, and names the cause that the failure's own evidence points at: a library that
        LD_PRELOAD or an LD_LIBRARY_PATH folder puts before torch's own (empty, cut short, or lacking a symbol), a
        torch in the user site ahead of the environment's, a resource limit (`ulimit -v`, open files, a container's
        memory), an errno on a named file, an editable install whose source folder is gone, a requirement of
        torch's in the wrong version, a file or folder shadowing torch, a missing CUDA library, a NumPy ABI error,
        or an import that never finishes.

        Nothing else works until `import torch` does, and the error text rarely says what to change. Typical messages:

        - `OSError: /home/me/fakelib/libgomp.so.1: file too short` (a library on `LD_LIBRARY_PATH`)
        - `ImportError: libcudnn.so.9: cannot open shared object file: No such file or directory`
        - `ImportError: .../torch/lib/libtorch_cpu.so: undefined symbol: omp_get_max_threads, version OMP_1.0`
        - `OpenBLAS error: Memory allocation still failed after 10 retries, giving up.` (under `ulimit -v`)
        - `ModuleNotFoundError: No module named 'torch'` (not installed here, or an editable install's source deleted)
        - `ImportError: cannot import name 'deprecated' from 'typing_extensions'` (a requirement too old)
        - `AttributeError: partially initialized module 'torch' has no attribute 'cuda' (most likely due to a circular
          import)`
    """,
    fix="""
        Follow the fix printed with the finding; it acts on the cause the evidence names, for example:

        ```console
        # a broken libgomp.so.1 in an LD_LIBRARY_PATH folder: take that folder off the variable
        $ export LD_LIBRARY_PATH=/usr/local/lib
        # a torch in ~/.local hiding the environment's
        $ export PYTHONNOUSERSITE=1
        # a memory limit too small for torch's libraries
        $ ulimit -S -v unlimited
        # a requirement of torch's that is too old
        $ python -m pip install "typing-extensions>=4.10.0"
        # a hanging import: see where it stops
        $ python -X importtime -c "import torch" 2>&1 | tail
        ```

        A reinstall is proposed only when the evidence points at the install itself (a damaged file in torch's
        folder, files missing, a CUDA library a CUDA build needs), and then the CPU build on a machine without an
        NVIDIA driver. For a shadowing `torch` folder or a circular import, rename the offending file or folder
        (see [module-shadowing](module-shadowing.md)) and delete the `__pycache__` next to it.
    """,
    bad=Example(
        """
            $ export LD_LIBRARY_PATH=/opt/old-gcc/lib64:/usr/local/lib
            $ python -c "import torch"
            ImportError: /venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so: undefined symbol:
            omp_get_max_threads, version OMP_1.0
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    good=Example(
        """
            $ export LD_LIBRARY_PATH=/usr/local/lib     # /opt/old-gcc/lib64 held another libgomp.so.1
            $ python -c "import torch; print(torch.__version__)"
            2.13.0+cpu
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    details={
        "env": """
            `torchdoctor env` runs `import torch` in a subprocess of the same Python interpreter, started in the working
            directory with your environment unchanged (as your scripts see it), with a time limit (`--timeout`, 60 s by
            default, counted from when the subprocess starts running). The probe reports the exception with its errno
            and file name, the module an ImportError names, its resource limits (`/proc/self/limits`), every torch
            folder on its `sys.path` and the user site, and, when it crashes or hangs, faulthandler's stack. Beside
            it, torchdoctor reads (never loads) the libraries LD_PRELOAD and LD_LIBRARY_PATH would give torch
            instead of its own (torch/lib and what torch's libraries need, by their ELF headers), torch's
            `direct_url.json` and whether its files are where pip says, and torch's own requirements.

            One cause is named, the first the evidence supports, in this order: a hang (with the stack where it
            was); a library copy from LD_PRELOAD / LD_LIBRARY_PATH (named in the error, broken while the loader
            failed or the process died of SIGBUS/SIGSEGV, or the library that should define a missing symbol);
            torch imported from the user site while the environment has its own; a `torch` found outside the
            installed package; a shadowing file the error names; a resource limit (RLIMIT_AS/DATA, NOFILE, NPROC; a
            container's memory limit for a SIGKILL); an
            errno (EACCES, ENOSPC, EROFS, EPERM) on a named file, with the variable that put it there; pip listing
            torch without its files (an editable install whose source folder is gone); an unmet requirement of
            torch's that the error names; a module the error names from a PYTHONPATH folder, the working
            directory or the user site; a runtime library older than torch needs (`version GLIBCXX_3.4.30 not
            found`), with where it comes from (a conda environment: `conda install ... libstdcxx-ng`); torch not
            installed; a circular import; a missing shared library (on a machine without an NVIDIA driver: the CPU
            build); undefined symbols; a NumPy 1.x/2.x ABI error; a damaged file inside torch's folder (named by the
            loader, or a library there that is not a whole ELF file while the loader failed or the process crashed:
            the only case answered with a plain reinstall); other shadowing files.
            When none applies the finding says "no known cause matched" and proposes no reinstall. Every pip
            command names the interpreter (`/path/to/python -m pip`). When the import succeeds this check is silent;
            a slow import is [slow-torch-import](slow-torch-import.md). Under torchrun, ranks that saw the same
            error are one finding, a hang and a failure are two.
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
    head = (
        f"`import torch` hangs: {cause.cause}."
        if probe.timed_out
        else f"`import torch` fails: {error}. Cause: {cause.cause}."
    )
    # ranks fold by key: the same error on several ranks is one finding, a hang and a failure are two
    yield Finding(
        head,
        fix=Fix(title=cause.fix),
        location=Location(file=file) if file else None,
        key="hang" if probe.timed_out else error,
    )
