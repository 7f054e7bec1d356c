"""Synthetic env fact sets: a healthy GPU workstation and a healthy CPU box, to be spoiled one fact at a time."""

from torchdoctor import registry
from torchdoctor.env.facts import EnvFacts, GpuFacts, NvidiaFacts, SystemFacts, ToolkitFacts, TorchProbe

GiB = 1024**3
ARCHS = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]


def healthy_gpu_facts() -> EnvFacts:
    return EnvFacts(
        torch=TorchProbe(
            ok=True,
            seconds=2.0,
            cpu_seconds=1.8,
            cpu_wait_seconds=0.1,
            blocked_seconds=0.1,
            version="2.5.1+cu124",
            cuda="12.4",
            cudnn=90100,
            nccl="2.21.5",
            arch_list=list(ARCHS),
            num_threads=8,
            cuda_available=True,
            cuda_device_count=2,
            openmp_runtimes=["/site-packages/torch/lib/libgomp-a34b3233.so.1"],
            numpy_version="1.26.4",
            torch_file="/site-packages/torch/__init__.py",
        ),
        torch_dist_version="2.5.1+cu124",
        torch_dist_cuda="12.4",
        torch_dist_location="/site-packages/torch",
        nvidia=NvidiaFacts(
            driver_version="550.54.15",
            driver_cuda="12.4",
            proc_driver=True,
            gpus=[
                GpuFacts(
                    index=i,
                    name="NVIDIA A100-SXM4-80GB",
                    uuid=f"GPU-0000000{i}-aaaa",
                    capability=(8, 0),
                    memory_total=80 * GiB,
                    memory_used=GiB // 2,
                    utilization=0,
                    temperature=35,
                    power_watts=60.0,
                    power_limit_watts=400.0,
                    ecc_enabled=True,
                    ecc_uncorrected=0,
                    persistence_mode=True,
                )
                for i in range(2)
            ],
        ),
        toolkit=ToolkitFacts(nvcc_path="/usr/local/cuda/bin/nvcc", nvcc_version="12.4", cuda_home="/usr/local/cuda"),
        system=SystemFacts(
            python="3.11.7",
            python_executable="/usr/bin/python3",
            platform="Linux",
            machine="x86_64",
            cpu_logical=32,
            cpu_physical=16,
            cpu_affinity=32,
            memory_total=256 * GiB,
            memory_available=200 * GiB,
            disk_path="/work",
            disk_total=2000 * GiB,
            disk_free=900 * GiB,
            shm_total=64 * GiB,
        ),
        env_vars={"CUDA_VISIBLE_DEVICES": "0,1"},
        packages={
            "torch": "2.5.1+cu124",
            "torchvision": "0.20.1+cu124",
            "torchaudio": "2.5.1+cu124",
            "numpy": "1.26.4",
        },
        torch_requirements={"torchvision": "==2.5.1", "torchaudio": "==2.5.1"},
        cwd="/work",
    )


def healthy_cpu_facts() -> EnvFacts:
    return EnvFacts(
        torch=TorchProbe(
            ok=True,
            seconds=2.0,
            cpu_seconds=1.8,
            cpu_wait_seconds=0.1,
            blocked_seconds=0.1,
            version="2.13.0+cpu",
            num_threads=2,
            openmp_runtimes=["/site-packages/torch/lib/libgomp.so.1"],
            numpy_version="2.4.6",
            torch_file="/site-packages/torch/__init__.py",
        ),
        torch_dist_version="2.13.0+cpu",
        torch_dist_location="/site-packages/torch",
        nvidia=NvidiaFacts(unavailable_reason="no NVIDIA driver is installed"),
        system=SystemFacts(
            python="3.11.7",
            python_executable="/usr/bin/python3",
            cpu_logical=2,
            cpu_physical=2,
            cpu_affinity=2,
            memory_total=24 * GiB,
            memory_available=23 * GiB,
            disk_path="/work",
            disk_total=250 * GiB,
            disk_free=60 * GiB,
            shm_total=12 * GiB,
        ),
        packages={"torch": "2.13.0+cpu", "numpy": "2.4.6"},
        cwd="/work",
    )


def run_check(name: str, facts: EnvFacts):
    """The findings one env check makes on `facts`, completed like the CLI does."""
    return registry.run_fact_checks([registry.get(name)], registry.Scope.ENV, facts)
