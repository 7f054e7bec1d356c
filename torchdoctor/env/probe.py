"""Run the torch probe in a subprocess with a timeout, so a broken or hanging torch becomes a fact."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from torchdoctor.env.facts import TorchProbe

PROBE_SOURCE = Path(__file__).with_name("torch_probe.py")
MARKER = "@@torchdoctor-probe@@"
_FIELDS = {f.name for f in dataclasses.fields(TorchProbe)}


class RunningProbe:
    """A started probe; `result()` waits for it (up to the timeout) and parses what it printed."""

    def __init__(self, timeout: float, cwd: Optional[str] = None, python: str = sys.executable) -> None:
        self.timeout = timeout
        self.started = time.perf_counter()
        env = dict(os.environ)
        env.setdefault("PYTHONIOENCODING", "utf-8")
        self.proc = subprocess.Popen(
            [python, "-c", PROBE_SOURCE.read_text(encoding="utf-8")],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=cwd, env=env, text=True, errors="replace",
        )

    def result(self) -> TorchProbe:
        remaining = max(0.1, self.timeout - (time.perf_counter() - self.started))
        timed_out = False
        try:
            out, err = self.proc.communicate(timeout=remaining)
        except subprocess.TimeoutExpired:
            timed_out = True
            self.proc.kill()
            out, err = self.proc.communicate()
        return parse_probe_output(out, err, timed_out, self.timeout, self.proc.returncode)


def parse_probe_output(out: str, err: str, timed_out: bool, timeout: float, returncode: Optional[int]) -> TorchProbe:
    """Turn the probe's marker lines (and stderr) into a `TorchProbe`, whatever state it died in."""
    probe = TorchProbe()
    got_build = False
    for line in out.splitlines():
        if not line.startswith(MARKER):
            continue
        try:
            payload = json.loads(line[len(MARKER):])
        except ValueError:
            continue
        got_build |= payload.get("kind") == "build"
        for key, value in payload.items():
            if key in _FIELDS:
                setattr(probe, key, value)
    err_lines = [l for l in err.splitlines() if l.strip()]
    probe.stderr_tail = err_lines[-12:]
    if timed_out:
        probe.timed_out = True
        if not got_build:
            probe.ok = False
            probe.error_type = "Timeout"
            probe.error = f"`import torch` did not finish within {timeout:g} s"
        elif probe.ok and probe.cuda_error is None and probe.cuda_available is None:
            probe.cuda_error = f"CUDA initialisation did not finish within {timeout:g} s"
    elif not got_build:
        probe.ok = False
        probe.error_type = "ProbeFailed"
        tail = " | ".join(err_lines[-3:]) or "no output"
        probe.error = f"the probe exited with status {returncode}: {tail}"
    if probe.cuda_devices:
        for dev in probe.cuda_devices:
            if isinstance(dev.get("capability"), list):
                dev["capability"] = tuple(dev["capability"])
    return probe
