"""`torchdoctor lint`: training-loop pitfalls found in source with the standard library `ast`.

`lint_paths(paths, checks)` is the engine; the rules themselves are the `checks/lint_*.py` modules,
registered with scope SOURCE. Nothing here imports torch.
"""
from torchdoctor.lint.runner import LintResult, lint_paths

__all__ = ["LintResult", "lint_paths"]
