"""`torchdoctor lint`: training-loop pitfalls found in source with the standard library `ast`.

`lint_paths(paths, checks)` (in `torchdoctor.lint.runner`) is the engine; the rules are the source detectors
(`@pitfall.source`) of the modules under `checks/`. This ``__init__`` imports nothing, so a check module that
reads the program model (`torchdoctor.sdk.source`) does not load the engine. Nothing here imports torch.
"""
