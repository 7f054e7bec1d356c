"""Real Lightning, transformers and accelerate loops (the `integrations` extra). Where a library is missing
its tests skip, unless torchdoctor's `test` extra declares it: then a skip would hide a failure, and the
import error fails the run (`frameworks.need`)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread_and_seeded():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)
