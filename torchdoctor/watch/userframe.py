"""The user's line: the innermost frame of the user's own code, past torchdoctor, torch, the training
frameworks and any installed library or the standard library. Torch-free (checks import it at load)."""

from __future__ import annotations

import inspect
import os
import sys
import sysconfig
from types import FrameType
from typing import Any, Optional

# Top-level packages whose frames stand between the user's line and a hook, wherever they are installed.
NOT_USER_CODE = frozenset(
    {
        "torchdoctor",
        "torch",
        "lightning",
        "pytorch_lightning",
        "lightning_fabric",
        "accelerate",
        "transformers",
        "deepspeed",
        "ignite",
    }
)
_LIBRARY_ROOTS = tuple(
    sorted(
        {
            os.path.normcase(os.path.realpath(p)) + os.sep
            for p in (sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib"))
            if p
        }
    )
)
_is_library: dict[str, bool] = {}  # by file name


def is_library(frame: FrameType) -> bool:
    """A frame of torchdoctor, torch, a training framework, an installed package or the standard library."""
    if frame.f_globals.get("__name__", "").partition(".")[0] in NOT_USER_CODE:
        return True
    name = frame.f_code.co_filename
    known = _is_library.get(name)
    if known is None:
        path = os.path.normcase(os.path.realpath(name)) if not name.startswith("<") else ""
        known = _is_library[name] = (
            path.startswith(_LIBRARY_ROOTS)
            or "site-packages" in path.split(os.sep)
            or name.startswith("<eval_with_key>")  # a graph torch.fx generated (torch.compile's backend="eager")
        )
    return known


def user_frame(depth: int = 1) -> FrameType:
    """The innermost user frame above the caller's `depth`-th frame (else the outermost frame)."""
    frame = sys._getframe(depth + 1)
    while frame.f_back is not None and is_library(frame):
        frame = frame.f_back
    return frame


def user_line(depth: int = 1) -> tuple[str, int]:
    """(file, line) of `user_frame`."""
    frame = user_frame(depth + 1)
    return frame.f_code.co_filename, frame.f_lineno


def frame_variables(frame: FrameType, limit: int = 200) -> list[tuple[str, Any]]:
    """A frame's variables (at most `limit`), read once. A function's ``f_locals`` is a snapshot cached on
    its frame (Python < 3.13): left filled, it would keep the user's tensors alive after they ``del`` them,
    for as long as the function runs, so it is emptied again (the next read of f_locals or locals()
    rebuilds it); a module's or a class body's namespace is the real one and is left alone."""
    names = frame.f_locals
    variables = list(names.items())[:limit]
    if frame.f_code.co_flags & inspect.CO_OPTIMIZED:
        names.clear()
    return variables


def user_frames(start: Optional[FrameType] = None, limit: int = 8) -> list[FrameType]:
    """The user's frames from `start` (default: the innermost user frame of the caller) outwards."""
    frame: Optional[FrameType] = start or user_frame(1)
    found: list[FrameType] = []
    while frame is not None and len(found) < limit:
        if not is_library(frame):
            found.append(frame)
        frame = frame.f_back
    return found
