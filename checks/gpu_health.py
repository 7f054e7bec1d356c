"""gpu-health: ECC errors, slowdowns, persistence mode off, a GPU busy with other work."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall, Severity
from torchdoctor.sdk.env import EnvFacts

from ._envutil import MACHINE_STATE, gpu_process

BUSY_PERCENT = 90

GPU_HEALTH = Pitfall(
    code="TD114",
    name="gpu-health",
    severity="warning",
    summary="ECC errors, hardware/thermal slowdowns, persistence mode off, a GPU busy with other work.",
    why="""
        A GPU is in a state that makes training wrong or slow: uncorrected ECC memory errors, clocks held down by heat
        or power limits, or heavy use by other processes. GPUs with persistence mode off are mentioned as info.

        - **Uncorrected ECC errors** mean GPU memory returned wrong data: results computed on it may be wrong, and CUDA
          calls fail with `RuntimeError: CUDA error: uncorrectable ECC error encountered`.
        - **Slowdowns** (hardware or thermal slowdown, power brake) cut clock speeds: steps take longer
          for no visible reason, and one slow GPU holds back every rank of a DDP job.
        - **A GPU busy with someone else's work** shares its compute with your job.
        - **Persistence mode off**: the driver tears the GPU down when no process uses it, so each new CUDA process
          waits seconds to initialise.
    """,
    fix="""
        ```console
        $ nvidia-smi -q -d ECC,PERFORMANCE,TEMPERATURE,POWER -i 0   # details for GPU 0
        $ sudo nvidia-smi -r -i 0              # after ECC errors: reset the drained GPU; replace it if errors return
        $ nvidia-smi                           # pick an idle GPU ...
        $ export CUDA_VISIBLE_DEVICES=2        # ... and use it
        $ sudo nvidia-smi -pm 1                # persistence mode on (or run nvidia-persistenced)
        ```

        For slowdowns check airflow, fans and power cabling (`nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER`).
    """,
    bad=Example(
        """
            $ nvidia-smi --format=csv --query-gpu=index,temperature.gpu,\\
            > clocks_throttle_reasons.hw_thermal_slowdown,ecc.errors.uncorrected.volatile.total
            index, temperature.gpu, clocks_throttle_reasons.hw_thermal_slowdown, ecc.errors.uncorrected.volatile.total
            0, 91, Active, 3
            $ CUDA_VISIBLE_DEVICES=0 python train.py
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    good=Example(
        """
            $ nvidia-smi --format=csv --query-gpu=index,temperature.gpu,\\
            > clocks_throttle_reasons.hw_thermal_slowdown,ecc.errors.uncorrected.volatile.total
            index, temperature.gpu, clocks_throttle_reasons.hw_thermal_slowdown, ecc.errors.uncorrected.volatile.total
            1, 45, Not Active, 0
            $ CUDA_VISIBLE_DEVICES=1 python train.py
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    details={
        "env": """
            From NVML, per GPU, without initialising CUDA:

            - **warning**: ECC is enabled and the volatile uncorrected error count (since the driver loaded) is above
              zero;
            - **warning**: a current clock-event reason is hardware slowdown, hardware thermal slowdown, power brake
              or software thermal slowdown; idle, application-clock and power-cap reasons are normal and ignored (a GPU
              under full load normally runs at its power limit);
            - **warning**: utilisation is at least 90 % while other processes, alive and visible to torchdoctor, use the
              GPU;
            - **info**: persistence mode is off.

            Corrected ECC errors and GPUs without ECC are not reported. Without NVML the check is silent.
        """,
    },
)


@GPU_HEALTH.env
def gpu_health(facts: EnvFacts) -> Iterator[Finding]:
    """Per GPU: uncorrected ECC errors, slowdowns, heavy use by others, persistence mode off."""
    for gpu in facts.nvidia.gpus:
        where = Location(device=f"GPU{gpu.index}")
        label = f"GPU{gpu.index} ({gpu.name})"
        if gpu.ecc_uncorrected:
            yield Finding(
                f"{label} reports {gpu.ecc_uncorrected} uncorrected ECC memory error(s) since the driver loaded: "
                "results computed on it may be wrong, and CUDA may fail with 'uncorrectable ECC error encountered'.",
                fix=Fix(
                    title=f"Drain the GPU and reset it (`sudo nvidia-smi -r -i {gpu.index}`); if errors return, "
                    "have it "
                    f"replaced."
                ),
                location=where,
            )
        if gpu.throttle_reasons:
            temp = f" at {gpu.temperature}°C" if gpu.temperature is not None else ""
            yield Finding(
                f"{label} is slowed down{temp}: {', '.join(gpu.throttle_reasons)}.",
                fix=Fix(title="Check cooling and power (`nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER`)."),
                location=where,
            )
        others = [p for p in gpu.processes if p.alive]
        if gpu.utilization is not None and gpu.utilization >= BUSY_PERCENT and others:
            yield Finding(
                f"{label} is {gpu.utilization}% busy with other processes "
                f"({'; '.join(gpu_process(p) for p in others)}): "
                "your job will share its compute.",
                fix=Fix(title="Pick an idle GPU with CUDA_VISIBLE_DEVICES (`nvidia-smi` shows utilisation)."),
                location=where,
            )
        if gpu.persistence_mode is False:
            yield Finding(
                f"{label} has persistence mode off: the driver tears the GPU down when no process uses it, so "
                "every new CUDA process pays seconds of initialisation.",
                fix=Fix(title="sudo nvidia-smi -pm 1   (or run nvidia-persistenced)"),
                location=where,
                severity=Severity.INFO,
            )
