"""Classify the globals a pickle names: torch's weights_only allowlist, known benign, code-executing, unknown.

Allowlist first (torch/_weights_only_unpickler.py `_get_allowed_globals`, torch 2.13): those load with
`torch.load(weights_only=True)`. Everything else needs code to load; among those, a denylist of
modules and functions that run commands, evaluate code, import modules or touch files marks the
file as unsafe. "Not allowlisted" and "known dangerous" stay separate verdicts.
"""
from __future__ import annotations

import enum

from torchdoctor.ckpt.dtypes import STORAGE_DTYPES, is_dtype_name


class Verdict(str, enum.Enum):
    """How a global would be treated by a careful loader."""

    ALLOWED = "allowed"  # in torch's weights_only allowlist
    BENIGN = "benign"  # not allowlisted, but a well-known data class (numpy, argparse, torch.nn modules…)
    UNKNOWN = "unknown"  # user or third-party code: importing and calling it runs that code
    DANGEROUS = "dangerous"  # runs commands, evaluates code, imports modules, or touches files

    def __str__(self) -> str:
        return self.value


_ALLOWED = {
    "_codecs.encode", "builtins.bytearray", "builtins.complex", "builtins.set", "collections.Counter",
    "collections.OrderedDict", "torch.Size", "torch.Tensor", "torch.device", "torch.nn.parameter.Parameter",
    "torch._tensor._rebuild_from_type_v2", "torch.serialization._get_layout", "torch.storage.TypedStorage",
    "torch.storage.UntypedStorage", "torch.per_channel_affine", "torch.per_channel_affine_float_qparams",
    "torch.per_channel_symmetric", "torch.per_tensor_affine", "torch.per_tensor_symmetric",
    *(f"torch._utils._rebuild_{n}" for n in (
        "device_tensor_from_cpu_tensor", "device_tensor_from_numpy", "meta_tensor_no_storage", "nested_tensor",
        "parameter", "parameter_with_state", "qtensor", "sparse_tensor", "tensor", "tensor_v2", "tensor_v3",
        "wrapper_subclass")),
}
_TENSOR_TYPES = ("BFloat16", "Bool", "Byte", "Char", "Double", "Float", "Half", "Int", "Long", "Short")
_ALLOWED |= {f"torch.{t}Tensor" for t in _TENSOR_TYPES} | {f"torch.cuda.{t}Tensor" for t in _TENSOR_TYPES}
_ALLOWED |= {f"torch.sparse.{t}Tensor" for t in _TENSOR_TYPES if t != "Bool"}
_ALLOWED |= {f"torch.cuda.sparse.{t}Tensor" for t in _TENSOR_TYPES if t != "Bool"}
_ALLOWED |= {f"torch.{s}" for s in STORAGE_DTYPES if s not in ("UntypedStorage", "TypedStorage")}
_ALLOWED |= {f"torch.cuda.{s}" for s in STORAGE_DTYPES if not s.startswith("Q") and "Typed" not in s}

