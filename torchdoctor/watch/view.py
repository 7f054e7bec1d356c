"""The facts part of the watch report: what was watched."""
from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text


def facts_view(facts: dict[str, Any]) -> RenderableType:
    """Models and optimizers with their step counts (a crash is explained by the findings that follow)."""
    lines: list[RenderableType] = []
    for m in facts.get("models", []):
        wrapped = f" (inside {', '.join(m['wrappers'])})" if m.get("wrappers") else ""
        lines.append(Text.assemble(("  model ", "dim"), m["label"], wrapped, (f"  {m['parameters']:,} parameters", "dim")))
    for o in facts.get("optimizers", []):
        lines.append(Text.assemble(("  optimizer ", "dim"), o["label"], (f"  {o['steps']} steps", "dim")))
    return Group(*lines)
