"""env-var-misconfigured: a leftover debugging variable or a malformed setting that torch reads."""

from __future__ import annotations

import re
from typing import Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Pitfall, Severity
from torchdoctor.sdk.env import EnvFacts

from ._envutil import MACHINE_STATE

# The caching allocators' options (c10/core/AllocatorConfig.cpp, c10/cuda/CUDAAllocatorConfig.cpp; the generic
# ones checked against the strings in torch 2.13's libc10.so) and what each accepts; an unknown key or a bad
# value makes the first CUDA allocation raise.
_BOOL = re.compile(r"^(True|False|true|false)$")
ALLOC_OPTIONS = {
    "max_split_size_mb": re.compile(r"^\d+$"),
    "max_non_split_rounding_mb": re.compile(r"^\d+$"),
    "large_segment_size_mb": re.compile(r"^\d+$"),
    "pinned_max_cached_size_mb": re.compile(r"^\d+$"),
    "pinned_max_round_threshold_mb": re.compile(r"^\d+$"),
    "garbage_collection_threshold": re.compile(r"^0?\.\d+$"),
    "roundup_power2_divisions": re.compile(r"^(\d+|\[[\d:,>\s]*\])$"),
    "expandable_segments": _BOOL,
    "release_lock_on_cudamalloc": _BOOL,
    "pinned_use_cuda_host_register": _BOOL,
    "pinned_use_hip_host_register": _BOOL,
    "pinned_num_register_threads": re.compile(r"^\d+$"),
    "pinned_use_background_threads": _BOOL,
    "pinned_reserve_segment_size_mb": re.compile(r"^\d+$"),
    "graph_capture_record_stream_reuse": _BOOL,
    "per_process_memory_fraction": re.compile(r"^(0?\.\d+|1(\.0*)?)$"),
    "backend": re.compile(r"^(native|cudaMallocAsync)$"),
}
ALLOC_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

ENV_VAR_MISCONFIGURED = Pitfall(
    code="TD120",
    name="env-var-misconfigured",
    severity="warning",
    summary="A leftover debugging variable or a malformed setting that torch reads.",
    why="""
        Environment variables outlive the debugging session that set them, and torch reads several of them:

        - `CUDA_LAUNCH_BLOCKING=1` makes every CUDA kernel launch wait for the kernel to finish. It is the right
          tool to find the line behind an asynchronous CUDA error, and left in `~/.bashrc` or a job script it makes
          training several times slower with nothing saying why.
        - A malformed `PYTORCH_CUDA_ALLOC_CONF` (an unknown option, a typo, a bad value) makes the first CUDA
          allocation raise `RuntimeError: Unrecognized key 'expandable_segment' in Allocator Config` or
          `Expected a single True/False argument for expandable_segments`, far from where it was set.
        - A non-numeric `OMP_NUM_THREADS` (`OMP_NUM_THREADS=auto`, `=$(nproc)` unexpanded, an empty value) is
          ignored with `libgomp: Invalid value for environment variable OMP_NUM_THREADS`, so the thread count is
          not what was meant.
    """,
    fix="""
        ```console
        $ unset CUDA_LAUNCH_BLOCKING                   # and remove it from ~/.bashrc / the job script
        $ export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,max_split_size_mb:128
        $ export OMP_NUM_THREADS=8
        ```
    """,
    bad=Example(
        """
            $ export PYTORCH_CUDA_ALLOC_CONF=expandable_segment:true
            $ python train.py
            RuntimeError: Unrecognized key 'expandable_segment' in Allocator Config.
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    good=Example(
        """
            $ export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
            $ python train.py
        """,
        language="console",
        unseen={"env": MACHINE_STATE},
    ),
    details={
        "env": """
            From the environment `torchdoctor env` runs in: `CUDA_LAUNCH_BLOCKING` set to anything but `0` is a
            warning; `PYTORCH_CUDA_ALLOC_CONF`, `PYTORCH_ALLOC_CONF` and `PYTORCH_HIP_ALLOC_CONF` are parsed as
            torch does (comma-separated `key:value`) and an unknown key or a value of the wrong kind is an error;
            `OMP_NUM_THREADS`, `MKL_NUM_THREADS` and `OPENBLAS_NUM_THREADS` that are not positive integers (OpenMP's
            comma-separated nesting list like `4,2` is accepted) are a warning. Correct values are not reported.
        """,
    },
)


def alloc_conf_problem(value: str) -> Optional[str]:
    """What is wrong with an allocator config string (None when torch accepts it)."""
    for item in filter(None, (part.strip() for part in re.split(r",(?![^\[]*\])", value))):
        key, sep, val = item.partition(":")
        key, val = key.strip(), val.strip()
        if not sep:
            return f"'{item}' is not key:value"
        if key not in ALLOC_OPTIONS:
            close = [k for k in ALLOC_OPTIONS if k.startswith(key[:8])] if len(key) >= 8 else []
            return f"unknown option '{key}'" + (f" (did you mean {close[0]}?)" if close else "")
        if not ALLOC_OPTIONS[key].match(val):
            return f"'{val}' is not a valid value for {key}"
    return None


@ENV_VAR_MISCONFIGURED.env
def env_var_misconfigured(facts: EnvFacts) -> Iterator[Finding]:
    """CUDA_LAUNCH_BLOCKING left on, a malformed allocator config, non-numeric thread counts."""
    env = facts.env_vars
    if env.get("CUDA_LAUNCH_BLOCKING", "0").strip() not in ("", "0"):
        yield Finding(
            f"CUDA_LAUNCH_BLOCKING={env['CUDA_LAUNCH_BLOCKING']} is set: every CUDA kernel launch waits for the "
            "kernel to finish, which makes GPU training several times slower. It is a debugging switch.",
            fix=Fix(
                title="unset CUDA_LAUNCH_BLOCKING (and remove it from ~/.bashrc or the job script once the error "
                "it was "
                "set for is found)."
            ),
        )
    for name in ALLOC_VARS:
        if name in env and (problem := alloc_conf_problem(env[name])):
            yield Finding(
                f"{name}={env[name]} is malformed ({problem}): the first CUDA allocation raises "
                "'RuntimeError: Unrecognized key ... in Allocator Config' or a bad-value error.",
                fix=Fix(
                    title=f"Correct it, e.g. `export {name}=expandable_segments:True`, or unset {name}. Options: "
                    + ", ".join(ALLOC_OPTIONS)
                    + "."
                ),
                severity=Severity.ERROR,
            )
    for name in THREAD_VARS:
        value = env.get(name)
        if value is not None and not re.fullmatch(r"\s*[1-9]\d*(\s*,\s*[1-9]\d*)*\s*", value):
            yield Finding(
                f"{name}={value!r} is not a positive whole number: OpenMP/BLAS ignore it "
                f"('libgomp: Invalid value for environment variable {name}') and pick their own thread count.",
                fix=Fix(
                    title=f"export {name}=<threads per process> (e.g. usable CPUs / local processes), or unset {name}."
                ),
            )
