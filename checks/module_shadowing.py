"""module-shadowing: a file or folder named like torch, numpy or a standard module hides the real one."""

from __future__ import annotations

import os
from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.env import THIRD_PARTY, EnvFacts

from ._envutil import MACHINE_STATE, rename_fix
from ._importcause import shadow_named_by_import_failure

MODULE_SHADOWING = Pitfall(
    code="TD108",
    name="module-shadowing",
    severity="error",
    summary="A file or folder named like torch, numpy or a standard module hides the real one.",
    why="""
        A file or package in your project folder (or on `PYTHONPATH`) has the same name as torch, NumPy, another
        installed package, or a standard-library module that torch imports: `torch.py`, `numpy.py`, `random.py`,
        `copy.py`, `inspect.py`, `dis.py`, `select.py`, `pdb.py`, ... Python finds your file first and imports it
        instead of the real module.

        Python searches the script's folder and `PYTHONPATH` before the standard library and site-packages, so
        naming an experiment `torch.py` or a helper `random.py` breaks `import torch` in confusing ways, far from
        the real cause:

        ```text
        AttributeError: partially initialized module 'torch' has no attribute 'rand'
        (most likely due to a circular import)
        AttributeError: module 'torch' has no attribute 'Tensor'
        ModuleNotFoundError: No module named 'torch._C'
        AttributeError: module 'numpy' has no attribute 'ndarray'
        ```

        Renaming the file is not always enough: a stale `__pycache__/torch.cpython-311.pyc` can keep the problem alive.
    """,
    fix="""
        Rename the file or folder and delete the `__pycache__` beside it; if it was found through `PYTHONPATH`, take
        that folder off `PYTHONPATH` instead.

        ```console
        $ mv random.py my_random.py
        $ rm -rf __pycache__
        $ grep -rl "import random" --include=*.py .   # update your own imports of the renamed module
        ```
    """,
    bad=Example(
        """
            $ ls
            torch.py  train.py
            $ python train.py
            AttributeError: partially initialized module 'torch' has no attribute 'rand'
            (most likely due to a circular import)
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    good=Example(
        """
            $ mv torch.py torch_experiments.py && rm -rf __pycache__
            $ python train.py
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    details={
        "env": """
            It looks in the working directory it is run from and in every `PYTHONPATH` entry, skipping the
            standard-library
            and site-packages folders, for a `NAME.py` file or a `NAME/__init__.py` package, where NAME is torch, or an
            installed torchvision, torchaudio, numpy, triton, PIL, scipy, yaml or tqdm, or one of about 90 standard
            modules torch and NumPy import (plus `pdb`, used by `breakpoint()`). Only the first folder in search order
            is
            reported for each name, as only that one wins the import. Each hit is an error naming the file and the
            folder
            that made Python search it. Not reported: an editable install of the package itself (e.g. a torch source
            checkout installed with `pip install -e .`), folders without `__init__.py` (a `torch/` folder of checkpoints
            does not shadow anything), and modules Python loads before it reads the search path (`os`, `io`, `abc`,
            ...).
            Python searches the folder of the *script* you run, so run `torchdoctor env` from that folder. When
            `import torch` fails because of one of these files, [torch-import-failure](torch-import-failure.md)
            names it as its cause (with the same fix) and this check reports only the others.
        """,
    },
)


@MODULE_SHADOWING.env
def module_shadowing(facts: EnvFacts) -> Iterator[Finding]:
    """Each shadowing file or package the env probe found first on the search path, except the one that
    torch-import-failure names as the cause of a failed `import torch` (one cause, one finding)."""
    named = shadow_named_by_import_failure(facts)
    for entry in facts.shadowing:
        if entry.path == named:
            continue
        what = (
            "the installed package" if entry.name in THIRD_PARTY else "the standard-library module that torch imports"
        )
        kind = "folder" if os.path.basename(entry.path) == entry.name else "file"
        symptom = {
            "torch": "'ImportError: No module named torch._C' or "
            "\"AttributeError: partially initialized module 'torch' has no attribute ...\"",
            "numpy": "\"AttributeError: module 'numpy' has no attribute ...\" and 'Failed to initialize NumPy'",
        }.get(entry.name, f"\"AttributeError: module '{entry.name}' has no attribute ...\" deep inside `import torch`")
        yield Finding(
            f"The {kind} {entry.path} shadows {what} `{entry.name}`: Python searches {entry.origin_dir} "
            f"({entry.via}) before site-packages, so `import {entry.name}` loads it instead, which shows up "
            f"as {symptom}.",
            fix=Fix(title=rename_fix(entry)),
            location=Location(file=entry.path),
        )
