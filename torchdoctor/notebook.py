"""Notebook awareness without importing IPython: which cell run (IPython's execution count) is under way.

`watch` says a problem once per cell run (a loop re-run in a later cell warns again, once); reports render
as notebook output through `Report._repr_mimebundle_`.
"""

from __future__ import annotations

import sys
from typing import Optional


def cell_run() -> Optional[int]:
    """The execution count of the IPython/Jupyter cell being run, or None outside IPython."""
    ipython = sys.modules.get("IPython")  # never imported here: if the user's process has no IPython, it is no notebook
    shell = ipython.get_ipython() if ipython is not None else None
    return int(shell.execution_count) if shell is not None else None
