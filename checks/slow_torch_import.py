"""slow-torch-import: `import torch` succeeds but uses more than 10 s of CPU or waits more than 10 s for files."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Pitfall, Severity
from torchdoctor.sdk.env import EnvFacts

from ._envutil import MACHINE_STATE

SLOW_IMPORT_S = 10.0

SLOW_TORCH_IMPORT = Pitfall(
    code="TD117",
    name="slow-torch-import",
    severity="warning",
    summary="`import torch` succeeds but uses more than 10 s of CPU time or waits more than 10 s for its files.",
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
            scripts) and splits the time: CPU time (`time.process_time`), time spent waiting for a CPU, and the rest
            (blocked: reading files, a network file system, a lock), from Linux's per-thread scheduler statistics
            (`/proc/self/schedstat`). More than 10 s of CPU time, or more than 10 s blocked, is a warning; the wall
            time alone never is, because a busy machine (a loaded CI runner, other jobs) stretches it without
            anything wrong with the install. When the import took over 10 s mostly waiting for a CPU, a note says
            the machine is loaded. Without scheduler statistics (not Linux) the off-CPU time is judged only when the
            load average is below the number of CPUs. An import that does not finish at all is reported by
            [torch-import-failure](torch-import-failure.md) with the stack where it hung. The first import after
            installing torch can be slow once while the OS caches the libraries; run `torchdoctor env` again to check.
        """,
    },
)


@SLOW_TORCH_IMPORT.env
def slow_torch_import(facts: EnvFacts) -> Iterator[Finding]:
    """A successful `import torch` that used more than 10 s of CPU time, or waited more than 10 s for files;
    a wall time made long by waiting for a CPU (a loaded machine) is a note, not a warning."""
    probe = facts.torch
    if not probe.ok or probe.cpu_seconds is None or probe.seconds is None:
        return
    cpu, wall = probe.cpu_seconds, probe.seconds
    wait = probe.cpu_wait_seconds
    blocked = probe.blocked_seconds
    if (
        blocked is None
        and wait is None
        and facts.system.load_average is not None
        and facts.system.cpu_logical
        and facts.system.load_average < facts.system.cpu_logical
    ):
        blocked = max(0.0, wall - cpu)  # no per-thread accounting (not Linux): an idle machine's off-CPU time
    where = f" from {facts.torch_dist_location}" if facts.torch_dist_location else ""
    split = (
        f"{cpu:.1f} s on a CPU"
        + (f", {blocked:.1f} s waiting for files" if blocked is not None else "")
        + (f", {wait:.1f} s waiting for a CPU" if wait is not None else "")
    )
    if blocked is not None and blocked > SLOW_IMPORT_S:
        yield Finding(
            f"`import torch`{where} spent {blocked:.0f} s waiting for its files to be read ({split}; "
            f"a local disk needs well under a second).",
            fix=Fix(
                title="Move the environment to a local disk, or find the slow folder: `python -X importtime -c "
                "\"import torch\" 2>&1 | sort -t'|' -k2 -n | tail`."
            ),
        )
    elif cpu > SLOW_IMPORT_S:
        yield Finding(
            f"`import torch`{where} used {cpu:.0f} s of CPU time ({split}; torch needs a few seconds).",
            fix=Fix(
                title='Find the modules that take the time: `python -X importtime -c "import torch" 2>&1 | '
                "sort -t'|' -k2 -n | tail` (a sitecustomize or a package torch imports doing heavy work)."
            ),
        )
    elif wall > SLOW_IMPORT_S and wait is not None and wait > wall / 2:
        yield Finding(
            f"`import torch` took {wall:.0f} s because the machine is loaded: it waited {wait:.0f} s for a "
            f"CPU ({split}); the install itself is fine.",
            fix=Fix(title="Nothing to fix in the install; timings taken now reflect the load."),
            severity=Severity.INFO,
        )
