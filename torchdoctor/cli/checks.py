"""`torchdoctor checks`: list every registered check (built-in and plug-in)."""

from __future__ import annotations

from typing import Any, Optional

import click

from torchdoctor import registry
from torchdoctor.report import Report, make_console, to_json

_COLUMNS = ["code", "name", "scope", "severity", "origin", "summary"]


@click.command("checks")
@click.option(
    "--scope",
    type=click.Choice([s.value for s in registry.Scope]),
    default=None,
    help="Only list checks of this scope.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["console", "json"]),
    default="console",
    show_default=True,
    help="A table, or the JSON envelope of every command with the list under facts.checks.",
)
def list_checks(scope: Optional[str], fmt: str) -> None:
    """List every check: code, name, scope, severity, origin."""
    checks = registry.all_checks(scope)
    if fmt == "json":
        subject = f"{scope} checks" if scope else "all checks"
        click.echo(
            to_json(Report(scope="checks", findings=[], facts={"checks": [_row(c) for c in checks]}, subject=subject))
        )
        return
    console = make_console()
    if not console.is_terminal:  # piped: one tab-separated line per check, never wrapped or padded (grep, cut)
        for row in [
            _COLUMNS,
            *(
                [
                    c.code,
                    c.name,
                    ",".join(str(s) for s in c.scopes),
                    str(c.severity),
                    c.origin,
                    " ".join(c.summary.split()),
                ]
                for c in checks
            ),
        ]:
            click.echo("\t".join(row))
        return
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for column in _COLUMNS[:-1]:
        table.add_column(column, no_wrap=True)
    table.add_column("summary", overflow="fold")
    for c in checks:
        table.add_row(c.code, c.name, ",".join(str(s) for s in c.scopes), str(c.severity), c.origin, c.summary)
    console.print(table)


def _row(check: registry.Pitfall) -> dict[str, Any]:
    """One check in `facts.checks` (the `check` definition of report.schema.json)."""
    return {
        "code": check.code,
        "name": check.name,
        "scopes": [str(s) for s in check.scopes],
        "severity": str(check.severity),
        "origin": check.origin,
        "summary": check.summary,
    }
