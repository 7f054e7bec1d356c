"""Installed-package facts read from package metadata, never by importing the packages."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Optional

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

# Packages whose versions matter when torch misbehaves; shown in the report when installed.
COMPANIONS = (
    "torch", "torchvision", "torchaudio", "torchtext", "torchdata", "triton", "pytorch-triton",
    "numpy", "xformers", "flash-attn", "lightning", "pytorch-lightning", "accelerate",
    "transformers", "deepspeed", "apex", "nvidia-ml-py", "pynvml", "nvidia-cudnn-cu12",
    "nvidia-cudnn-cu13", "nvidia-cublas-cu12", "nvidia-cublas", "nvidia-nccl-cu12", "nvidia-nccl-cu13",
    "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime",
)
_CUDA_LINE = re.compile(r"^cuda\s*(?::[^=]*)?=\s*(?:'([^']*)'|\"([^\"]*)\"|None)", re.M)


@dataclass
class PackageFacts:
    versions: dict[str, str] = field(default_factory=dict)
    torch_requirements: dict[str, str] = field(default_factory=dict)
    numpy1_only: list[str] = field(default_factory=list)
    torch_location: Optional[str] = None
    torch_cuda: Optional[str] = None


_NAME = re.compile(r"^Name:\s*(\S+)", re.M)
_VERSION = re.compile(r"^Version:\s*(\S+)", re.M)
# Only the requirements on torch and numpy matter; the rest of the metadata is never parsed.
_REQUIRES = re.compile(r"^Requires-Dist:\s*((?:torch|numpy)\b.*)$", re.M | re.I)


def _applies(req: Requirement) -> bool:
    return req.marker is None or req.marker.evaluate({"extra": ""})


def _requirements(metadata_text: str) -> list[Requirement]:
    out = []
    for line in _REQUIRES.findall(metadata_text):
        try:
            req = Requirement(line.strip())
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) in ("torch", "numpy") and _applies(req):
            out.append(req)
    return out


def _numpy_below_2(req: Requirement) -> bool:
    return bool(req.specifier) and not req.specifier.contains("2.0.0", prereleases=True) \
        and req.specifier.contains("1.26.4")


def read_torch_cuda(version_py: Path) -> Optional[str]:
    """`torch.version.cuda` read as text from torch/version.py (nothing executed)."""
    try:
        m = _CUDA_LINE.search(version_py.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None
    return (m.group(1) or m.group(2)) if m else None


def collect_packages() -> PackageFacts:
    """One pass over installed distributions (their METADATA read as text, never imported): companion
    versions, every torch requirement, and numpy<2 pins."""
    facts = PackageFacts()
    seen: set[str] = set()
    for dist in metadata.distributions():
        text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
        m = _NAME.search(text)
        name = canonicalize_name(m.group(1)) if m else ""
        if not name or name in seen:
            continue  # the first one on sys.path wins, as it does for imports
        seen.add(name)
        if name in COMPANIONS:
            v = _VERSION.search(text)
            facts.versions[name] = v.group(1) if v else dist.version
        for req in _requirements(text):
            if canonicalize_name(req.name) == "torch" and name != "torch" and str(req.specifier):
                facts.torch_requirements[name] = str(req.specifier)
            elif canonicalize_name(req.name) == "numpy" and _numpy_below_2(req):
                facts.numpy1_only.append(name)
        if name == "torch":
            init = Path(str(dist.locate_file("torch/__init__.py")))
            if init.is_file():
                facts.torch_location = str(init.parent)
                facts.torch_cuda = read_torch_cuda(init.parent / "version.py")
    facts.numpy1_only.sort()
    return facts
