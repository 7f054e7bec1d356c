"""Find files and folders that shadow torch, its companions, or the standard modules torch imports.

Python puts the script's folder (the working directory for ``python -c``/``-m``) and PYTHONPATH before
the standard library and site-packages, so a `random.py` or a `torch/` folder there wins the import.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path
from typing import Iterable, Mapping, Optional

from torchdoctor.env.facts import PathEntry

THIRD_PARTY = ("torch", "torchvision", "torchaudio", "numpy", "triton", "PIL", "scipy", "yaml", "tqdm")

# Standard-library modules that `import torch` (2.x) and numpy import, plus `pdb` (breakpoint()).
# Modules Python has already loaded before it reads sys.path (os, io, abc, site, ...) cannot be
# shadowed and are left out.
STDLIB_USED_BY_TORCH = frozenset(
    """
argparse array ast asyncio base64 binascii bisect bz2 calendar cmath collections concurrent
contextlib contextvars copy copyreg csv ctypes dataclasses datetime difflib dis email enum fcntl
fnmatch functools gettext glob grp gzip hashlib heapq http importlib inspect ipaddress json keyword
linecache locale logging lzma math mmap multiprocessing numbers opcode operator pathlib pdb pickle
pickletools pkgutil platform pprint queue quopri random re reprlib runpy select selectors shutil
signal socket ssl string struct subprocess tarfile tempfile textwrap threading timeit token tokenize
traceback types typing unittest urllib uuid warnings weakref zipfile zlib
""".split()
)


def module_at(folder: Path, name: str) -> Optional[Path]:
    """The module `name` would be imported from in `folder`, if it is there."""
    package = folder / name / "__init__.py"
    if package.is_file():
        return package.parent
    module = folder / f"{name}.py"
    if module.is_file():
        return module
    return None


def protected_dirs() -> set[str]:
    """Folders whose modules are the real ones: the standard library and site-packages."""
    paths = sysconfig.get_paths()
    dirs = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs |= {p for p in sys.path if p.endswith(("site-packages", "dist-packages", "lib-dynload"))}
    return {os.path.realpath(d) for d in dirs if d}


def search_dirs(cwd: str, environ: Optional[Mapping[str, str]] = None) -> list[tuple[str, str]]:
    """Where a user's `python script.py` run from `cwd` looks first, with why: the working directory,
    then the PYTHONPATH entries (empty entries mean the working directory too)."""
    environ = os.environ if environ is None else environ
    dirs = [(cwd, "the working directory")] + [
        (p or cwd, "PYTHONPATH") for p in environ.get("PYTHONPATH", "").split(os.pathsep)
    ]
    seen: dict[str, str] = {}
    for d, via in dirs:
        real = os.path.realpath(d)
        if d and real not in seen and os.path.isdir(real):
            seen[real] = via
    return list(seen.items())


def find_shadowing(
    dirs: Iterable[tuple[str, str]],
    installed: "dict[str, str | None]",
    names: Iterable[str] = THIRD_PARTY,
) -> list[PathEntry]:
    """Modules in `dirs` that hide an installed package (`installed`: name -> its real folder) or a
    standard module torch imports. `dirs` are (folder, why it is searched) pairs in search order; the
    first folder that has a name wins, as in Python's import."""
    protected = protected_dirs()
    found: list[PathEntry] = []
    wanted = [n for n in names if n in installed] + sorted(STDLIB_USED_BY_TORCH)
    claimed: set[str] = set()
    for folder, via in dirs:
        if os.path.realpath(folder) in protected:
            continue
        for name in wanted:
            if name in claimed:
                continue
            hit = module_at(Path(folder), name)
            if hit is None:
                continue
            claimed.add(name)
            real = installed.get(name)
            if real and os.path.realpath(hit) == os.path.realpath(real):
                continue  # an editable/develop install of that very package
            found.append(PathEntry(name=name, path=str(hit), origin_dir=folder, via=via))
    return found


def installed_modules(torch_location: Optional[str] = None) -> "dict[str, str | None]":
    """Where the real torch/numpy/... live (site-packages), so that an editable install of a package
    is not mistaken for a stray copy; torch is always watched, even when it is not installed."""
    sites = sorted(protected_dirs())
    found: dict[str, Optional[str]] = {"torch": torch_location}
    for name in THIRD_PARTY:
        if found.get(name):
            continue
        for site in sites:
            hit = module_at(Path(site), name)
            if hit is not None:
                found[name] = str(hit)
                break
    return found
