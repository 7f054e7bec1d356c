"""Build a throwaway `Pitfall` around one detector, for tests of the engine (crashing checks, plug-ins)."""

from typing import Any

from torchdoctor.pitfall import Example, Pitfall, Scope


def make_pitfall(code: str, name: str, scope: "Scope | str", detector: Any, severity: str = "info") -> Pitfall:
    """A pitfall with `detector` attached (validated) for `scope` and placeholder documentation."""
    pitfall = Pitfall(
        code=code,
        name=name,
        severity=severity,
        summary="test only",
        why="test only",
        fix="test only",
        bad=Example("pass"),
        good=Example("pass"),
    )
    pitfall.detector(scope)(detector)
    return pitfall
