"""slow-torch-import: `import torch` succeeds but takes more than 10 s."""
from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Pitfall
from torchdoctor.sdk.env import EnvFacts

from ._envutil import MACHINE_STATE

SLOW_IMPORT_S = 10.0

SLOW_TORCH_IMPORT = Pitfall(
    code="TD117",
    name="slow-torch-import",
    severity="warning",
    summary="`import torch` succeeds but takes more than 10 s.",
    why="""
        `import torch` takes a few seconds on a local disk. Far longer means every script, test run and DataLoader
        worker started with `spawn` pays that time again, and usually points at something to fix: site-packages on
        a slow network filesystem (NFS, a FUSE mount), an antivirus scanning every `.so`, a `sitecustomize` doing
        network I/O, or a package imported by torch (or shadowing a module torch imports) doing heavy work.
    """,
    fix="""
        See which modules take the time, then move the environment to a local disk or fix the slow module:

        ```console
        $ python -X importtime -c "import torch" 2>&1 | sort -t'|' -k2 -n | tail
        ```
    """,
    bad=Example(
        """
            $ time python -c "import torch"
            real    0m41.3s
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    good=Example(
        """
            $ time python -c "import torch"
            real    0m2.1s
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    details={
        "env": """
            The torch probe times its `import torch` (in a fresh process, so caches are as warm as for your own
            scripts). Over 10 s is a warning giving the time. An import that does not finish at all is reported by
            [torch-import-failure](torch-import-failure.md) with the stack where it hung. The first import after
            installing torch can be slow once while the OS caches the libraries; run `torchdoctor env` again to check.
        """,
    },
)


@SLOW_TORCH_IMPORT.env
def slow_torch_import(facts: EnvFacts) -> Iterator[Finding]:
    """A successful `import torch` slower than 10 s."""
    seconds = facts.torch.seconds
    if facts.torch.ok and seconds is not None and seconds > SLOW_IMPORT_S:
        where = f" from {facts.torch_dist_location}" if facts.torch_dist_location else ""
        yield Finding(f"`import torch` took {seconds:.0f} s{where} (a local install takes a few seconds).",
                      fix="Find the slow modules: `python -X importtime -c \"import torch\" 2>&1 | sort -t'|' -k2 -n | "
                          "tail`; move the environment off a network filesystem if that is where it lives.")
