"""torch-copy-hidden: two torch installs on sys.path; the one Python imports depends on how it is started."""

from __future__ import annotations

import os
import shlex
from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.env import EnvFacts

from ._envutil import MACHINE_STATE

TORCH_COPY_HIDDEN = Pitfall(
    code="TD121",
    name="torch-copy-hidden",
    severity="warning",
    summary="Two torch installs on sys.path: the user site's (or a .pth folder's) hides the environment's own.",
    why="""
        Python imports the first `torch/` on `sys.path`. Outside a venv (system Python, conda envs) the user site
        (`~/.local/lib/pythonX.Y/site-packages`, where `pip install --user` puts packages) comes before the
        environment's site-packages, and folders that `.pth` files add come after it. A torch in the user site
        therefore wins over the environment's own: `pip list` in the env, `conda list` and the version the env
        was built for say one thing, `import torch` loads another. Which one a program gets then depends on how
        it is started: `python -s`, `python -I`, `PYTHONNOUSERSITE=1` and venvs skip the user site and get the
        other copy, so a job scheduler, an IDE and your shell can run different torch builds.
    """,
    fix="""
        Keep one: remove the copy you do not use, or skip the user site for this environment.

        ```console
        $ export PYTHONNOUSERSITE=1                       # this shell; add it to the env's activation
        $ rm -rf ~/.local/lib/python3.11/site-packages/torch ~/.local/lib/python3.11/site-packages/torch-*.dist-info
        ```
    """,
    bad=Example(
        """
            $ pip install --user torch          # outside the conda env, once
            $ conda activate train && python -c "import torch; print(torch.__file__)"
            /home/me/.local/lib/python3.11/site-packages/torch/__init__.py
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    good=Example(
        """
            $ export PYTHONNOUSERSITE=1
            $ python -c "import torch; print(torch.__file__)"
            /opt/conda/envs/train/lib/python3.11/site-packages/torch/__init__.py
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    details={
        "env": """
            The torch probe lists every `torch/` folder on its `sys.path` in search order, with the version in each
            one's `version.py`, and where the user site is. When the import succeeds from the user site while
            another copy is further down the path, this check says which one wins, which it hides, and why. An
            order that every way of starting the interpreter keeps (a venv's own torch over the system
            Python's, with `--system-site-packages`) is one torch for every program and is not reported. Copies in
            the working directory or on PYTHONPATH are [module-shadowing](module-shadowing.md)'s, and a failing
            import is [torch-import-failure](torch-import-failure.md)'s (which names a user-site copy as its
            cause), so each is reported once.
        """,
    },
)


def _under(path: str, folder: str) -> bool:
    return os.path.normpath(path).startswith(os.path.normpath(folder).rstrip("/") + "/")


@TORCH_COPY_HIDDEN.env
def torch_copy_hidden(facts: EnvFacts) -> Iterator[Finding]:
    """The torch Python imports, when another torch further down sys.path is hidden by it."""
    probe = facts.torch
    if not probe.ok or len(probe.torch_copies) < 2:
        return
    winner, hidden = probe.torch_copies[0], probe.torch_copies[1:]
    if any(os.path.normpath(e.path) == os.path.normpath(winner) for e in facts.shadowing):
        return  # the working directory or PYTHONPATH: module-shadowing reports it
    versions = probe.torch_copy_versions

    def named(folder: str) -> str:
        return f"{folder} ({versions[folder]})" if folder in versions else folder

    if not (probe.user_site and _under(winner, probe.user_site)):
        return  # an order every way of starting this Python keeps (a venv's torch over the system's): one torch
    yield Finding(
        f"Python imports torch from {named(winner)}, which hides {', '.join(named(h) for h in hidden)}: "
        f"it is in the user site, which Python searches before the environment's site-packages; "
        f"`python -s`, `python -I`, PYTHONNOUSERSITE=1 and venvs skip it and import the other one.",
        fix=Fix(
            title=f"Keep one: skip the user site (this shell; add it to the environment's activation): "
            f"`export PYTHONNOUSERSITE=1`, or remove that copy: "
            f"`rm -rf {shlex.quote(winner)} {shlex.quote(os.path.dirname(winner))}/torch-*.dist-info`"
        ),
        location=Location(file=winner),
    )
