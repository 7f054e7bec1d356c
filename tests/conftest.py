"""Suite-wide set-up.

Ordering: tests that create a gloo process group inside the pytest process run last. A gloo group leaves
native threads and sockets behind in this process; forking DataLoader workers after that is a known
source of rare "terminate called ..." crashes in the child, so every test that forks workers runs before them.

Isolation: every test gets its own lint results cache, so no test reads another's results or the user's,
and no TORCHDOCTOR_SELECT/_IGNORE/_FAIL_ON setting of the user's shell reaches a test.
"""

import pytest

from torchdoctor.settings import ENV_FAIL_ON, ENV_IGNORE, ENV_SELECT


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.get_closest_marker("gloo_in_process") is not None)


@pytest.fixture(autouse=True)
def _private_cache_and_settings(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TORCHDOCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("lint-cache")))
    for name in (ENV_SELECT, ENV_IGNORE, ENV_FAIL_ON):
        monkeypatch.delenv(name, raising=False)
