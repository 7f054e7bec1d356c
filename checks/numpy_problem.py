"""numpy-problem: NumPy missing, or a NumPy 1.x/2.x ABI mismatch with compiled packages."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Pitfall
from torchdoctor.sdk.env import EnvFacts

from ._envutil import MACHINE_STATE, pip, torch_pin
from ._importcause import absorbed_by_import_failure

NUMPY_PROBLEM = Pitfall(
    code="TD107",
    name="numpy-problem",
    severity="warning",
    summary="NumPy missing, or a NumPy 1.x/2.x ABI mismatch with compiled packages.",
    why="""
        NumPy is missing, or torch (or another compiled package) cannot use the installed NumPy because it was
        built against NumPy 1.x and NumPy 2.x is installed. torch still imports, so the failure shows up later, at
        the first `tensor.numpy()`, `torch.from_numpy()` or DataLoader batch of arrays.

        torch does not require NumPy, so a fresh environment can lack it, and NumPy 2.0 changed the binary interface,
        so packages compiled against NumPy 1.x (torch before 2.3, older OpenCV, SciPy, pandas, ...) break when pip
        upgrades NumPy. The messages:

        ```text
        UserWarning: Failed to initialize NumPy: No module named 'numpy'
        RuntimeError: Numpy is not available
        A module that was compiled using NumPy 1.x cannot be run in NumPy 2.0.0 as it may crash. To support both 1.x
        and 2.x versions of NumPy, modules must be compiled with NumPy 2.0.
        UserWarning: Failed to initialize NumPy: _ARRAY_API not found
        ```
    """,
    fix="""
        ```console
        $ pip install numpy                 # missing
        $ pip install "numpy<2"             # something installed was compiled against NumPy 1.x
        $ pip install -U opencv-python      # or upgrade the package named in the finding to a NumPy-2 build
        ```

        torch 2.3 and later are built against NumPy 2 and work with both 1.x and 2.x; upgrading an old torch also
        fixes the torch side of the mismatch.
    """,
    bad=Example(
        """
            $ pip install torch==2.2.2 && pip install -U numpy
            $ python -c "import torch; torch.zeros(2).numpy()"
            A module that was compiled using NumPy 1.x cannot be run in NumPy 2.0.0 as it may crash. ...
            UserWarning: Failed to initialize NumPy: _ARRAY_API not found
            RuntimeError: Numpy is not available
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    good=Example(
        """
            $ pip install torch==2.2.2 "numpy<2"
            $ python -c "import torch; print(torch.zeros(2).numpy())"
            [0. 0.]
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    details={
        "env": """
            Three situations, each a warning:

            - NumPy is not installed while torch is (a machine without torch is not reported);
            - the torch probe's `torch.from_numpy(numpy.zeros(1))` failed, or `import torch` printed the
              "compiled using NumPy 1.x" message: the finding quotes the error;
            - an installed package's metadata requires a NumPy the installed one does not satisfy, both ways
              (`numpy<2` with NumPy 2.x, `numpy>=2` with NumPy 1.x): the finding names those packages and their
              requirements.

            NumPy versions every installed package accepts are not reported. Fixes name this interpreter
            (`/path/to/python -m pip`) and keep torch pinned. Import
            errors that stop `import torch` itself are reported by [torch-import-failure](torch-import-failure.md), and
            a
            `numpy.py` in your project by [module-shadowing](module-shadowing.md).
        """,
    },
)


def _excluding(facts: EnvFacts, numpy: str) -> list[tuple[str, str]]:
    """The installed distributions whose numpy requirement excludes the installed NumPy."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    out = []
    for name, spec in sorted(facts.numpy_requirements.items()):
        try:
            if not SpecifierSet(spec).contains(numpy.split("+")[0], prereleases=True):
                out.append((name, spec))
        except InvalidSpecifier:
            continue
    return out


@NUMPY_PROBLEM.env
def numpy_problem(facts: EnvFacts) -> Iterator[Finding]:
    """NumPy missing under torch, unusable by torch, or excluded by an installed package's numpy requirement
    (numpy<2 with NumPy 2.x, numpy>=2 with NumPy 1.x)."""
    numpy = facts.packages.get("numpy")
    if numpy is None:
        if facts.torch_version:
            yield Finding(
                "NumPy is not installed: `import torch` warns 'Failed to initialize NumPy: No module named "
                "numpy', and tensor.numpy() / torch.from_numpy() / DataLoader collation of arrays fail.",
                fix=Fix(title=f"{pip(facts)} install numpy"),
            )
        return
    abi_text = " ".join(facts.torch.stderr_tail)
    excluded = _excluding(facts, numpy)
    if (facts.torch.numpy_error or "compiled using NumPy 1.x" in abi_text) and not absorbed_by_import_failure(
        facts, "numpy-problem"
    ):  # that finding names it as its cause
        detail = facts.torch.numpy_error or "a module compiled using NumPy 1.x cannot run in NumPy 2.x"
        yield Finding(
            f"torch cannot use NumPy {numpy}: {detail}.",
            fix=Fix(
                title=f'{pip(facts)} install "numpy<2" {torch_pin(facts)} (or upgrade the packages compiled against '
                "NumPy 1.x)"
            ),
        )
    elif excluded:
        names = ", ".join(f"{name} (numpy{spec})" for name, spec in excluded)
        if numpy.split(".")[0] == "1":
            symptom = (
                "they were built against NumPy 2 and fail to import with 'numpy.core.multiarray failed to "
                "import' or AttributeErrors on NumPy 1.x"
            )
            want = "numpy>=2"
        else:
            symptom = (
                "importing them fails with 'A module that was compiled using NumPy 1.x cannot be run in NumPy 2.x'"
            )
            want = "numpy<2"
        yield Finding(
            f"NumPy {numpy} is installed, but {names} exclude it: {symptom}.",
            fix=Fix(
                title=f'{pip(facts)} install "{want}" {torch_pin(facts)}, or move '
                f"{', '.join(n for n, _ in excluded)} to "
                "releases that accept the NumPy you keep"
            ),
        )
