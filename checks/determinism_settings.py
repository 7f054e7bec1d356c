"""determinism-settings: environment settings that make GPU runs non-reproducible."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Pitfall, Severity
from torchdoctor.sdk.env import EnvFacts

from ._envutil import MACHINE_STATE, has_nvidia

_CUBLAS_OK = (":4096:8", ":16:8")

DETERMINISM_SETTINGS = Pitfall(
    code="TD116",
    name="determinism-settings",
    severity="info",
    summary="Settings that make GPU runs non-reproducible (CUBLAS_WORKSPACE_CONFIG and friends).",
    why="""
        Environment settings that make GPU runs non-reproducible, or that break
        `torch.use_deterministic_algorithms(True)`: chiefly `CUBLAS_WORKSPACE_CONFIG`, which must be exactly `:4096:8`
        or `:16:8` for cuBLAS to give the same result every run.

        With CUDA ≥ 10.2, cuBLAS guarantees identical results from run to run only when its workspace is fixed by
        this variable (the differences appear when several CUDA streams share workspaces). So with deterministic
        algorithms switched on, torch refuses the first cuBLAS matrix multiply:

        ```text
        RuntimeError: Deterministic behavior was enabled with either torch.use_deterministic_algorithms(True) or
        at::Context::setDeterministicAlgorithms(true), but this operation is not deterministic because it uses CuBLAS
        and you have CUDA >= 10.2. To enable deterministic behavior in this case, you must set an environment variable
        before running your PyTorch application: CUBLAS_WORKSPACE_CONFIG=:4096:8 or CUBLAS_WORKSPACE_CONFIG=:16:8.
        ```

        Without deterministic algorithms nothing raises; losses can simply differ from run to run with the same seed.
    """,
    fix="""
        Set the variable before the first matrix multiply (best: before Python starts), then seed and switch torch to
        deterministic kernels:

        ```console
        $ export CUBLAS_WORKSPACE_CONFIG=:4096:8
        $ python train.py
        ```
    """,
    bad=Example(
        """
            $ export CUBLAS_WORKSPACE_CONFIG=4096:8     # missing the leading colon
            $ python -c "import torch; torch.use_deterministic_algorithms(True)
            > a = torch.ones(4, 4, device='cuda'); a @ a"
            RuntimeError: Deterministic behavior was enabled with either torch.use_deterministic_algorithms(True) ...
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    good=Example(
        """
            import os
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before any CUDA work

            import random
            import numpy as np
            import torch

            seed = 0
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)
            torch.backends.cudnn.benchmark = False
            torch.use_deterministic_algorithms(True)
        """,
        unseen={"env": MACHINE_STATE},
    ),
    details={
        "env": """
            It reads the environment `torchdoctor env` runs in. A **warning** when `CUBLAS_WORKSPACE_CONFIG` is set to
            anything other than exactly `:4096:8` or `:16:8` (torch accepts only these two). An **info** when it is
            unset
            but `PYTHONHASHSEED` is pinned (a sign you want reproducible runs) on a machine with an NVIDIA GPU or driver
            and
            a CUDA build of torch. An unset variable is otherwise not reported: most runs do not need bitwise
            reproducibility. Settings inside your code (`cudnn.benchmark`, `use_deterministic_algorithms`, seeds,
            DataLoader worker seeding) are checked by [nondeterministic-settings](nondeterministic-settings.md).
        """,
    },
)


@DETERMINISM_SETTINGS.env
def determinism_settings(facts: EnvFacts) -> Iterator[Finding]:
    """A CUBLAS_WORKSPACE_CONFIG cuBLAS rejects, or none while the run pins PYTHONHASHSEED."""
    value = facts.env_vars.get("CUBLAS_WORKSPACE_CONFIG")
    if value is not None and value not in _CUBLAS_OK:
        yield Finding(
            f"CUBLAS_WORKSPACE_CONFIG={value!r} is not one of {' or '.join(_CUBLAS_OK)}: with "
            "torch.use_deterministic_algorithms(True) every cuBLAS call raises 'Deterministic behavior was "
            "enabled ... you must set an environment variable ... CUBLAS_WORKSPACE_CONFIG=:4096:8'.",
            fix=Fix(title="export CUBLAS_WORKSPACE_CONFIG=:4096:8 (before the first matrix multiply)"),
            severity=Severity.WARNING,
        )
    elif value is None and "PYTHONHASHSEED" in facts.env_vars and has_nvidia(facts) and facts.torch_cuda:
        yield Finding(
            "PYTHONHASHSEED is pinned, so you want reproducible runs, but CUBLAS_WORKSPACE_CONFIG is unset: "
            "cuBLAS results can differ run to run, and torch.use_deterministic_algorithms(True) raises on "
            "the first matrix multiply.",
            fix=Fix(
                title="export CUBLAS_WORKSPACE_CONFIG=:4096:8; then in Python: torch.manual_seed(s); "
                "torch.backends.cudnn.benchmark = False; torch.use_deterministic_algorithms(True)"
            ),
        )
