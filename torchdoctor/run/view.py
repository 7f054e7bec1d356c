"""The facts part of the `torchdoctor run` report: the program and how it ended, then what was watched."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from torchdoctor.watch.view import facts_view as watch_view


def facts_view(facts: dict[str, Any]) -> RenderableType:
    """The program's exit, the models and optimizers followed (adopted, retired), and the watch facts."""
    program = facts.get("program", {})
    ended = f"exit status {program.get('exit_status', '?')}"
    if program.get("exception"):
        ended += f" after {program['exception']}"
    lines: list[RenderableType] = [
        Text.assemble(("  program ", "dim"), str(program.get("target", "")), (f"  {ended}", "dim"))
    ]
    if not facts.get("optimizers") and not facts.get("retired_optimizers"):
        lines.append(Text("  no optimizer stepped: the training checks had nothing to watch", style="yellow"))
    ranks = facts.get("ranks")
    if ranks:
        lines.append(
            Text.assemble(
                ("  ranks ", "dim"),
                f"{len(ranks['reported'])} reported",
                (
                    f", missing {', '.join(map(str, ranks['missing']))} (died or unreachable)"
                    if ranks["missing"]
                    else "",
                    "yellow",
                ),
            )
        )
    lines.append(watch_view(facts))
    for o in facts.get("retired_optimizers", []):
        lines.append(
            Text.assemble(("  optimizer ", "dim"), o["label"], (f"  {o['steps']} steps, then replaced", "dim"))
        )
    return Group(*lines)
