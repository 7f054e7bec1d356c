"""The one error type the checkpoint reader raises: the file cannot be read as a checkpoint at all."""

from __future__ import annotations


class CheckpointError(ValueError):
    """The file is missing, empty, of an unknown format, corrupt, or too hostile to read within limits.

    Its message is one line meant for the user (the CLI prints it and exits 2).
    """
