"""The check SDK: the one public import surface for built-in and third-party pitfalls.

A pitfall module imports only from ``torchdoctor.sdk`` and its door modules — everything else in
torchdoctor is private and may change between releases:

- ``torchdoctor.sdk``: `Pitfall`, `Example`, `Scope`, `Finding`, `Fix`, `Location`, `Severity` and formatting helpers;
- ``torchdoctor.sdk.env``: the facts an environment detector receives;
- ``torchdoctor.sdk.checkpoint``: the structure a checkpoint detector receives, and state-dict key services;
- ``torchdoctor.sdk.runtime``: `RuntimeCheck`, watch events and runtime services (graphs, hooks, ranks);
- ``torchdoctor.sdk.source``: the parsed file a lint detector receives, and its program-model queries;
- ``torchdoctor.sdk.testing``: run a pitfall's examples through its detectors (the contract test).

Importing ``torchdoctor.sdk`` (or ``.env``, ``.checkpoint``, ``.source``) never imports torch, so listing
checks stays fast; the torch-backed runtime services load on first use.
"""

from torchdoctor.findings import Finding, Fix, Location, Severity
from torchdoctor.pitfall import Example, Pitfall, PitfallError, Scope
from torchdoctor.units import byte_size
from torchdoctor.wrappers import WRAPPER_PREFIXES

__all__ = [
    "Example",
    "Finding",
    "Fix",
    "Location",
    "Pitfall",
    "PitfallError",
    "Scope",
    "Severity",
    "WRAPPER_PREFIXES",
    "byte_size",
]
