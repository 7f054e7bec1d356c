"""Check that `torchdoctor lint` finds the same in a whole tree as in each of its files linted alone.

    python scripts/lint_consistency.py PATH [PATH...]

For each folder: lint it as one run, then lint every Python file of it on its own (as an editor or pre-commit
does), in process and without the cache, and print the findings that only one of the two ways reports.
Exits 1 when any differ. Answers about other files come from the program model reading the project on disk,
so the two must agree.
"""

from __future__ import annotations

import argparse
import os
import sys

from torchdoctor import registry
from torchdoctor.findings import Finding
from torchdoctor.lint.files import discover
from torchdoctor.lint.runner import lint_paths

Key = tuple[str, int, str, str]


def _key(f: Finding) -> Key:
    loc = f.location
    return (loc.file or "" if loc else "", loc.line or 0 if loc else 0, f.code, str(f.severity))


def compare(folder: str) -> tuple[set[Key], set[Key]]:
    """(findings of the tree run, findings of the files linted one at a time) for one folder."""
    checks = registry.all_checks(registry.Scope.SOURCE)
    root = os.path.abspath(folder)
    tree = {_key(f) for f in lint_paths([root], checks, cwd=root, jobs=1).findings}
    alone: set[Key] = set()
    for path in discover([root], [], root):
        alone |= {_key(f) for f in lint_paths([path], checks, cwd=root, jobs=1).findings}
    return tree, alone


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    args = parser.parse_args()
    differing = 0
    for folder in args.paths:
        tree, alone = compare(folder)
        differing += len(tree ^ alone)
        print(
            f"{folder}: {len(tree)} findings in the tree run, {len(alone)} file by file, {len(tree ^ alone)} differing"
        )
        for key in sorted(tree - alone):
            print(f"  only in the tree run: {key}")
        for key in sorted(alone - tree):
            print(f"  only file by file: {key}")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
