"""Warning and exception types of the public API, torch-free so `import torchdoctor` stays light."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from torchdoctor.findings import Finding


class TorchDoctorWarning(UserWarning):
    """Issued once per new finding by `watch(..., on_finding="warn")`; filter it like any warning."""


class TorchDoctorError(RuntimeError):
    """Raised by `watch(..., on_finding="raise")` at the first error-severity finding."""

    def __init__(self, message: str, finding: "Optional[Finding]" = None) -> None:
        super().__init__(message)
        self.finding = finding
