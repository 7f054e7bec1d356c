"""Launching a worker script as two real ranks on 127.0.0.1, shared by the multi-process tests."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_ranks(worker: Path, env: dict[str, str], timeout: float) -> list[str]:
    """Run `worker` as ranks 0 and 1 (RANK set, `env` otherwise); their output. A rank that hangs past
    `timeout` seconds, or fails, fails the test with both ranks' output."""
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker)],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a rank hung: " + "\n".join(q.communicate()[0][-2000:] for q in procs))
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    return logs
