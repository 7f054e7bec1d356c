"""companion-version-mismatch: torchvision/torchaudio/torchtext (or another package) built for another torch."""

from __future__ import annotations

import platform
from typing import Iterator, Optional

from packaging.utils import canonicalize_name

from torchdoctor.sdk import Example, Finding, Fix, Pitfall
from torchdoctor.sdk.env import EnvFacts

from ._envutil import MACHINE_STATE, base_version, local_tag, major_minor, pip, torch_pin

# The companion release series published for each torch 2.m (PyPI, November 2026); None: no release exists.
# tests/env/test_env_checks.py fails when the installed torch is newer than this table: extend it then.
COMPANION_RELEASES: dict[int, dict[str, Optional[str]]] = {
    m: {
        "torchvision": f"0.{m + 15}",
        "torchaudio": f"2.{m}" if m <= 11 else None,
        "torchtext": f"0.{m + 15}" if m <= 3 else None,
    }
    for m in range(0, 15)
}
COMPANION_MINOR_OFFSET = ("torchvision", "torchaudio", "torchtext")  # companions built for one torch release

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
            From package metadata, for each installed package on torchdoctor's list of torch companions
            (torchvision, torchaudio, torchtext, torchdata, triton, xformers, flash-attn, lightning, accelerate,
            transformers, deepspeed, apex, ...) it reports an error when:

            - the package's own `Requires-Dist: torch ...` specifier excludes the installed torch version (local tag
              dropped);
            - torchvision/torchaudio/torchtext is not the release series published for this torch (a table of
              PyPI's releases: torchvision 0.(m+15) for torch 2.m, torchaudio 2.m up to 2.11, torchtext up to 0.18);
              where no release exists for this torch, the fix says so instead of proposing a version; for a torch
              newer than the table, the fix asks for "the release matching" it without inventing a number;
            - torchvision/torchaudio/torchtext is built for another variant: another local tag (`+cu121` vs
              `+cu124`), or, on Linux x86-64, a plain PyPI wheel (built for CUDA) next to a `+cpu` torch or the
              reverse;
            - the torch probe, which imports torchvision/torchaudio only when their `version.py` names another
              build than torch's, saw the import fail (e.g. `operator torchvision::nms does not exist`): the
              finding quotes the error.

            It stays quiet when torch's version is unknown. A plain PyPI wheel next to a `+cuXXX` one is not
            reported (which CUDA the PyPI wheel has cannot be told from its version). The fix uses this interpreter's
            pip (`/path/to/python -m pip`), keeps torch pinned and uses torch's wheel index.
        """,
    },
)


def _matching_companion(name: str, torch_version: str) -> "tuple[Optional[str], bool]":
    """(release series of `name` built for this torch 2.x, whether the table knows this torch)."""
    mm = major_minor(torch_version)
    if mm is None or mm[0] != 2 or name not in COMPANION_MINOR_OFFSET:
        return None, False
    row = COMPANION_RELEASES.get(mm[1])
    return (row[name], True) if row is not None else (None, False)


def _variant(tag: Optional[str]) -> Optional[str]:
    """'cpu', 'cu124', 'rocm6.2', ... or, for a wheel without a local tag on Linux x86-64 (PyPI's default,
    built for CUDA), 'pypi'."""
    return tag or ("pypi" if platform.system() == "Linux" and platform.machine() == "x86_64" else None)


def _variant_problem(name: str, ours: Optional[str], theirs: Optional[str]) -> Optional[str]:
    """Why `name`'s build variant does not go with torch's, if it doesn't."""
    a, b = _variant(ours), _variant(theirs)
    if a is None or b is None or a == b or name not in COMPANION_MINOR_OFFSET:
        return None
    if "pypi" in (a, b) and "cpu" not in (a, b):
        return None  # PyPI's default CUDA build next to a +cuXXX one: cannot tell which CUDA
    describe = {"pypi": "a PyPI (CUDA) build"}
    return f"is {describe.get(b, f'a +{b} build')} while torch is {describe.get(a, f'+{a}')}"


def companion_problems(facts: EnvFacts) -> "dict[str, list[str]]":
    """Installed packages whose torch requirement, release number or build variant excludes this torch, or
    whose import failed in the probe: name -> what is wrong (empty list: only the import failed)."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    torch_version = facts.torch_version
    if not torch_version:
        return {}
    base = base_version(torch_version)
    ours = local_tag(torch_version)
    found: dict[str, list[str]] = {}
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
        want, known = _matching_companion(name, torch_version)
        if known and (want is None or major_minor(version) != major_minor(want)):
            problems.append(
                f"is the release for another torch (torch {base} goes with {name} {want}.*)"
                if want
                else f"is the release for another torch (no {name} release exists for "
                f"torch {'.'.join(base.split('.')[:2])})"
            )
        variant = _variant_problem(name, ours, local_tag(version))
        if variant:
            problems.append(variant)
        if problems or facts.torch.companion_errors.get(name):
            found[name] = problems
    return found


def _sentence(name: str, version: str, problems: list[str], torch_version: str) -> str:
    """`name version` with its problems as one readable sentence (two at most joined by "and")."""
    if len(problems) <= 2:
        return f"{name} {version} {' and '.join(problems)}, but torch {torch_version} is installed."
    return (
        f"{name} {version} does not go with torch {torch_version}: it "
        + "; it ".join(problems[:-1])
        + f"; and it {problems[-1]}."
    )


@COMPANION_VERSION_MISMATCH.env
def companion_version_mismatch(facts: EnvFacts) -> Iterator[Finding]:
    """Packages whose torch requirement, release number or build variant excludes this torch, or whose
    import failed in the probe; an unmet requirement on the same package (`pip check`) is its evidence."""
    torch_version = facts.torch_version
    if not torch_version:
        return
    base = base_version(torch_version)
    ours = local_tag(torch_version)
    for name, problems in companion_problems(facts).items():
        version = facts.packages[name]
        want, known = _matching_companion(name, torch_version)
        error = facts.torch.companion_errors.get(name)
        if not problems:
            problems = ["does not import with this torch"]
        if want:
            target = f'"{name}=={want}.*"'
        elif known:
            target = ""
        else:
            target = f'"{name}"  # the {name} release matching torch {base}'
        index = f" --index-url https://download.pytorch.org/whl/{ours}" if ours else ""
        seen = (
            f" Importing it fails: {error}."
            if error
            else " Importing it fails with 'RuntimeError: operator torchvision::nms does not exist'."
            if name == "torchvision"
            else ""
        )
        also = [
            f"{u.dist} {u.version} requires {u.requirement}"
            for u in facts.unmet_requirements
            if canonicalize_name(u.requirement_name) == name
        ]
        if also:
            seen += f" Also (pip check): {'; '.join(also)}."
        if target:
            fix = (
                f"Install the matching release from the same index as torch, keeping torch: "
                f"{pip(facts)} install {torch_pin(facts)} {target.split('  #')[0]}{index}"
            )
            if not want:
                fix += f" (pick the {name} release matching torch {base}; see its release notes)"
        else:
            fix = (
                f"No {name} release exists for this torch: {pip(facts)} uninstall {name}, or install the torch "
                f"release it was built for."
            )
        yield Finding(_sentence(name, version, problems, torch_version) + seen, fix=Fix(title=fix), key=name)
