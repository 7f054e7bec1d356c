"""Lightning: ``Trainer(callbacks=[TorchDoctorCallback()])`` watches the whole fit and reports at its end.

Imports ``lightning`` (or the older ``pytorch_lightning``) when this module is imported; torchdoctor itself
does not depend on it.
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

from torchdoctor.watch.session import WatchSession, watch

try:
    _callbacks = importlib.import_module("lightning.pytorch.callbacks")
except ImportError:  # the standalone pytorch_lightning package
    _callbacks = importlib.import_module("pytorch_lightning.callbacks")
Callback: Any = _callbacks.Callback

__all__ = ["TorchDoctorCallback"]


class TorchDoctorCallback(Callback):
    """Starts a watch session on the LightningModule and the trainer's optimizers when fit starts, and
    stops it (printing the report on rank 0) when fit ends or raises. Keyword arguments go to
    `torchdoctor.watch` (``checks``, ``ignore``, ``every``, ``on_finding``, ...)."""

    def __init__(self, **watch_kwargs: Any) -> None:
        super().__init__()
        self.watch_kwargs = watch_kwargs
        self.session: Optional[WatchSession] = None

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.session = watch(pl_module, list(trainer.optimizers) or None, **self.watch_kwargs).start()

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.session is not None:
            self.session.stop()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.session is not None:
            self.session.stop(exception)
