"""What every test of the performance checks shares."""

import pytest
import torch

from torchdoctor.watch import timing


@pytest.fixture(autouse=True)
def _one_thread():
    """Shares of timed steps on a shared 2-core machine are far steadier on one thread: waking a second OpenMP
    thread on a busy core can cost more than a small op."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def every_step(monkeypatch):
    """The clock times every step (a run times a sample of them, `timing.SAMPLE`)."""
    monkeypatch.setattr(timing, "SAMPLE", 1)
