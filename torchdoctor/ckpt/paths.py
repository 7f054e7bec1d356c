"""What `check-ckpt` reads from the paths it is given: files as named, folders searched for checkpoint files."""

from __future__ import annotations

import os
from typing import Optional, Sequence, Union

from torchdoctor.ckpt.errors import CheckpointError

# The names checkpoints are saved under (torch.save, Lightning, transformers, safetensors, plain pickles);
# `model.pth.tar` ends in one of them too. Tar archives and other formats of a folder are left alone.
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".pkl", ".pickle", ".pth.tar")


def is_checkpoint_name(name: str) -> bool:
    """Whether a file found in a folder is named like a checkpoint."""
    return name.lower().endswith(CHECKPOINT_SUFFIXES)


def checkpoint_files(paths: Sequence[Union[str, "os.PathLike[str]"]]) -> list[tuple[str, Optional[str]]]:
    """The files to read: each file as named, and for each folder the checkpoint-named files under it
    (recursively, in sorted order, skipping hidden folders such as .git; symlinked folders are not followed),
    each with None, or with why it cannot be read (a subfolder that cannot be listed).

    Raises `CheckpointError` for a path that does not exist or a folder that holds no checkpoint file: a
    run that read nothing must not look like a clean one.
    """
    files: list[tuple[str, Optional[str]]] = []
    for path in (os.fspath(p) for p in paths):
        if os.path.isdir(path):
            found = _search(path)
            if not found:
                raise CheckpointError(
                    f"{path}: no checkpoint files in this folder "
                    f"(searched for {', '.join('*' + s for s in CHECKPOINT_SUFFIXES)})"
                )
            files += found
        elif os.path.lexists(path):
            files.append((path, _not_regular(path)))
        else:
            raise CheckpointError(f"{path}: no such file or folder")
    return list(dict(files).items())  # a file named twice (or found in two named folders) is read once


def _search(folder: str) -> list[tuple[str, Optional[str]]]:
    found: list[tuple[str, Optional[str]]] = []

    def unlisted(exc: OSError) -> None:  # a subfolder we cannot list may hold checkpoints: never skip it silently
        found.append((exc.filename or folder, f"cannot list the folder: {exc.strerror or exc}"))

    for root, dirs, names in os.walk(folder, onerror=unlisted):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [
            (path, _not_regular(path)) for path in (os.path.join(root, n) for n in names if is_checkpoint_name(n))
        ]
    return sorted(found, key=lambda item: os.path.normcase(item[0]).split(os.sep))


def _not_regular(path: str) -> Optional[str]:
    """Why `path` is not read as a file (a FIFO would block the read forever), or None for a regular file."""
    if os.path.isfile(path):
        return None
    if os.path.islink(path) and not os.path.exists(path):
        return f"a broken symbolic link (to {os.readlink(path)})"
    return "not a regular file (a named pipe, socket or device), not read"
