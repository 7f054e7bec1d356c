"""Run the torch probe in a subprocess with a timeout, so a broken or hanging torch becomes a fact."""

from __future__ import annotations

import ast
import atexit
import dataclasses
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Optional

from torchdoctor.env.facts import TorchProbe

PROBE_SOURCE = Path(__file__).with_name("torch_probe.py")
MARKER = "@@torchdoctor-probe@@"
_FIELDS = {f.name for f in dataclasses.fields(TorchProbe)}
_EOF = None


# How long after its own deadline the parent still waits for a probe that should have ended itself (it dumps its
# stacks and exits when `import torch` runs past the timeout, counted from when it started running).
GRACE_S = 10.0


_FRAME = re.compile(r'^\s*File "(.*)", line (\d+) in (.*)$')


def hang_stack(stderr: list[str]) -> list[str]:
    """The main thread's stack from faulthandler's dump (after a timeout or a crash) ("file:line in function",
    innermost first),
    without the import machinery's frozen frames and the probe's own."""
    stack: list[str] = []
    in_main = False
    for line in stderr:
        if line.startswith(("Thread 0x", "Current thread 0x", "Stack (most recent call first)")):
            if stack:
                break  # faulthandler prints the current (main) thread first
            in_main = True
            continue
        m = _FRAME.match(line.rstrip("\n"))
        if in_main and m and not m.group(1).startswith(("<frozen", "<string>")):
            stack.append(f"{m.group(1)}:{m.group(2)} in {m.group(3)}")
    return stack


class RunningProbe:
    """A started probe. `result()` waits (up to the timeout) for its facts; under torchrun,
    `exchange()` then hands it this rank's payload and, on rank 0, returns every rank's."""

    def __init__(
        self,
        timeout: float,
        cwd: Optional[str] = None,
        exchange_timeout: Optional[float] = None,
        python: Optional[str] = None,
        env: Optional[dict[str, str]] = None,
    ) -> None:
        self.timeout = timeout
        self.exchange_timeout = exchange_timeout
        self.cwd = os.path.abspath(cwd or os.getcwd())
        self.started = time.monotonic()
        args = [python or sys.executable, "-c", PROBE_SOURCE.read_text(encoding="utf-8"), f"{timeout:g}"]
        if exchange_timeout is not None:
            args.append(str(exchange_timeout))
        # The user's environment (or the one given) exactly: what is diagnosed is how *their* `python` imports
        # torch. PYTHONFAULTHANDLER only makes a crash or a hang before the probe's own code (a sitecustomize)
        # print its stack.
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE if exchange_timeout is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            text=True,
            encoding="utf-8",
            errors="replace",
            env={**(os.environ if env is None else env), "PYTHONFAULTHANDLER": "1"},
        )
        self.unreachable: Optional[str] = None  # why the launcher's store could not be reached (torchrun)
        self._lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self._stderr: list[str] = []
        out, err = self.proc.stdout, self.proc.stderr
        assert out is not None and err is not None, "both were opened as pipes"
        self._out = threading.Thread(target=self._read_stdout, args=(out,), daemon=True)
        self._err = threading.Thread(target=self._stderr.extend, args=(err,), daemon=True)
        self._out.start()
        self._err.start()

    def _read_stdout(self, out: IO[str]) -> None:
        for line in out:
            self._lines.put(line)
        self._lines.put(_EOF)

    def _next_payload(self, deadline: float) -> "tuple[Optional[dict[str, Any]], bool]":
        """The next marker line's payload; (None, False) at end of output, (None, True) on timeout."""
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None, True
            if line is _EOF:
                return None, False
            if line.startswith(MARKER):
                try:
                    payload = ast.literal_eval(line[len(MARKER) :].strip())
                except (ValueError, SyntaxError):
                    continue
                if isinstance(payload, dict):
                    return payload, False

    def _stop(self, dump: bool = False) -> None:
        """End the probe; with `dump`, first ask it for its stacks (SIGABRT: faulthandler prints them)."""
        if self.proc.poll() is None and dump and hasattr(signal, "SIGABRT"):
            self.proc.send_signal(signal.SIGABRT)
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._err.join(timeout=2)

    def result(self) -> TorchProbe:
        """The torch facts, however the probe ended: finished, failed, or still hanging at the timeout."""
        deadline = base = self.started + self.timeout + GRACE_S
        payloads: list[dict[str, Any]] = []
        timed_out = False
        while True:
            payload, timed_out = self._next_payload(deadline)
            if payload is None or payload.get("kind") == "ready":
                break
            if payload.get("kind") == "armed":  # its own clock runs from here: a slow start is not the import's
                deadline = base = time.monotonic() + self.timeout + GRACE_S
            elif payload.get("kind") == "connecting":  # to the launcher's store: that wait is not the probe's time
                base, deadline = deadline, deadline + 3 * (self.exchange_timeout or 0) + 5
            elif payload.get("kind") == "rendezvous":
                deadline = base + float(payload.get("waited") or 0)
            elif payload.get("kind") == "unreachable":
                self.unreachable = f"the launcher's store at MASTER_ADDR:MASTER_PORT: {payload.get('error')}"
            else:
                payloads.append(payload)
        if timed_out or self.proc.stdin is None:
            if not timed_out and payload is None:  # it ended by itself: wait for the exit status that says how
                try:
                    self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            self._stop(dump=timed_out)  # after "ready" every fact is out: torch's teardown (~0.5 s) is not waited for
        elif payload is None:  # ended before "ready": it crashed, so there is nothing to exchange
            self._stop()
        probe = build_probe(payloads, self._stderr, timed_out, self.timeout, self.proc.returncode)
        if probe.timed_out and not probe.ok:  # the import itself never finished (a CUDA hang keeps its time)
            probe.seconds = time.monotonic() - self.started
        return probe

    def exchange(self, payload: dict[str, Any], timeout: float) -> Optional[dict[str, Any]]:
        """Send this rank's payload; on rank 0 return {"ranks": [...], "missing": [...], "doing": {...}};
        on another rank {"kind": "sent"} once its summary is in the store; None when it could not be shared."""
        if self.proc.poll() is not None or self.proc.stdin is None:
            return None
        try:
            self.proc.stdin.write(json.dumps(payload, default=str) + "\n")
            self.proc.stdin.close()
        except OSError:
            self._stop()
            return None
        answer = None
        deadline = time.monotonic() + timeout + 5
        while True:
            got, timed_out = self._next_payload(deadline)
            if got is None:
                break
            if got.get("kind") in ("ranks", "sent"):
                answer = got
                break

        self._stop()
        return answer


