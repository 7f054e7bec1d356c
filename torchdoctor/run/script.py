"""Run a script or module exactly as ``python SCRIPT ARGS`` / ``python -m MODULE ARGS`` would, in this process.

Same ``__main__`` (``runpy``), ``sys.argv``, ``sys.path[0]``, and the exit status Python would give: a
`SystemExit`'s code, 1 for an uncaught exception, the SIGINT death for ``KeyboardInterrupt``. The caller
decides when to print the traceback (`print_traceback`) so that a report can come first.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from dataclasses import dataclass, field
from types import TracebackType
from typing import Optional

_OUR_FILES = (
    "<frozen runpy>",
    os.path.dirname(runpy.__file__) + os.sep + "runpy.py",
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
)


@dataclass
class Target:
    """What to run: a script path (file, folder or zip with ``__main__.py``) or a module name, and its args."""

    path: Optional[str] = None
    module: Optional[str] = None
    args: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"-m {self.module}" if self.module else str(self.path)

    def problem(self) -> Optional[str]:
        """Why it cannot be run (one line, as Python says it), or None."""
        if self.module is not None:
            return None if self.module else "-m needs a module name"
        if self.path is None:
            return "no script given"
        if not os.path.exists(self.path):
            return f"can't open file {os.path.abspath(self.path)!r}: [Errno 2] No such file or directory"
        return None


@dataclass
class Outcome:
    """How the program ended: Python's exit status, and the uncaught exception (None on a normal exit or a
    `SystemExit`; a `KeyboardInterrupt` is kept, with status 130)."""

    status: int
    exception: Optional[BaseException] = None
    exit_message: Optional[str] = None  # what `sys.exit("text")` prints


def _user_search_path() -> None:
    """Put the PYTHONPATH folders back after ``sys.path[0]``, where Python puts them (the command line took
    them off its own search path: `torchdoctor.isolation`), and run their ``sitecustomize`` when Python
    would have run it at start-up and this process did not."""
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep) if os.environ.get("PYTHONPATH") else []
    folders = list(dict.fromkeys(os.path.abspath(p) if p else os.getcwd() for p in entries))
    sys.path[1:1] = [f for f in folders if f not in sys.path]
    custom = next(
        (os.path.join(f, "sitecustomize.py") for f in folders if os.path.isfile(os.path.join(f, "sitecustomize.py"))),
        None,
    )
    loaded = getattr(sys.modules.get("sitecustomize"), "__file__", None)
    if custom is None or (loaded is not None and os.path.realpath(loaded) == os.path.realpath(custom)):
        return
    import importlib.util

    spec = importlib.util.spec_from_file_location("sitecustomize", custom)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # as Python's site module says it, and goes on
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}", file=sys.stderr)


def run_target(target: Target) -> Outcome:
    """Run `target` as ``__main__`` with ``sys.argv`` and ``sys.path[0]`` set as Python sets them."""
    if target.module is not None:
        sys.argv = [target.module, *target.args]  # runpy replaces argv[0] with the module's file
        sys.path[0:1] = [os.getcwd()]
        run = lambda: runpy.run_module(target.module, run_name="__main__", alter_sys=True)  # noqa: E731
    else:
        assert target.path is not None
        sys.argv = [target.path, *target.args]
        where = os.path.abspath(target.path)
        sys.path[0:1] = [
            where if os.path.isdir(where) or not where.endswith(".py") and _is_zip(where) else os.path.dirname(where)
        ]
        run = lambda: runpy.run_path(target.path, run_name="__main__")  # type: ignore[arg-type]  # noqa: E731
    _user_search_path()
    try:
        run()
    except SystemExit as exc:
        return _exit_status(exc)
    except KeyboardInterrupt as exc:
        return Outcome(130, exc)
    except BaseException as exc:  # the program's own error: reported, then re-told as Python would
        return Outcome(1, exc)
    return Outcome(0)


def _is_zip(path: str) -> bool:
    import zipfile

    return zipfile.is_zipfile(path)


def _exit_status(exc: SystemExit) -> Outcome:
    """``sys.exit(code)`` as Python ends on it: None → 0, an int → itself, anything else printed and 1."""
    code = exc.code
    if code is None:
        return Outcome(0)
    if isinstance(code, int):
        return Outcome(code % 256)
    return Outcome(1, exit_message=str(code))


def user_traceback(exc: BaseException) -> Optional[TracebackType]:
    """The exception's traceback without the leading frames of runpy and torchdoctor."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_OUR_FILES):
        tb = tb.tb_next
    return tb or exc.__traceback__


def print_traceback(exc: BaseException) -> None:
    """Print the uncaught exception as Python would at exit (through ``sys.excepthook``, which a program
    may have replaced), starting at the program's own first frame."""
    exc = exc.with_traceback(user_traceback(exc))
    try:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    except Exception:
        traceback.print_exception(type(exc), exc, exc.__traceback__)
