"""`torchdoctor explain CHECK`: print a check's docs page."""

from __future__ import annotations

import click

from torchdoctor.report import make_console
from torchdoctor.selection import SelectionError, find


@click.command()
@click.argument("check")
def explain(check: str) -> None:
    """Print the docs page of CHECK (a name such as cpu-only-build, or its code)."""
    try:
        info = find(check)
    except SelectionError as exc:
        raise click.UsageError(str(exc)) from None
    from rich.markdown import Markdown

    page = info.page()
    console = make_console()
    if console.is_terminal:
        console.print(Markdown(page))
    else:
        click.echo(page.rstrip("\n"))