# Modules whose every name is dangerous to import-and-call from a pickle (prefix match on dotted module).
_DANGEROUS_MODULES = (
    "os", "posix", "nt", "subprocess", "sys", "socket", "runpy", "pty", "shutil", "webbrowser", "pickle",
    "_pickle", "cPickle", "dill", "cloudpickle", "joblib", "marshal", "importlib", "ctypes", "_ctypes", "code",
    "codeop", "cProfile", "profile", "pdb", "bdb", "pydoc", "timeit", "_aix_support", "multiprocessing",
    "asyncio", "_posixsubprocess", "distutils", "setuptools", "pkgutil", "types", "tempfile", "signal",
    "threading", "_thread", "requests", "urllib", "urllib3", "http", "httplib", "ftplib", "smtplib", "telnetlib",
    "xmlrpc", "ssl", "glob", "io", "_io", "fileinput", "zipimport", "imp", "site", "sysconfig", "platform",
    "venv", "ensurepip", "idlelib", "tkinter", "turtle", "sqlite3", "dbm", "shelve", "mailbox", "operator",
    "_operator", "uuid", "builtins.__import__", "inspect", "gc", "weakref", "atexit", "trace",
    "tracemalloc", "linecache", "zipfile", "tarfile", "lzma", "bz2", "gzip", "zlib", "mlflow", "torch.hub",
    "torch.utils.collect_env", "torch._inductor", "torch.fx", "torch.jit", "torch.package",
    "torch.multiprocessing", "torch.distributed.rpc", "numpy.testing", "numpy.f2py", "numpy.distutils",
    "pandas.io", "keras", "tensorflow", "pip", "IPython", "ipykernel", "pexpect", "paramiko", "sh",
)
# Individual functions that load nested pickles or evaluate code.
_DANGEROUS_NAMES = {
    "torch.load", "torch.serialization.load", "torch.serialization._load", "torch.serialization._legacy_load",
    "torch.storage._load_from_bytes", "torch._C._jit_script_compile", "numpy.load", "numpy.loads",
    "numpy.lib.npyio.load", "numpy.core.numeric.loads", "pandas.read_pickle", "pandas.read_csv", "pandas.eval",
    "numpy.__builtins__", "builtins.object.__reduce__",
}
# The only builtins a data pickle legitimately names; every other builtin (eval, exec, getattr, open,
# __import__, compile, globals, setattr, type, …) is dangerous.
_SAFE_BUILTINS = {
    "set", "frozenset", "list", "dict", "tuple", "bytearray", "bytes", "complex", "int", "float", "str", "bool",
    "slice", "range", "object", "Ellipsis", "NotImplemented",
}
_BENIGN_PREFIXES = (
    "collections.", "copyreg._reconstructor", "copyreg.__newobj__", "argparse.Namespace", "numpy.core.multiarray.",
    "numpy._core.multiarray.", "numpy.ndarray", "numpy.dtype", "numpy.dtypes.", "numpy.ma.core.", "datetime.",
    "decimal.Decimal", "fractions.Fraction", "pathlib.", "torch.nn.modules.", "torch.nn.parameter.",
    "torch.optim.", "torch.ao.", "torch.nn.utils.parametrize.", "torch.torch_version.", "torch._C._nn.",
    "torch.amp.grad_scaler.", "torch.cuda.amp.grad_scaler.", "__torch__.", "enum.", "re._compile",
    "torch.utils.data.sampler.", "omegaconf.", "typing.",
)
# Data classes inside otherwise dangerous modules (TorchScript archives' own helpers, namespaces).
_BENIGN_EXCEPTIONS = ("torch.jit._pickle.", "types.SimpleNamespace", "uuid.UUID")
_NUMPY_SCALARS = {
    f"numpy.{n}" for n in (
        "float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64",
        "bool_", "complex64", "complex128", "str_", "bytes_", "longlong", "ulonglong", "intc", "uintc")
}


def classify(qualname: str) -> Verdict:
    """The verdict for the dotted name `module.name` of a global."""
    module, _, name = qualname.rpartition(".")
    if qualname in _ALLOWED or (module == "torch" and is_dtype_name(name)):
        return Verdict.ALLOWED
    if qualname.startswith(_BENIGN_EXCEPTIONS):
        return Verdict.BENIGN
    if module == "builtins":
        return Verdict.BENIGN if name in _SAFE_BUILTINS else Verdict.DANGEROUS
    if qualname in _DANGEROUS_NAMES or _in_modules(qualname, _DANGEROUS_MODULES):
        return Verdict.DANGEROUS
    if "__builtins__" in qualname or (name.startswith("__") and name.endswith("__") and name != "__newobj__"):
        return Verdict.DANGEROUS  # dunder attributes (getattr chains, __globals__, __subclasses__)
    if qualname in _NUMPY_SCALARS or qualname.startswith(_BENIGN_PREFIXES):
        return Verdict.BENIGN
    return Verdict.UNKNOWN


def _in_modules(qualname: str, modules: tuple[str, ...]) -> bool:
    for m in modules:
        if qualname == m or qualname.startswith(m + "."):
            return True
    return False
