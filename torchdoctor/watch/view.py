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
        lines.append(
            Text.assemble(("  model ", "dim"), m["label"], wrapped, (f"  {m['parameters']:,} parameters", "dim"))
        )
    for o in facts.get("optimizers", []):
        lines.append(Text.assemble(("  optimizer ", "dim"), o["label"], (f"  {o['steps']} steps", "dim")))
    for group in facts.get("not_run", []):
        if not group.get("applies", True):
            lines.append(Text.assemble(("  not run ", "dim"), ", ".join(group["checks"]), (f": {group['why']}", "dim")))
            continue
        lines.append(Text.assemble(("  not run ", "yellow"), ", ".join(group["checks"]), (f": {group['why']}", "dim")))
        lines.append(Text.assemble(("           how: ", "dim"), group["how"]))
    timing = facts.get("step_time")
    if timing:
        lines.append(
            Text.assemble(
                ("  step time ", "dim"),
                f"median {timing['step_median_ms']:.3g} ms, "
                f"p90 {timing['step_p90_ms']:.3g} ms, {timing['steps_per_s']:.3g} steps/s",
                (f"  over {timing['steps']} timed steps", "dim"),
            )
        )
        lines.append(
            Text(
                "    "
                + "  ".join(
                    f"{name} {100 * p['share']:.0f}% ({p['median_ms']:.3g} ms)" for name, p in timing["phases"].items()
                )
            )
        )
    return Group(*lines)
