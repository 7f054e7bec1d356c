"""companion-version-mismatch: torchvision/torchaudio/torchtext (or another package) built for another torch."""
from __future__ import annotations

from typing import Iterator, Optional

from torchdoctor.sdk import Example, Finding, Pitfall
from torchdoctor.sdk.env import EnvFacts

from ._envutil import MACHINE_STATE, base_version, local_tag, major_minor

COMPANION_MINOR_OFFSET = {"torchvision": (0, 15), "torchtext": (0, 15), "torchaudio": (2, 0)}

COMPANION_VERSION_MISMATCH = Pitfall(
    code="TD106",
    name="companion-version-mismatch",
    severity="error",
    summary="torchvision/torchaudio/torchtext (or another package) built for a different torch.",
    why="""
        torchvision, torchaudio or torchtext was built for a different torch release or CUDA variant than the
        installed torch, or another installed package (xformers, lightning, deepspeed, ...) declares a torch
        requirement that the installed torch does not meet. Compiled companions only work with the exact torch
        they were built against.

        Installing or upgrading one package on its own (`pip install -U torch`, `pip install torchvision` from PyPI
        on top of a `+cu124` torch, a package that pins another torch) leaves the set inconsistent. Importing
        torchvision then fails with:

        ```text
        RuntimeError: operator torchvision::nms does not exist
        ```

        (older releases: `RuntimeError: No such operator torchvision::nms`), and torchaudio fails with
        `undefined symbol` errors from its `.so` files. The real cause, torchvision's C++ extension not loading, is
        hidden unless `TORCHVISION_WARN_WHEN_EXTENSION_LOADING_FAILS=1` is set.
    """,
    fix="""
        Install torch and its companions together, from the same index, with matching releases: torch 2.m goes with
        torchvision 0.(m+15) and torchaudio 2.m (torch 2.5 ↔ torchvision 0.20 ↔ torchaudio 2.5).

        ```console
        $ pip install torch==2.5.1 torchvision==0.20.1 torchaudio==2.5.1 \\
              --index-url https://download.pytorch.org/whl/cu124
        $ pip check
        ```

        For another package with a torch pin, install the release of it built for your torch, or the torch it asks for.
    """,
    bad=Example(
        """
            $ pip install torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124
            $ pip install torchvision            # from PyPI: newest release, for a newer torch
            $ python -c "import torchvision"
            RuntimeError: operator torchvision::nms does not exist
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    good=Example(
        """
            $ pip install torch==2.5.1 torchvision==0.20.1 --index-url https://download.pytorch.org/whl/cu124
            $ python -c "import torch, torchvision; print(torch.__version__, torchvision.__version__)"
            2.5.1+cu124 0.20.1+cu124
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    details={
        "env": """
            From package metadata alone (nothing is imported), for each installed package on torchdoctor's list of torch
            companions (torchvision, torchaudio, torchtext, torchdata, triton, xformers, flash-attn, lightning,
            accelerate, transformers, deepspeed, apex, ...) it reports an error when:

            - the package's own `Requires-Dist: torch ...` specifier excludes the installed torch version (local tag
              dropped);
            - torchvision/torchtext is not 0.(m+15).\\* or torchaudio not 2.m.\\* for torch 2.m;
            - torchvision/torchaudio/torchtext carries a different local tag (`+cu121` vs `+cu124`, `+cpu`).

            It stays quiet when torch's version is unknown. The release-numbering rule is applied only to torch 2.x, the
            local tags only when both sides carry one (plain PyPI wheels have none); packages other than torchvision,
            torchaudio and torchtext are checked only against their own torch requirement.
        """,
    },
)


def _matching_companion(name: str, torch_version: str) -> Optional[str]:
    """The release series of `name` that goes with this torch 2.x (None when no rule applies)."""
    mm = major_minor(torch_version)
    if mm is None or mm[0] != 2 or name not in COMPANION_MINOR_OFFSET:
        return None
    major, offset = COMPANION_MINOR_OFFSET[name]
    return f"{major}.{mm[1] + offset}" if major == 0 else f"2.{mm[1]}"


@COMPANION_VERSION_MISMATCH.env
def companion_version_mismatch(facts: EnvFacts) -> Iterator[Finding]:
    """Packages whose torch requirement, release number or local tag excludes this torch."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    torch_version = facts.torch_version
    if not torch_version:
        return
    base = base_version(torch_version)
    for name, version in sorted(facts.packages.items()):
        if name == "torch":
            continue
        problems = []
        spec = facts.torch_requirements.get(name)
        if spec:
            try:
                if not SpecifierSet(spec).contains(base, prereleases=True):
                    problems.append(f"requires torch{spec}")
            except InvalidSpecifier:
                pass
        want = _matching_companion(name, torch_version)
        if want and major_minor(version) != major_minor(want):
            problems.append(f"is the release for another torch (torch {base} goes with {name} {want}.*)")
        ours, theirs = local_tag(torch_version), local_tag(version)
        if ours and theirs and ours != theirs and name in COMPANION_MINOR_OFFSET:
            problems.append(f"is a +{theirs} build while torch is +{ours}")
        if not problems:
            continue
        target = f"{name}=={want}.*" if want else name
        extra = (" Importing it fails with 'RuntimeError: operator torchvision::nms does not exist'."
                 if name == "torchvision" else "")
        yield Finding(
            f"{name} {version} {' and '.join(problems)}, but torch {torch_version} is installed.{extra}",
            fix=f"Install the matching release from the same index as torch: pip install \"{target}\""
                + (f" --index-url https://download.pytorch.org/whl/{ours}" if ours else ""),
            key=name,
        )
