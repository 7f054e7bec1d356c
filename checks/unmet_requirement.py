"""unmet-requirement: an installed package requires a version of another that is not installed (`pip check`)."""

from __future__ import annotations

from typing import Iterator

from packaging.utils import canonicalize_name

from torchdoctor.sdk import Example, Finding, Fix, Pitfall
from torchdoctor.sdk.env import EnvFacts

from ._envutil import MACHINE_STATE, pip, torch_pin
from ._importcause import explained_requirement
from .companion_version_mismatch import companion_problems

UNMET_REQUIREMENT = Pitfall(
    code="TD118",
    name="unmet-requirement",
    severity="warning",
    summary="An installed package requires a version of another package that is not installed (`pip check`).",
    why="""
        An installed package declares a requirement (`Requires-Dist` in its metadata) that the environment does
        not meet: the required package is missing, or installed in a version outside the declared range. pip
        only warns about this at install time ("pip's dependency resolver does not currently take into account
        all the packages that are installed"), and a later `pip install -U something` or a `conda install` on top
        of pip packages creates it silently.

        The failure then comes far from the cause: an `ImportError: cannot import name ...` deep inside
        transformers, `AttributeError: module 'tokenizers' has no attribute ...`, or subtly different behaviour.
    """,
    fix="""
        Install the required versions, keeping torch where it is:

        ```console
        $ python -m pip check
        $ python -m pip install "tokenizers>=0.21,<0.22" "torch==2.5.1"
        ```
    """,
    bad=Example(
        """
            $ pip install transformers==4.48.0 && pip install -U tokenizers
            $ python -m pip check
            transformers 4.48.0 has requirement tokenizers<0.22,>=0.21, but you have tokenizers 0.22.1.
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    good=Example(
        """
            $ pip install transformers==4.48.0
            $ python -m pip check
            No broken requirements found.
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    details={
        "env": """
            One pass over the installed distributions' metadata with `importlib.metadata` and `packaging`, as
            `pip check` does: every requirement that applies here (environment markers evaluated, optional extras
            skipped) is compared with the installed version (local tags such as `+cu124` ignored). Requirements on
            torch are reported by [companion-version-mismatch](companion-version-mismatch.md) and on NumPy by
            [numpy-problem](numpy-problem.md), so each problem is reported once; for the same reason a requirement
            on a companion that companion-version-mismatch reports (an old torchvision) is quoted there as its
            evidence, and a requirement of torch's that makes `import torch` fail is the cause
            [torch-import-failure](torch-import-failure.md) names. One finding lists every other unmet
            requirement; the fix installs them with this interpreter's pip and keeps torch pinned.
        """,
    },
)


@UNMET_REQUIREMENT.env
def unmet_requirement(facts: EnvFacts) -> Iterator[Finding]:
    """Every unmet declared requirement, in one finding."""
    explained = explained_requirement(facts)
    companions = companion_problems(facts) if facts.unmet_requirements else {}
    # one cause, one finding: what torch-import-failure names as its cause, and requirements on a companion that
    # companion-version-mismatch reports (with these as its evidence), are not repeated here
    merged = set(companions) | ({canonicalize_name(explained.requirement_name)} if explained else set())
    unmet = [u for u in facts.unmet_requirements if canonicalize_name(u.requirement_name) not in merged]
    if not unmet:
        return
    lines = [
        f"{u.dist} {u.version} requires {u.requirement}, but "
        + (f"{u.requirement_name} {u.installed} is installed" if u.installed else "it is not installed")
        for u in unmet
    ]
    wanted = " ".join(sorted({f'"{u.requirement}"' for u in unmet}))
    yield Finding(
        f"{len(unmet)} declared requirement(s) not met: " + "; ".join(lines) + ".",
        fix=Fix(title=f"{pip(facts)} install {wanted} {torch_pin(facts)}".rstrip()),
    )
