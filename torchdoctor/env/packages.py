"""Installed-package facts read from package metadata, never by importing the packages."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Optional
from urllib.parse import unquote, urlparse

from packaging.markers import InvalidMarker, Marker, UndefinedEnvironmentName
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from torchdoctor.env.facts import UnmetRequirement

# Packages whose versions matter when torch misbehaves; shown in the report when installed.
COMPANIONS = (
    "torch",
    "torchvision",
    "torchaudio",
    "torchtext",
    "torchdata",
    "triton",
    "pytorch-triton",
    "numpy",
    "xformers",
    "flash-attn",
    "lightning",
    "pytorch-lightning",
    "accelerate",
    "transformers",
    "deepspeed",
    "apex",
    "nvidia-ml-py",
    "pynvml",
    "nvidia-cudnn-cu12",
    "nvidia-cudnn-cu13",
    "nvidia-cublas-cu12",
    "nvidia-cublas",
    "nvidia-nccl-cu12",
    "nvidia-nccl-cu13",
    "nvidia-cuda-runtime-cu12",
    "nvidia-cuda-runtime",
)
# collect_env's "Versions of relevant libraries" name patterns, plus torch's usual companions.
RELEVANT = re.compile(
    r"torch|numpy|mypy|flake8|triton|optree|onnx|nccl|cudnn|cublas|cuda|xformers|flash|"
    r"lightning|transformers|accelerate|deepspeed|apex|nvidia|mkl|intel-openmp|magma"
)
_CUDA_LINE = re.compile(r"^cuda\s*(?::[^=]*)?=\s*(?:'([^']*)'|\"([^\"]*)\"|None)", re.M)


@dataclass
class PackageFacts:
    versions: dict[str, str] = field(default_factory=dict)
    torch_requirements: dict[str, str] = field(default_factory=dict)
    numpy_requirements: dict[str, str] = field(default_factory=dict)
    unmet: list[UnmetRequirement] = field(default_factory=list)
    torch_location: Optional[str] = None
    torch_cuda: Optional[str] = None
    torch_editable: Optional[str] = None  # an editable install's source folder
    torch_files_missing: bool = False  # the torch distribution is installed, its torch/__init__.py is not there
    torch_requires: dict[str, str] = field(default_factory=dict)  # torch's own requirements: name -> specifier


_NAME = re.compile(r"^Name:\s*(\S+)", re.M)
_VERSION = re.compile(r"^Version:\s*(\S+)", re.M)
_REQUIRES = re.compile(r"^Requires-Dist:\s*(.*)$", re.M)


_REQ_LINE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*)$")


def _requirements(header: str) -> list[tuple[str, str]]:
    """The distribution's requirements that apply here, as (canonical name, specifier): optional extras are
    skipped, as pip check does. Parsed with packaging's specifier and marker classes only where a line has
    them (its full requirement parser costs a tenth of a second over a typical environment)."""
    out = []
    for line in _REQUIRES.findall(header):
        if "extra" in line and re.search(r"\bextra\s*==", line):
            continue
        m = _REQ_LINE.match(line)
        if m is None:
            continue
        spec, _, marker = m.group(2).partition(";")
        spec = spec.strip().strip("()").strip()
        if spec.startswith("@"):
            continue  # a direct URL: no version to compare
        try:
            if marker.strip() and not Marker(marker.strip()).evaluate({"extra": ""}):
                continue
            if spec:
                SpecifierSet(spec)  # a malformed specifier is skipped, as it cannot be compared
        except (InvalidMarker, InvalidSpecifier, UndefinedEnvironmentName, ValueError):
            continue
        out.append((str(canonicalize_name(m.group(1))), spec))
    return out


def _satisfied(spec: str, version: str) -> bool:
    try:
        return SpecifierSet(spec).contains(
            Version(version).base_version if "+" in version else version, prereleases=True
        )
    except (InvalidVersion, InvalidSpecifier):
        return True  # a version pip could not compare either is not reported


def read_torch_cuda(version_py: Path) -> Optional[str]:
    """`torch.version.cuda` read as text from torch/version.py (nothing executed)."""
    try:
        m = _CUDA_LINE.search(version_py.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None
    return (m.group(1) or m.group(2)) if m else None


def editable_source(dist: metadata.Distribution) -> Optional[str]:
    """The source folder of an editable install (PEP 610 `direct_url.json`: `dir_info.editable`), else None."""
    try:
        info = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        return None
    url = info.get("url", "") if isinstance(info, dict) else ""
    if not (isinstance(info.get("dir_info"), dict) and info["dir_info"].get("editable")) or not url.startswith(
        "file://"
    ):
        return None
    return unquote(urlparse(url).path)


def collect_packages(path: Optional[list[str]] = None) -> PackageFacts:
    """One pass over installed distributions (their METADATA read as text, never imported): companion
    versions, every torch and numpy requirement, and, like `pip check`, every other declared requirement
    that the installed packages do not meet. `path`: another interpreter's sys.path (default: this one's)."""
    facts = PackageFacts()
    seen: set[str] = set()
    installed: dict[str, str] = {}
    declared: list[tuple[str, str, str, str]] = []
    for dist in metadata.distributions(path=path) if path is not None else metadata.distributions():
        # the headers end at the first blank line; the long description after it is never read
        text = (dist.read_text("METADATA") or dist.read_text("PKG-INFO") or "").partition("\n\n")[0]
        m = _NAME.search(text)
        name = canonicalize_name(m.group(1)) if m else ""
        if not name or name in seen:
            continue  # the first one on sys.path wins, as it does for imports
        seen.add(name)
        v = _VERSION.search(text)
        installed[name] = v.group(1) if v else dist.version
        if name in COMPANIONS or RELEVANT.search(name):
            facts.versions[name] = installed[name]
        for target, spec in _requirements(text):
            if target == "torch" and name != "torch" and spec:
                facts.torch_requirements[name] = str(SpecifierSet(spec))
            elif target == "numpy" and spec:
                facts.numpy_requirements[name] = str(SpecifierSet(spec))
            elif target not in ("torch", "numpy"):
                declared.append((name, installed[name], target, spec))
        if name == "torch":
            facts.torch_editable = editable_source(dist)
            facts.torch_requires = {target: spec for target, spec in _requirements(text)}
            init = Path(str(dist.locate_file("torch/__init__.py")))
            if init.is_file():
                facts.torch_location = str(init.parent)
                facts.torch_cuda = read_torch_cuda(init.parent / "version.py")
            else:
                facts.torch_files_missing = (
                    facts.torch_editable is None or not (Path(facts.torch_editable) / "torch" / "__init__.py").is_file()
                )
    for name, version, target, spec in declared:
        have = installed.get(target)
        if have is None or (spec and not _satisfied(spec, have)):
            facts.unmet.append(UnmetRequirement(name, version, target + str(SpecifierSet(spec)), have))
    return facts
