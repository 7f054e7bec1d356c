"""Performance checks judge shares of timed steps. A small model's ops on a shared 2-core machine are far steadier on
one thread (waking a second OpenMP thread on a busy core can cost more than the op), so these tests run on one."""
from typing import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
