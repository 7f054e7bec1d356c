"""`--model SPEC`: import the user's model factory and record its state_dict keys, shapes and dtypes (imports torch)."""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

from torchdoctor.ckpt.info import ModelKeys


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
            sys.path.insert(0, folder)
            try:
                sys.modules[name] = module
                loader_spec.loader.exec_module(module)
            finally:
                sys.path.remove(folder)
            return module
        return importlib.import_module(target)
    except ModelSpecError:
        raise
    except Exception as exc:
        raise ModelSpecError(f"--model {spec!r}: importing {target} failed: {type(exc).__name__}: {exc}") from None
