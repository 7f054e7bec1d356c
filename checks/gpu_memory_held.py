"""gpu-memory-held: GPU memory held by other processes, especially dead, zombie or orphaned ones."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall, Severity, byte_size
from torchdoctor.sdk.env import EnvFacts

from ._envutil import MACHINE_STATE, gpu_process

GPU_MEMORY_HELD = Pitfall(
    code="TD110",
    name="gpu-memory-held",
    severity="warning",
    summary="GPU memory held by other processes, especially dead, zombie or orphaned ones.",
    why="""
        Other processes hold memory on a GPU: most often leftovers of your own previous run (a process that no longer
        exists, a zombie, or an orphaned DataLoader worker or DDP rank left behind by Ctrl-C). The finding lists
        each one with pid, user, memory and command.

        Interrupting a training job does not always free its GPU memory: worker processes survive their parent and
        keep the CUDA context open. The next run then fails although "nothing is running":

        ```text
        torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of
        79.15 GiB of which 1.06 GiB is free. Process 23817 has 10.00 GiB memory in use. ...
        ```

        `nvidia-smi` shows the memory as used, sometimes with `No running processes found` or a PID that `kill`
        answers with `No such process`.
    """,
    fix="""
        Kill the leftovers; find what really holds the device files when the PID NVML reports is gone. Reset the GPU
        only as a last resort, when nothing holds it any more:

        ```console
        $ nvidia-smi --query-compute-apps=pid,used_memory --format=csv
        $ ps -o pid,ppid,stat,user,cmd -p 12345
        $ kill 12345                      # orphan: the PID itself; zombie: its parent
        $ sudo fuser -v /dev/nvidia*      # who still has the GPU open when the PID no longer exists
        $ sudo nvidia-smi --gpu-reset -i 0   # last resort, GPU idle
        ```

        Check with `ps` before killing: the process may be a job that is still working.
    """,
    bad=Example(
        """
            $ python train.py            # num_workers=8, interrupted with Ctrl-C
            ^C
            $ nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
            23817, 10240 MiB
            $ python train.py
            torch.OutOfMemoryError: CUDA out of memory. ...
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    good=Example(
        """
            $ ps -o pid,ppid,cmd -p 23817
              PID  PPID CMD
            23817     1 python train.py
            $ kill 23817
            $ python train.py
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    details={
        "env": """
            For every GPU it reads NVML's list of compute and graphics processes and looks each PID up with psutil:

            - **warning**: the PID no longer exists (only when torchdoctor shares the host's PID namespace);
            - **warning**: the process is a zombie; the fix names its parent to kill;
            - **warning**: the process is orphaned: the leader of its process group (the training script or launcher
              that started it) is gone, as happens to DataLoader workers and DDP ranks after Ctrl-C or a crash;
            - **info**: any other process using the GPU, with its total memory.

            In a container without `--pid=host`, NVML reports host PIDs that are invisible from inside; torchdoctor then
            lists them as other processes (info) and never calls them dead. A detached `nohup` job leads its own
            process group, and ranks of a launcher that is still alive have a live group leader, so neither is called
            orphaned; they are listed as other processes (info). Without NVML the check is silent.
        """,
    },
)


@GPU_MEMORY_HELD.env
def gpu_memory_held(facts: EnvFacts) -> Iterator[Finding]:
    """Per GPU: processes that are dead, zombie or orphaned yet hold memory, then all the others."""
    for gpu in facts.nvidia.gpus:
        where = Location(device=f"GPU{gpu.index}")
        live = []
        for p in gpu.processes:
            if p.alive is False and p.status != "zombie":
                yield Finding(
                    f"GPU{gpu.index} ({gpu.name}): {gpu_process(p)} holds GPU memory but the process no longer exists; "
                    "the memory stays allocated (nvidia-smi shows it, `kill` answers 'no such process').",
                    fix=Fix(
                        title="Find what still has the device open with `sudo fuser -v /dev/nvidia*` and kill those "
                        "processes (often leftover DataLoader workers of the dead job). Only if nothing holds "
                        f"it: `sudo nvidia-smi --gpu-reset -i {gpu.index}` with the GPU idle."
                    ),
                    location=where,
                    key=f"pid {p.pid}",
                )
            elif p.status == "zombie":
                yield Finding(
                    f"GPU{gpu.index} ({gpu.name}): {gpu_process(p)} is a zombie still holding GPU memory; its parent "
                    f"(pid {p.parent_pid}) has not reaped it.",
                    fix=Fix(
                        title=f"kill the parent: `kill {p.parent_pid}` (then `kill -9 {p.parent_pid}` if it ignores it)"
                    ),
                    location=where,
                    key=f"pid {p.pid}",
                )
            elif p.alive and p.orphaned:
                yield Finding(
                    f"GPU{gpu.index} ({gpu.name}): {gpu_process(p)} is orphaned (its parent and the leader of its "
                    "process group are gone) and still holds GPU memory, typically a DataLoader worker or DDP rank "
                    "left behind by Ctrl-C.",
                    fix=Fix(title=f"kill {p.pid}  (or `pkill -f <your script>` to get all leftovers)"),
                    location=where,
                    key=f"pid {p.pid}",
                )
            else:
                live.append(p)
        if live:
            held = sum(p.used_bytes or 0 for p in live)
            yield Finding(
                f"GPU{gpu.index} ({gpu.name}): {len(live)} other process(es) hold {byte_size(held)} of "
                f"{byte_size(gpu.memory_total)}: " + "; ".join(gpu_process(p) for p in live) + ".",
                fix=Fix(
                    title="If they are yours and finished, `kill <pid>`; otherwise pick another GPU with "
                    "CUDA_VISIBLE_DEVICES."
                ),
                location=where,
                severity=Severity.INFO,
            )
