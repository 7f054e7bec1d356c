"""The check pages, generated from the pitfall definitions: ``docs/checks/<name>.md`` and an index.

`pages()` is what ``scripts/pitfalls.py docs`` writes and what the stale-docs test compares with the
files in the repository, so a definition and its page can't drift apart.
"""

from __future__ import annotations

from torchdoctor import registry


def pages() -> dict[str, str]:
    """Every generated page, keyed by its path under ``docs/``."""
    pitfalls = registry.all_checks()
    out = {f"checks/{p.name}.md": p.page() for p in pitfalls}
    rows = [
        f"| [{p.code}]({p.name}.md) | `{p.name}` | {p.severity} | "
        f"{', '.join(str(s) for s in p.scopes)} | {_cell(p.summary)} |"
        for p in pitfalls
    ]
    out["checks/index.md"] = "\n".join(
        [
            "# Checks",
            "",
            "Every pitfall torchdoctor knows, generated from its definition (`checks/*.py`). "
            "`torchdoctor explain NAME` prints the same page in a terminal.",
            "",
            "| code | name | severity | found by | summary |",
            "|---|---|---|---|---|",
            *rows,
            "",
        ]
    )
    return out


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|")
