"""thread-oversubscription: more compute threads than usable cores, or OMP threads unset under torchrun."""

from __future__ import annotations

import math
from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Pitfall
from torchdoctor.sdk.env import EnvFacts

from ._envutil import MACHINE_STATE

THREAD_OVERSUBSCRIPTION = Pitfall(
    code="TD112",
    name="thread-oversubscription",
    severity="warning",
    summary=(
        "More compute threads than usable cores (threads x local processes), or OMP threads unset under torchrun."
    ),
    why="""
        torch will run more compute threads than there are usable CPUs: its intra-op thread count times the number of
        processes on this machine (`LOCAL_WORLD_SIZE`) exceeds the CPUs this process may use, counting CPU affinity
        and a container's CPU quota. Also reported: several local processes with `OMP_NUM_THREADS` unset.

        Each torch process starts a thread pool sized for the whole machine. Eight DDP ranks with 32 threads each on a
        32-core host, or one process in a container limited to 4 CPUs (`docker run --cpus=4`, whose quota torch does
        not see) on a 64-core host, make threads fight for cores: CPU ops, data preprocessing and the CPU side of GPU
        training get slower, not faster, and launches can look stuck. There is no error, only torchrun's hint:

        ```text
        Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being
        overloaded, please further tune the variable for optimal performance in your application as needed.
        ```
    """,
    fix="""
        Give each process its share of the usable CPUs:

        ```console
        $ nproc                                          # CPUs this process may use (affinity, not quota)
        $ cat /sys/fs/cgroup/cpu.max                     # container quota, e.g. "400000 100000" = 4 CPUs
        $ export OMP_NUM_THREADS=4 MKL_NUM_THREADS=4     # usable CPUs / local processes
        $ torchrun --nproc_per_node=8 train.py
        ```

        or call `torch.set_num_threads(n)` at the start of each process.
    """,
    bad=Example(
        """
            $ nproc                      # host with 32 cores / 64 hardware threads
            64
            $ docker run --cpus=4 my-image python -c "import torch; print(torch.get_num_threads())"
            32
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    good=Example(
        """
            $ docker run --cpus=4 -e OMP_NUM_THREADS=4 my-image python -c "import torch; print(torch.get_num_threads())"
            4
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    details={
        "env": """
            Usable CPUs are the smallest of the logical CPU count, the CPU affinity of the process, and the cgroup CPU
            quota rounded up. Threads are `torch.get_num_threads()` as the torch probe saw it (which honours
            `OMP_NUM_THREADS`), or `OMP_NUM_THREADS` itself when torch did not import. Local processes come from
            `LOCAL_WORLD_SIZE` (1 when unset), so run `torchdoctor env` with the environment of your launch (inside the
            job,
            or with `LOCAL_WORLD_SIZE` exported) to check a multi-process run. A warning fires when threads × processes
            exceed the usable CPUs; otherwise, with more than one local process and `OMP_NUM_THREADS` unset, a warning
            suggests setting it. DataLoader workers and inter-op threads are not counted, and exactly matching the CPU
            count is not reported.
        """,
    },
)


def _usable_cpus(facts: EnvFacts) -> int | None:
    """The CPUs this process may use: logical CPUs, affinity and the cgroup quota, whichever is least."""
    s = facts.system
    counts = [c for c in (s.cpu_logical, s.cpu_affinity) if c]
    if s.cgroup_cpu_limit:
        counts.append(max(1, math.ceil(s.cgroup_cpu_limit)))
    return min(counts) if counts else None


@THREAD_OVERSUBSCRIPTION.env
def thread_oversubscription(facts: EnvFacts) -> Iterator[Finding]:
    """Threads x local processes above the usable CPUs, or OMP_NUM_THREADS unset for several."""
    cpus = _usable_cpus(facts)
    env = facts.env_vars
    try:
        procs = max(1, int(env.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        procs = 1
    threads = facts.torch.num_threads
    if threads is None:
        try:
            threads = int(env["OMP_NUM_THREADS"])
        except (KeyError, ValueError):
            threads = None
    if cpus and threads and threads * procs > cpus:
        limit = (
            f" (a container quota of {facts.system.cgroup_cpu_limit:g} CPUs)" if facts.system.cgroup_cpu_limit else ""
        )
        per = max(1, cpus // procs)
        yield Finding(
            f"torch will run {threads} threads × {procs} local process(es) = {threads * procs} threads on "
            f"{cpus} usable CPU(s){limit}: threads fight for cores and CPU ops get slower, not faster.",
            fix=Fix(
                title=f"export OMP_NUM_THREADS={per} MKL_NUM_THREADS={per} (or torch.set_num_threads({per}) in "
                "each process)"
            ),
        )
    elif procs > 1 and "OMP_NUM_THREADS" not in env:
        yield Finding(
            f"{procs} local processes (LOCAL_WORLD_SIZE) and OMP_NUM_THREADS is unset: each process sizes its "
            "thread pool for the whole machine.",
            fix=Fix(title=f"export OMP_NUM_THREADS={max(1, (cpus or procs) // procs)} before launching"),
        )
