"""Decide what a global a pickle names may do: an exact `(module, name)` allowlist, never a prefix.

Two exact sets decide "safe". `TORCH_ALLOWED` is torch's own `weights_only` allowlist
(torch/_weights_only_unpickler.py `_get_allowed_globals`, torch 2.13; a test keeps it in step with the
installed torch), plus what torch's own modules register with `add_safe_globals` on import (DTensor,
nested jagged tensors, device meshes). `DATA` is a short list of data types real checkpoints name
(measured on files from transformers, Lightning, accelerate, omegaconf, numpy, joblib, DTensor and DCP:
tests/ckpt/benign_corpus.py), harmless to construct, though torch's default loader still refuses them.
Everything else is judged by how the pickle uses it: a name with an attribute path (a dot in the name part), a known
code-running
name, or a standard-library/torch/numpy callable the pickle *calls* is dangerous; a class only created
through NEWOBJ, or third-party/user code, needs that code to load.
"""

from __future__ import annotations

import enum
import sys

from torchdoctor.ckpt.dtypes import STORAGE_DTYPES

Pair = tuple[str, str]


class Verdict(str, enum.Enum):
    """How a global would be treated by a careful loader."""

    ALLOWED = "allowed"  # in torch's weights_only allowlist
    BENIGN = "benign"  # a data type from the exact `DATA` list: needs code to load, runs nothing harmful
    UNKNOWN = "unknown"  # user or third-party code (or a library class only instantiated): loading runs it
    DANGEROUS = "dangerous"  # runs commands, evaluates code, imports modules, touches files, or is unvetted

    def __str__(self) -> str:
        return self.value


class Use(str, enum.Enum):
    """How a pickle uses a global: only names it, instantiates it with NEWOBJ, or calls it."""

    NAMED = "named"
    NEW = "new"  # NEWOBJ/NEWOBJ_EX, copyreg.__newobj__, copyreg._reconstructor(cls, object, …): cls.__new__ only
    CALLED = "called"  # REDUCE, INST, OBJ, or called by an allowlisted rebuild function it is passed to

    def __str__(self) -> str:
        return self.value


def _pairs(module: str, names: str) -> set[Pair]:
    return {(module, n) for n in names.split()}


_TENSOR_TYPES = "BFloat16 Bool Byte Char Double Float Half Int Long Short".split()
_QUANT = (
    "per_channel_affine per_channel_affine_float_qparams per_channel_symmetric per_tensor_affine per_tensor_symmetric"
)
_DTYPES = (
    "bfloat16 bits16 bits1x8 bits2x4 bits4x2 bits8 bool complex128 complex32 complex64 float16 float32 "
    "float4_e2m1fn_x2 float64 float8_e4m3fn float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz float8_e8m0fnu int16 int32 "
    "int64 int8 qint32 qint8 quint2x4 quint4x2 quint8 uint16 uint32 uint64 uint8 "
    + " ".join(f"int{i} uint{i}" for i in range(1, 8))
)
TORCH_ALLOWED: frozenset[Pair] = frozenset(
    {
        ("_codecs", "encode"),
        ("builtins", "bytearray"),
        ("builtins", "complex"),
        ("builtins", "set"),
        ("collections", "Counter"),
        ("collections", "OrderedDict"),
        ("torch.nn.parameter", "Parameter"),
        ("torch.serialization", "_get_layout"),
        ("torch._tensor", "_rebuild_from_type_v2"),
        ("torch.storage", "TypedStorage"),
        ("torch.storage", "UntypedStorage"),
    }
    | _pairs("torch", "Size Tensor device " + _QUANT + " " + _DTYPES)
    | _pairs(
        "torch._utils",
        " ".join(
            f"_rebuild_{n}"
            for n in (
                "device_tensor_from_cpu_tensor",
                "device_tensor_from_numpy",
                "meta_tensor_no_storage",
                "nested_tensor",
                "parameter",
                "parameter_with_state",
                "qtensor",
                "sparse_tensor",
                "tensor",
                "tensor_v2",
                "tensor_v3",
                "wrapper_subclass",
            )
        ),
    )
    | {("torch", f"{t}Tensor") for t in _TENSOR_TYPES}
    | {("torch.cuda", f"{t}Tensor") for t in _TENSOR_TYPES}
    | {("torch.sparse", f"{t}Tensor") for t in _TENSOR_TYPES if t != "Bool"}
    | {("torch.cuda.sparse", f"{t}Tensor") for t in _TENSOR_TYPES if t != "Bool"}
    | {("torch", s) for s in STORAGE_DTYPES if "Typed" not in s and s != "UntypedStorage"}
    | {
        ("torch.cuda", s)
        for s in STORAGE_DTYPES
        if not s.startswith("Q") and "Typed" not in s and s != "UntypedStorage"
    }
    # registered by torch's own modules with add_safe_globals when they are imported
    | _pairs("torch.distributed.tensor", "DTensor")
    | _pairs("torch.distributed.tensor._dtensor_spec", "DTensorSpec ShardOrderEntry TensorMeta")
    | _pairs("torch.distributed.tensor.placement_types", "Partial Replicate Shard _StridedShard")
    | _pairs("torch.distributed.device_mesh", "DeviceMesh")
    | _pairs("torch.distributed._mesh_layout", "_FlatLayout _MeshLayout")
    | _pairs("torch.nested._internal.nested_tensor", "NestedTensor _rebuild_njt")
    | _pairs("torch._dynamo.decorators", "_DimRange")
)

