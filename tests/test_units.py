"""One byte-size format for every message and report."""

import pytest

from torchdoctor.units import byte_size


@pytest.mark.parametrize(
    "n, text",
    [
        (None, "?"),
        (0, "0 bytes"),
        (1, "1 byte"),
        (1023, "1,023 bytes"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (64 << 20, "64 MiB"),
        (int(3.25 * (1 << 30)), "3.2 GiB"),
        (1023.99 * 1024, "1 MiB"),
        (5 << 40, "5 TiB"),
        (2000 << 40, "2,000 TiB"),
        (-1536, "-1.5 KiB"),
    ],
)
def test_byte_size(n, text):
    assert byte_size(n) == text
