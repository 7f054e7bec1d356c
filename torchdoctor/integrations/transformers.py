"""transformers: ``Trainer(..., callbacks=[TorchDoctorCallback()])`` watches ``trainer.train()`` and reports
at its end.

Imports ``transformers`` when this module is imported; torchdoctor itself does not depend on it.
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

from torchdoctor.watch.session import WatchSession, watch

# looked up by name: mypy then needs neither transformers nor its types, installed or not
TrainerCallback: Any = importlib.import_module("transformers").TrainerCallback

__all__ = ["TorchDoctorCallback"]


class TorchDoctorCallback(TrainerCallback):
    """Starts a watch session on the model and optimizer the Trainer hands its callbacks when training
    begins (the optimizer as accelerate wraps it), and stops it, printing the report, when training ends.
    Keyword arguments go to `torchdoctor.watch` (``checks``, ``ignore``, ``every``, ``on_finding``, ...).
    The Trainer has no callback for a raised exception: after one, call ``callback.session.stop()``."""

    def __init__(self, **watch_kwargs: Any) -> None:
        self.watch_kwargs = watch_kwargs
        self.session: Optional[WatchSession] = None

    def on_train_begin(
        self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None, **kwargs: Any
    ) -> None:
        if self.session is not None and self.session.active:  # train() called again after a failed run
            self.session.stop()
        self.session = watch(model, optimizer, **self.watch_kwargs).start()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.session is not None:
            self.session.stop()
