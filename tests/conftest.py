"""Suite-wide ordering: tests that create a gloo process group inside the pytest process run last.

A gloo group leaves native threads and sockets behind in this process; forking DataLoader workers after
that is a known source of rare "terminate called ..." crashes in the child, so every test that forks
workers runs before them.
"""


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.get_closest_marker("gloo_in_process") is not None)
