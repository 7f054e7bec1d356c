"""The allowlist policy: exact (module, name) pairs, in step with the installed torch; verdicts by use."""

from __future__ import annotations

import pytest
import torch

from torchdoctor.ckpt.policy import DATA, TORCH_ALLOWED, Use, Verdict, classify


def test_torch_allowlist_is_exactly_the_installed_torchs():
    """Our copy of torch/_weights_only_unpickler.py `_get_allowed_globals` (2.13) matches the installed torch."""
    from torch import _weights_only_unpickler as w

    theirs = {tuple(k.rsplit(".", 1)) for k in w._get_allowed_globals()}
    import torch._dynamo  # noqa: F401
    import torch.distributed.tensor  # noqa: F401  (registers DTensor's types, as a DTensor program does)
    import torch.nested  # noqa: F401

    registered = {(f.__module__, f.__qualname__) for f in w._get_safe_globals() if not isinstance(f, tuple)}
    assert TORCH_ALLOWED == theirs | registered


def test_data_names_resolve_to_real_objects_and_are_not_torch_allowed():
    """Every exact DATA pair names something that exists (no typo can silently allow an attribute path)."""
    import importlib

    missing = []
    for module, name in sorted(DATA):
        try:
            obj = importlib.import_module(module)
        except ImportError:
            continue  # an optional library (joblib) that is not installed here
        if not hasattr(obj, name) and not (module.startswith("numpy.core") or module == "numpy.dtypes"):
            missing.append(f"{module}.{name}")
    assert missing == []
    assert not DATA & TORCH_ALLOWED


@pytest.mark.parametrize(
    "module, name, use, verdict",
    [
        ("collections", "OrderedDict", Use.CALLED, Verdict.ALLOWED),
        ("torch._utils", "_rebuild_tensor_v2", Use.CALLED, Verdict.ALLOWED),
        ("torch", "float8_e4m3fn", Use.NAMED, Verdict.ALLOWED),
        ("torch.distributed.tensor", "DTensor", Use.NEW, Verdict.ALLOWED),
        ("argparse", "Namespace", Use.NEW, Verdict.BENIGN),
        ("numpy._core.multiarray", "_reconstruct", Use.CALLED, Verdict.BENIGN),
        ("__main__", "Net", Use.NEW, Verdict.UNKNOWN),
        ("transformers.trainer_utils", "IntervalStrategy", Use.CALLED, Verdict.UNKNOWN),  # third party: a warning
        ("torch.nn.modules.linear", "Linear", Use.NEW, Verdict.UNKNOWN),  # torch.save(model): needs code
        ("logging", "FileHandler", Use.NEW, Verdict.UNKNOWN),
        # attribute paths are never a benign prefix
        ("pathlib", "os.system", Use.NAMED, Verdict.DANGEROUS),
        ("enum", "bltns.exec", Use.CALLED, Verdict.DANGEROUS),
        ("torch.nn.modules.module", "torch.save", Use.CALLED, Verdict.DANGEROUS),
        ("torch.utils.data.sampler", "torch.serialization.os.system", Use.CALLED, Verdict.DANGEROUS),
        ("numpy.ma.core", "builtins.eval", Use.CALLED, Verdict.DANGEROUS),
        ("torch._dynamo.guards", "GuardBuilder.get", Use.CALLED, Verdict.DANGEROUS),
        # called stdlib/torch/numpy names outside the allowlist
        ("imaplib", "IMAP4_stream", Use.CALLED, Verdict.DANGEROUS),
        ("logging", "FileHandler", Use.CALLED, Verdict.DANGEROUS),
        ("doctest", "debug_script", Use.CALLED, Verdict.DANGEROUS),
        ("_osx_support", "_read_output", Use.CALLED, Verdict.DANGEROUS),
        ("test.support.script_helper", "assert_python_ok", Use.CALLED, Verdict.DANGEROUS),
        ("torch.nn.modules.linear", "Linear", Use.CALLED, Verdict.DANGEROUS),
        ("numpy", "fromstring", Use.CALLED, Verdict.DANGEROUS),
        # named only, still dangerous by themselves
        ("posix", "system", Use.NAMED, Verdict.DANGEROUS),
        ("builtins", "getattr", Use.NAMED, Verdict.DANGEROUS),
        ("torch", "load", Use.NAMED, Verdict.DANGEROUS),
        ("mypkg.x", "__globals__", Use.NAMED, Verdict.DANGEROUS),
    ],
)
def test_verdicts_compare_the_exact_pair_and_how_it_is_used(module, name, use, verdict):
    assert classify(module, name, use) is verdict


def test_builtins_torch_refuses_are_never_allowed():
    assert torch is not None
    for name in ("eval", "exec", "getattr", "setattr", "open", "__import__", "compile", "globals", "type", "vars"):
        assert classify("builtins", name, Use.NAMED) is Verdict.DANGEROUS, name
