"""Fixtures: fresh healthy fact sets for every test (see env_fixtures.py)."""

import pytest
from env_fixtures import healthy_cpu_facts, healthy_gpu_facts

from torchdoctor.env.facts import EnvFacts


@pytest.fixture
def gpu_facts() -> EnvFacts:
    return healthy_gpu_facts()


@pytest.fixture
def cpu_facts() -> EnvFacts:
    return healthy_cpu_facts()
