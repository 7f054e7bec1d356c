"""torchdoctor: finds the mistakes PyTorch users make again and again, says where, and how to fix them.

Importing this package does not import torch; the front doors that need it import it lazily.
"""

from __future__ import annotations

import os as _os

from torchdoctor.isolation import checkout_root, isolate_cli

if checkout_root(_os.path.dirname(__file__)):  # a source checkout: torchdoctor.checks is checks/ beside us
    __path__.append(checkout_root(_os.path.dirname(__file__)))
isolate_cli()  # the command line re-executes itself away from a `random.py` in the user's folders

from typing import Any  # noqa: E402

__version__ = "0.1.0"

from torchdoctor.errors import TorchDoctorError, TorchDoctorWarning  # noqa: E402
from torchdoctor.findings import Finding, Fix, Location, Severity  # noqa: E402
from torchdoctor.pitfall import Example, Pitfall, Scope  # noqa: E402

_LAZY = {
    "diagnose_env": "torchdoctor.env.doctor",
    "check_checkpoint": "torchdoctor.ckpt.api",
    "watch": "torchdoctor.watch",
}

__all__ = [
    "Finding",
    "Fix",
    "Location",
    "Severity",
    "TorchDoctorError",
    "TorchDoctorWarning",
    "Scope",
    "Pitfall",
    "Example",
    "__version__",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    """Import the heavier front doors only when they are used."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'torchdoctor' has no attribute {name!r}")
