"""Running a runtime example leaves the process as it found it: switches an example flips are put back."""

import torch

from torchdoctor import registry
from torchdoctor.sdk import Example
from torchdoctor.sdk.testing import run_example


def _switches() -> tuple[bool, bool, bool]:
    cudnn = torch.backends.cudnn
    return cudnn.benchmark, cudnn.deterministic, torch.are_deterministic_algorithms_enabled()


def test_cudnn_and_determinism_switches_set_by_an_example_are_restored():
    flips = Example(
        """
        torch.backends.cudnn.benchmark = not torch.backends.cudnn.benchmark
        torch.backends.cudnn.deterministic = not torch.backends.cudnn.deterministic
        torch.use_deterministic_algorithms(not torch.are_deterministic_algorithms_enabled())
    """,
        setup="import torch\nmodel = torch.nn.Linear(2, 2)",
    )
    before = _switches()
    run_example(registry.get("missing-zero-grad"), flips, "runtime")
    assert _switches() == before