# Data types real checkpoints name that torch's default loader refuses; constructing them runs nothing
# harmful whatever their (inert) arguments. Measured: see tests/ckpt/test_policy.py and the benign corpus.
DATA: frozenset[Pair] = frozenset(
    _pairs("builtins", "bool bytes dict float frozenset int list object range slice str tuple")
    | _pairs("collections", "defaultdict deque namedtuple")  # namedtuple only builds a class from names
    | _pairs("copyreg", "_reconstructor __newobj__ __newobj_ex__")  # their arguments are checked as calls
    | _pairs("argparse", "Namespace")
    | _pairs("types", "SimpleNamespace")
    | _pairs("pathlib", "Path PosixPath WindowsPath PurePath PurePosixPath PureWindowsPath")
    | _pairs("datetime", "date datetime time timedelta timezone")
    | _pairs("decimal", "Decimal")
    | _pairs("fractions", "Fraction")
    | _pairs("uuid", "UUID SafeUUID")
    | _pairs("re", "_compile")
    | {(m, n) for m in ("numpy.core.multiarray", "numpy._core.multiarray") for n in ("_reconstruct", "scalar")}
    | {(m, "_frombuffer") for m in ("numpy.core.numeric", "numpy._core.numeric")}
    | _pairs(
        "numpy",
        "ndarray dtype bool_ float16 float32 float64 int8 int16 int32 int64 uint8 uint16 uint32 "
        "uint64 complex64 complex128 str_ bytes_ longlong ulonglong intc uintc",
    )
    | _pairs(
        "numpy.dtypes",
        " ".join(
            f"{t}DType"
            for t in (
                "Bool Int8 Int16 Int32 Int64 UInt8 UInt16 UInt32 UInt64 Float16 Float32 Float64 Complex64 Complex128 "
                "LongLong ULongLong Str Bytes Void Object DateTime64 TimeDelta64"
            ).split()
        ),
    )
    | _pairs("numpy.ma.core", "_mareconstruct MaskedArray")
    | _pairs("numpy.random._pickle", "__randomstate_ctor __bit_generator_ctor __generator_ctor")
    | _pairs("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence SeedSequence")
    | _pairs(
        "torch.jit._pickle",
        "build_boollist build_doublelist build_intlist build_tensorlist build_tensor_from_id restore_type_tag",
    )
    | _pairs(
        "torch",
        "layout memory_format strided sparse_coo sparse_csr _mkldnn contiguous_format "
        "channels_last channels_last_3d preserve_format",
    )
    | _pairs("torch.torch_version", "TorchVersion")
    # distributed-checkpoint metadata (.metadata is a plain pickle of these dataclasses and one enum by value)
    | _pairs(
        "torch.distributed.checkpoint.metadata",
        "Metadata MetadataIndex StorageMeta TensorProperties "
        "TensorStorageMetadata ChunkStorageMetadata BytesStorageMetadata _MEM_FORMAT_ENCODING",
    )
    | _pairs("torch.distributed.checkpoint.filesystem", "_StorageInfo")
    | _pairs("joblib.numpy_pickle", "NumpyArrayWrapper")  # joblib's array header; the bytes follow it raw
)

