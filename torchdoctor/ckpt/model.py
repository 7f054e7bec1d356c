"""`--model SPEC`: import the user's model factory and record its state_dict keys, shapes and dtypes (imports torch)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from typing import Any, Iterator

from torchdoctor.ckpt.info import ModelKeys
from torchdoctor.isolation import SAVED_PYTHONPATH


class ModelSpecError(ValueError):
    """The --model spec cannot be resolved or does not produce an nn.Module (one-line message)."""


def model_keys(model: Any, spec: str = "") -> ModelKeys:
    """Keys -> (shape, dtype) of an nn.Module's state_dict()."""
    entries = {}
    for key, value in model.state_dict().items():
        shape = tuple(value.shape) if hasattr(value, "shape") else ()
        entries[key] = (shape, str(getattr(value, "dtype", "")).replace("torch.", ""))
    return ModelKeys(spec or type(model).__qualname__, entries)


def load_model(spec: str) -> Any:
    """Build the model named by `path/to/file.py:factory` or `package.module:factory` (a class or function)."""
    import torch

    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise ModelSpecError(f"--model {spec!r}: expected FILE.py:FACTORY or MODULE:FACTORY")
    module = _import(spec, target)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ModelSpecError(f"--model {spec!r}: {target} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ModelSpecError(f"--model {spec!r}: {attr} is not a class or function")
    try:
        model = obj() if not isinstance(obj, torch.nn.Module) else obj
    except Exception as exc:
        raise ModelSpecError(f"--model {spec!r}: calling {attr}() failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(model, torch.nn.Module):
        raise ModelSpecError(f"--model {spec!r}: {attr}() returned {type(model).__name__}, not a torch.nn.Module")
    return model


@contextlib.contextmanager
def _user_search_path() -> Iterator[None]:
    """Search the working directory and PYTHONPATH first while the user's module is imported, as `python`
    would for their own script: the command line took them off `sys.path` (`torchdoctor.isolation`) so that
    a `random.py` there could not break torchdoctor, but a model spec names exactly such a module."""
    pythonpath = os.environ.get("PYTHONPATH") or os.environ.get(SAVED_PYTHONPATH) or ""
    folders = [os.getcwd(), *(os.path.abspath(p or os.curdir) for p in pythonpath.split(os.pathsep) if pythonpath)]
    added = [f for f in dict.fromkeys(folders) if f not in sys.path and os.path.isdir(f)]
    sys.path[:0] = added
    try:
        yield
    finally:
        for folder in added:
            if folder in sys.path:
                sys.path.remove(folder)


def _import(spec: str, target: str) -> Any:
    try:
        if target.endswith(".py") or os.sep in target or "/" in target:
            if not os.path.isfile(target):
                raise ModelSpecError(f"--model {spec!r}: no such file {target}")
            name = "_torchdoctor_model_" + os.path.splitext(os.path.basename(target))[0]
            loader_spec = importlib.util.spec_from_file_location(name, target)
            if loader_spec is None or loader_spec.loader is None:
                raise ModelSpecError(f"--model {spec!r}: cannot import {target}")
            module = importlib.util.module_from_spec(loader_spec)
            folder = os.path.dirname(os.path.abspath(target))
            with _user_search_path():  # the file's folder first, as for `python file.py`, then PYTHONPATH
                sys.path.insert(0, folder)
                try:
                    sys.modules[name] = module
                    loader_spec.loader.exec_module(module)
                finally:
                    sys.path.remove(folder)
            return module
        with _user_search_path():
            return importlib.import_module(target)
    except ModelSpecError:
        raise
    except Exception as exc:
        raise ModelSpecError(f"--model {spec!r}: importing {target} failed: {type(exc).__name__}: {exc}") from None
