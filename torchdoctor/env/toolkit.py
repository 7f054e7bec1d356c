"""The CUDA toolkit (nvcc, CUDA_HOME): only extension builds use it; torch ships its own runtime."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Mapping, Optional

from torchdoctor.env.facts import ToolkitFacts

NVCC_TIMEOUT_S = 5.0
_RELEASE = re.compile(r"release (\d+\.\d+)")


def _version_json(cuda_home: str) -> Optional[str]:
    try:
        data = json.loads((Path(cuda_home) / "version.json").read_text())
        return ".".join(data["cuda"]["version"].split(".")[:2])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def collect_toolkit(environ: Optional[Mapping[str, str]] = None) -> ToolkitFacts:
    """Find nvcc the way torch.utils.cpp_extension does (CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda)."""
    environ = os.environ if environ is None else environ
    facts = ToolkitFacts()
    home = environ.get("CUDA_HOME") or environ.get("CUDA_PATH")
    facts.cuda_home_from_env = bool(home)
    nvcc = None
    if home and os.path.isfile(os.path.join(home, "bin", "nvcc")):
        nvcc = os.path.join(home, "bin", "nvcc")
    nvcc = nvcc or shutil.which("nvcc", path=environ.get("PATH"))
    if not home:
        if nvcc:
            home = str(Path(os.path.realpath(nvcc)).parent.parent)
        elif os.path.isdir("/usr/local/cuda"):
            home = "/usr/local/cuda"
    facts.cuda_home, facts.nvcc_path = home, nvcc
    version = _version_json(home) if home else None
    if version is None and nvcc:
        try:
            out = subprocess.run(
                [nvcc, "--version"], capture_output=True, text=True, timeout=NVCC_TIMEOUT_S, check=False
            ).stdout
            m = _RELEASE.search(out)
            version = m.group(1) if m else None
        except (OSError, subprocess.SubprocessError):
            version = None
    facts.nvcc_version = version
    return facts