# Modules whose every name runs commands, evaluates code, imports modules or touches files (prefix match on
# the module, used only to explain a verdict the rules below already reach, and for names merely named).
_DANGEROUS_MODULES = (
    "os",
    "posix",
    "nt",
    "subprocess",
    "sys",
    "socket",
    "runpy",
    "pty",
    "shutil",
    "webbrowser",
    "pickle",
    "_pickle",
    "cPickle",
    "dill",
    "cloudpickle",
    "marshal",
    "importlib",
    "ctypes",
    "_ctypes",
    "code",
    "codeop",
    "cProfile",
    "profile",
    "pdb",
    "bdb",
    "pydoc",
    "timeit",
    "_aix_support",
    "_osx_support",
    "multiprocessing",
    "asyncio",
    "_posixsubprocess",
    "distutils",
    "setuptools",
    "pkgutil",
    "types",
    "tempfile",
    "signal",
    "threading",
    "_thread",
    "requests",
    "urllib",
    "urllib3",
    "http",
    "httplib",
    "ftplib",
    "smtplib",
    "imaplib",
    "poplib",
    "nntplib",
    "telnetlib",
    "xmlrpc",
    "ssl",
    "glob",
    "io",
    "_io",
    "fileinput",
    "zipimport",
    "imp",
    "site",
    "sysconfig",
    "platform",
    "venv",
    "ensurepip",
    "idlelib",
    "tkinter",
    "turtle",
    "sqlite3",
    "dbm",
    "shelve",
    "mailbox",
    "operator",
    "_operator",
    "uuid",
    "inspect",
    "gc",
    "weakref",
    "atexit",
    "trace",
    "tracemalloc",
    "linecache",
    "zipfile",
    "tarfile",
    "lzma",
    "bz2",
    "gzip",
    "zlib",
    "doctest",
    "lib2to3",
    "_pyrepl",
    "mlflow",
    "torch.hub",
    "torch.utils.collect_env",
    "torch.utils.bottleneck",
    "torch.utils._config_module",
    "torch._dynamo",
    "torch._inductor",
    "torch.fx",
    "torch.jit",
    "torch.package",
    "torch.multiprocessing",
    "torch.distributed.rpc",
    "torch.serialization",
    "numpy.testing",
    "numpy.f2py",
    "numpy.distutils",
    "pandas.io",
    "keras",
    "tensorflow",
    "pip",
    "IPython",
    "ipykernel",
    "pexpect",
    "paramiko",
    "sh",
    "aiohttp",
    "httpx",
)
# Individual names that load nested pickles or evaluate code.
_DANGEROUS_NAMES = {
    ("torch", "load"),
    ("torch", "save"),
    ("torch", "from_file"),
    ("torch.storage", "_load_from_bytes"),
    ("numpy", "load"),
    ("numpy", "loads"),
    ("numpy", "fromfile"),
    ("numpy", "save"),
    ("numpy.lib.npyio", "load"),
    ("numpy.core.numeric", "loads"),
    ("pandas", "read_pickle"),
    ("pandas", "read_csv"),
    ("pandas", "eval"),
    ("joblib", "load"),
}
# The only builtins a data pickle legitimately names; every other builtin (eval, exec, getattr, open,
# __import__, compile, globals, setattr, type, …) is dangerous.
_SAFE_BUILTINS = {n for m, n in DATA | TORCH_ALLOWED if m == "builtins"} | {"Ellipsis", "NotImplemented"}
# Top-level packages whose callables a pickle has no business calling unless allowlisted (the standard
# library is full of gadgets: imaplib, logging handlers, doctest, test.support, _osx_support, …).
VETTED_ROOTS = frozenset(sys.stdlib_module_names) | {
    "torch",
    "numpy",
    "test",
    "_pyrepl",
    "__hello__",
    "__phello__",
    "_sysconfigdata",
    "sre_compile",
    "sre_parse",
    "sre_constants",
    "imp",
    "asynchat",
    "asyncore",
    "distutils",
    "smtpd",
}  # what stdlib_module_names leaves out


def classify(module: str, name: str, use: Use = Use.NAMED) -> Verdict:
    """The verdict for global `module` + `name` (as the pickle writes them) used as `use`."""
    pair = (module, name)
    if pair in TORCH_ALLOWED:
        return Verdict.ALLOWED
    if pair in DATA:
        return Verdict.BENIGN
    if dangerous_reason(module, name, use):
        return Verdict.DANGEROUS
    return Verdict.UNKNOWN


def dangerous_reason(module: str, name: str, use: Use = Use.NAMED) -> str:
    """Why `module`.`name` used as `use` is dangerous ("" when it is not); exact allowlist first."""
    if (module, name) in TORCH_ALLOWED or (module, name) in DATA:
        return ""
    if "." in name:
        return "an attribute path (a dot in the name part) resolves to whatever object that path reaches"
    if module == "builtins" or module == "__builtin__":
        return "" if name in _SAFE_BUILTINS else "a builtin that evaluates code, imports, or reaches attributes"
    if (module, name) in _DANGEROUS_NAMES or any(module == m or module.startswith(m + ".") for m in _DANGEROUS_MODULES):
        return "runs commands, evaluates code, loads nested pickles, imports modules or touches files"
    if "__builtins__" in name or (name.startswith("__") and name.endswith("__")):
        return "a dunder attribute (reaches interpreter internals)"
    if use is Use.CALLED and module.split(".", 1)[0] in VETTED_ROOTS:
        return "a standard-library, torch or numpy callable outside the allowlist, called by the pickle"
    return ""
