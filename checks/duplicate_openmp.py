"""duplicate-openmp: more than one OpenMP runtime is loaded ('OMP: Error #15')."""

from __future__ import annotations

import os
import re
from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Pitfall
from torchdoctor.sdk.env import EnvFacts

from ._envutil import MACHINE_STATE

DUPLICATE_OPENMP = Pitfall(
    code="TD113",
    name="duplicate-openmp",
    severity="warning",
    summary="More than one OpenMP runtime is loaded ('OMP: Error #15').",
    why="""
        After `import torch` and `import numpy`, more than one OpenMP runtime is loaded into the process: Intel's
        `libiomp5` next to GNU `libgomp` or LLVM `libomp`, or two copies of `libiomp5`. This happens when torch and
        NumPy (or MKL) come from different sources, typically pip and conda mixed in one environment.

        Two copies of Intel's runtime abort the process as soon as both initialise:

        ```text
        OMP: Error #15: Initializing libiomp5.so, but found libiomp5.so already initialized.
        OMP: Hint This means that multiple copies of the OpenMP runtime have been linked into the program. That is
        dangerous, since it can degrade performance or cause incorrect results.
        ```

        On Windows and macOS the same error names `libiomp5md.dll` or `libomp.dylib`. Two runtimes of different
        families do not crash, but each keeps its own thread pool, so CPU work oversubscribes the cores. Setting
        `KMP_DUPLICATE_LIB_OK=TRUE` only silences the abort; Intel documents it as unsafe and able to produce wrong
        results.
    """,
    fix="""
        Install torch and NumPy from one source so one OpenMP runtime is used: all pip, or all conda from one channel.

        ```console
        $ python -c "import torch, numpy; print(open('/proc/self/maps').read())" \\
            | grep -oE '/\\S*lib(gomp|iomp5|omp)\\S*' | sort -u        # which runtimes are loaded
        $ conda install nomkl numpy          # conda: an OpenBLAS numpy without libiomp5
        $ pip uninstall -y numpy && pip install numpy    # or: pip for both
        ```
    """,
    bad=Example(
        """
            import os

            os.environ["KMP_DUPLICATE_LIB_OK"] = "TRUE"  # hides "OMP: Error #15"; may crash or give wrong results
            import numpy  # conda's MKL numpy: libiomp5
            import torch  # another libiomp5, or libgomp from the pip wheel
        """,
        unseen={"env": MACHINE_STATE},
    ),
    good=Example(
        """
            $ python -m venv .venv && . .venv/bin/activate
            $ pip install torch numpy
            $ python -c "import torch, numpy; print(open('/proc/self/maps').read())" \\
                | grep -oE '/\\S*lib(gomp|iomp5|omp)\\S*' | sort -u
            /work/.venv/lib/python3.11/site-packages/torch/lib/libgomp-a34b3233.so.1
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    details={
        "env": """
            The torch probe imports torch and NumPy and lists the OpenMP libraries mapped into its process
            (`/proc/self/maps`, so Linux only), grouped into Intel `libiomp5`, GNU `libgomp` and LLVM `libomp`. A
            warning
            fires when two families are present or two different `libiomp5` files are; it also says when
            `KMP_DUPLICATE_LIB_OK` is set. Two `libgomp` files (torch's bundled copy and the system one) are not
            reported.
            Runtimes loaded only by other libraries your script imports (OpenCV, scikit-learn, faiss, ...) are not seen.
        """,
    },
)


_RUNTIMES = ("libgomp", "libiomp5", "libomp")


@DUPLICATE_OPENMP.env
def duplicate_openmp(facts: EnvFacts) -> Iterator[Finding]:
    """Several OpenMP runtime families, or two libiomp5 copies, loaded by torch and numpy."""
    libs = facts.torch.openmp_runtimes
    families: dict[str, list[str]] = {}
    for path in libs:
        base = os.path.basename(path)
        family = (
            "Intel libiomp5"
            if base.startswith("libiomp5")
            else "GNU libgomp"
            if base.startswith("libgomp")
            else "LLVM libomp"
        )
        families.setdefault(family, []).append(path)
    if len(families) < 2 and len(families.get("Intel libiomp5", [])) < 2:
        return
    ok_var = (
        " KMP_DUPLICATE_LIB_OK is set, which only hides the crash." if "KMP_DUPLICATE_LIB_OK" in facts.env_vars else ""
    )
    preload = facts.env_vars.get("LD_PRELOAD", "")
    preloaded = [p for p in re.split(r"[\s:]+", preload) if p and os.path.basename(p).startswith(_RUNTIMES)]
    if preloaded:
        cause = f" LD_PRELOAD={preload} forces {', '.join(preloaded)} into every process."
        fix = (
            f"Take {', '.join(preloaded)} out of LD_PRELOAD (`unset LD_PRELOAD`, or set it without that library, "
            "in your shell profile or job script) so that torch uses the OpenMP runtime it ships with."
        )
    else:
        cause = ""
        fix = (
            "Install torch and numpy from one source (all pip, or all conda from one channel; conda: "
            "`conda install nomkl` for numpy) so that one OpenMP runtime is used."
        )
    yield Finding(
        f"`import torch` + `import numpy` load several OpenMP runtimes: {'; '.join(libs)}. Two runtimes "
        "oversubscribe threads, and two libiomp5 copies abort with 'OMP: Error #15: Initializing "
        f"libiomp5.so, but found libiomp5.so already initialized'.{cause}{ok_var}",
        fix=Fix(title=fix),
    )