def build_probe(
    payloads: list[dict[str, Any]], stderr: list[str], timed_out: bool, timeout: float, returncode: Optional[int]
) -> TorchProbe:
    """Turn the probe's marker payloads (and stderr) into a `TorchProbe`, whatever state it died in."""
    probe = TorchProbe()
    got_build = False
    for payload in payloads:
        got_build |= payload.get("kind") == "build"
        for key, value in payload.items():
            if key in _FIELDS:
                setattr(probe, key, value)
    err_lines = [line.rstrip("\n") for line in stderr if line.strip()]
    dump = next((i for i, line in enumerate(err_lines) if line.startswith("Timeout (")), None)
    crash = next((i for i, line in enumerate(err_lines) if line.startswith("Fatal Python error: ")), None)
    if dump is not None:
        probe.hang_stack = hang_stack(err_lines[dump + 1 :])
        err_lines = err_lines[:dump]
        timed_out = True  # it dumped its stacks at its own deadline and ended itself
    elif crash is not None:
        stack = hang_stack(err_lines[crash + 1 :])
        if timed_out:  # the parent's SIGABRT at its deadline
            probe.hang_stack = stack
        else:
            probe.crash_stack = stack
        err_lines = err_lines[: crash + 1]
    if returncode is not None and returncode < 0:
        probe.exit_signal = -returncode
    probe.stderr_tail = [line for line in err_lines if '"<string>"' not in line][-12:]
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
        tail = " | ".join(probe.stderr_tail[-3:]) or "no output"
        probe.error = f"the Python process that imported torch exited with status {returncode}: {tail}"
    for dev in probe.cuda_devices:
        if isinstance(dev.get("capability"), list):
            dev["capability"] = tuple(dev["capability"])
    return probe


_EARLY: list[RunningProbe] = []


def start_early(args: list[str]) -> None:
    """For `torchdoctor env` on one machine: start the probe before the command line and its checks are
    imported (a fifth of a second), so that `import torch` is all `env` waits for. Ranks under a launcher
    and `--distributed` start theirs later, with the exchange; an unused probe is killed at exit."""
    if (
        args[:1] != ["env"]
        or "--distributed" in args
        or "-h" in args
        or "--help" in args
        or os.environ.get("TORCHELASTIC_RUN_ID")
    ):
        return
    timeout = 60.0
    for i, arg in enumerate(args):
        value = (
            arg.split("=", 1)[1]
            if arg.startswith("--timeout=")
            else args[i + 1]
            if arg == "--timeout" and i + 1 < len(args)
            else None
        )
        if value is not None:
            try:
                timeout = float(value)
            except ValueError:
                return  # click reports it
    _EARLY.append(RunningProbe(timeout))
    atexit.register(_kill_unused)


def adopt_early(timeout: float, cwd: str, exchange_timeout: Optional[float]) -> Optional[RunningProbe]:
    """The probe `start_early` started, if it was started for these settings."""
    if _EARLY and exchange_timeout is None and _EARLY[0].timeout == timeout and _EARLY[0].cwd == cwd:
        return _EARLY.pop()
    return None


def _kill_unused() -> None:
    for probe in _EARLY:
        probe._stop()
