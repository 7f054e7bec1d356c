"""A client for torch.distributed's TCPStore in plain Python, for a rank whose `import torch` failed or hung.

Such a rank cannot use torch's own client, yet rank 0 must hear from it (or torchrun ends the job before rank 0
prints the merged report). The wire format is TCPStore's (torch/csrc/distributed/c10d/TCPStoreBackend.hpp): one
query-type byte, then length-prefixed (uint64, little-endian) keys and values; keys get TCPStore's "/" prefix.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Optional

VALIDATE, SET, GET, CHECK, PING = 0, 1, 3, 5, 13  # QueryType
MAGIC = 0x3C85F7CE  # validationMagicNumber
READY = 0  # CheckResponseType


def _string(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


class StoreClient:
    """Connected to the store at `host:port` (retrying until `timeout`, as the store may not be up yet)."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock = socket.create_connection((host, port), timeout=max(0.5, deadline - time.monotonic()))
                break
            except OSError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)
        self.sock.sendall(bytes([VALIDATE]) + struct.pack("<I", MAGIC))
        self.sock.sendall(bytes([PING]) + struct.pack("<I", 7))
        if struct.unpack("<I", self._read(4))[0] != 7:
            raise OSError("the server at MASTER_ADDR:MASTER_PORT does not answer like a TCPStore")

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise OSError("the store closed the connection")
            data += chunk
        return data

    def set(self, key: str, value: bytes) -> None:
        self.sock.sendall(bytes([SET]) + _string(("/" + key).encode()) + _string(value))

    def check(self, key: str) -> bool:
        self.sock.sendall(bytes([CHECK]) + struct.pack("<Q", 1) + _string(("/" + key).encode()))
        return self._read(1)[0] == READY

    def get(self, key: str) -> bytes:
        self.sock.sendall(bytes([GET]) + _string(("/" + key).encode()))
        return self._read(struct.unpack("<Q", self._read(8))[0])

    def close(self) -> None:
        self.sock.close()


def connect(host: Optional[str], port: Optional[str], timeout: float) -> "tuple[Optional[StoreClient], str]":
    """A client, or None and why not."""
    try:
        return StoreClient(host or "127.0.0.1", int(port or ""), timeout), ""
    except (OSError, ValueError, struct.error) as exc:
        return None, f"{type(exc).__name__}: {exc}"
