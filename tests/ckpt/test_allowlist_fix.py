"""needs-code-to-load's fix, pasted into a fresh namespace, loads the file with weights_only=True."""

import argparse
import sys

import numpy as np
import torch
from torch import nn

from torchdoctor.ckpt.api import check_checkpoint


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)


def _fix_code(path) -> str:
    [finding] = [f for f in check_checkpoint(path).findings if f.name == "needs-code-to-load"]
    return finding.fix.code


def test_the_allowlist_fix_loads_a_file_saved_from_a_script(tmp_path, monkeypatch):
    """A class saved from a script is named `__main__.Net`: the fix allows it under that name (no `import
    __main__`, which a loading script would need to hold the class itself), and loads the checked path."""
    monkeypatch.setattr(Net, "__module__", "__main__")
    monkeypatch.setattr(sys.modules["__main__"], "Net", Net, raising=False)
    path = tmp_path / "whole.pt"
    torch.save({"model": Net(), "args": argparse.Namespace(lr=0.1), "best": np.float64(0.5)}, path)
    code = _fix_code(path)
    assert "import __main__" not in code and "(Net, '__main__.Net')" in code and repr(str(path)) in code
    monkeypatch.delattr(sys.modules["__main__"], "Net")  # the loading script has Net, not the saving one
    namespace = {"torch": torch, "Net": Net}
    saved = torch.serialization.get_safe_globals()
    try:
        exec(compile(code, "<fix>", "exec"), namespace)
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(saved)
    assert isinstance(namespace["ckpt"]["model"], Net) and namespace["ckpt"]["args"].lr == 0.1
