"""The console structure view of `check-ckpt` (the facts part of the report).

The view is built as plain blocks (a blank line, or a table: title, columns, rows of strings) and printed with
rich, or, off a terminal, as the same lines without importing rich (`plain_lines`, checked against rich by
tests). Every cell and title is printed verbatim: a key or path from the file is never read as rich markup or
emoji codes (`[bold]w[/bold]` is shown as it is stored), and no markup parser runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

from torchdoctor.ckpt.info import UNREADABLE
from torchdoctor.units import byte_size

if TYPE_CHECKING:
    from rich.console import RenderableType


@dataclass
class _Table:
    """A table as rich prints it without a box: a bold title line, optional header, columns two spaces apart."""

    title: str
    columns: Sequence[tuple[str, str]]  # (header, justify)
    rows: Sequence[Sequence[str]]
    show_header: bool = True


_Block = Optional[_Table]  # None: an empty line


def _pairs(title: str, rows: list[tuple[str, str]]) -> _Table:
    return _Table(title, [("", "left"), ("", "left")], rows, show_header=False)


def _top_level(items: list[dict[str, Any]]) -> str:
    parts = []
    for item in items[:30]:
        desc = item["type"]
        if "value" in item:
            desc = repr(item["value"])
        elif "tensors" in item:
            desc = f"{item['type']} with {item['tensors']} tensors"
        elif "shape" in item:
            desc = f"tensor {item['shape']} {item['dtype']}"
        elif "len" in item:
            desc = f"{item['type']}[{item['len']}]"
        parts.append(f"{item['key']}={desc}")
    return ", ".join(parts)


def _blocks(facts: dict[str, Any]) -> list[_Block]:
    """One checkpoint's structure tables (a file that could not be read: what it is and why)."""
    if facts["format"] == UNREADABLE:
        rows = [
            ("file", f"{facts['path']} ({byte_size(facts['file_size'])})"),
            ("format", f"unreadable: {facts['problems'][0]}"),
        ]
        return [None, _pairs("Checkpoint", rows)]
    t = facts["tensors"]
    optimizer = t["optimizer_state_elements"]
    details = ", ".join(f"{k} {v}" for k, v in facts["details"].items() if not isinstance(v, (list, dict)))
    rows = [
        ("file", f"{facts['path']} ({byte_size(facts['file_size'])})"),
        ("format", f"{facts['format']}" + (f" ({details})" if details else "")),
        ("contents", facts["kind"]),
        (
            "top level",
            f"{len(facts['top_level'])} keys, the tensors of a state dict"
            if facts["kind"] == "state_dict"
            else _top_level(facts["top_level"]),
        ),
        (
            "tensors",
            f"{t['count']} ({t['unique']} distinct): {t['parameters']:,} elements in weights"
            + (f", {optimizer:,} in optimizer state" if optimizer else ""),
        ),
        ("bytes by dtype", ", ".join(f"{k} {byte_size(v)}" for k, v in t["bytes_by_dtype"].items()) or "-"),
        ("bytes by device", ", ".join(f"{k} {byte_size(v)}" for k, v in t["bytes_by_device"].items()) or "-"),
    ]
    unusual = [g for g in facts["globals"] if g["verdict"] != "allowed"]
    rows.append(
        (
            "globals",
            f"{len(facts['globals'])} named, {len(unusual)} outside torch's weights_only allowlist"
            + (": " + ", ".join(f"{g['name']} ({g['verdict']})" for g in unusual[:12]) if unusual else ""),
        )
    )
    if "values" in facts:
        v = facts["values"]
        scanned = v["tensors_scanned"]
        rows.append(
            (
                "values",
                f"{scanned} tensor{'' if scanned == 1 else 's'} scanned ({byte_size(v['bytes_scanned'])}), "
                f"{len(v['nonfinite'])} with NaN/Inf"
                + (f"; {len(v['skipped'])} not scanned (e.g. {v['skipped'][0]})" if v["skipped"] else ""),
            )
        )
    else:
        rows.append(("values", "not read (use --scan-values to look for NaN/Inf)"))
    blocks: list[_Block] = [None, _pairs("Checkpoint", rows)]
    if t["groups"]:
        columns = [(c, "left" if c == "path" else "right") for c in ("path", "tensors", "elements", "bytes")]
        cells = [(g["path"], str(g["tensors"]), f"{g['elements']:,}", byte_size(g["bytes"])) for g in t["groups"][:15]]
        blocks += [None, _Table("Tensors by location", columns, cells)]
    if t["largest"]:
        columns = [(c, "left") for c in ("key", "shape", "dtype", "device", "bytes")]
        largest = [
            (e["key"], str(e["shape"]), e["dtype"], e["device"], byte_size(e["bytes"])) for e in t["largest"][:5]
        ]
        blocks += [None, _Table("Largest tensors", columns, largest)]
    if facts.get("fix"):
        blocks += [None, _pairs("--fix", [("", line) for line in facts["fix"]])]
    return blocks


def _all_blocks(facts: dict[str, Any]) -> list[_Block]:
    return [b for f in facts.get("checkpoints", []) for b in _blocks(f)]


def facts_view(facts: dict[str, Any]) -> RenderableType:
    """All checkpoints of one run, one block each, as rich renderables."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[RenderableType] = []
    for block in _all_blocks(facts):
        if block is None:
            parts.append(Text(""))
            continue
        table = Table(
            title=Text(block.title, style="bold"),
            title_justify="left",
            box=None,
            pad_edge=False,
            show_header=block.show_header,
        )
        if block.show_header:
            for header, justify in block.columns:
                table.add_column(Text(header), justify="right" if justify == "right" else "left", overflow="fold")
        else:  # a pairs table: the names dim and never wrapped, the values folded
            table.add_column(style="dim", no_wrap=True)
            table.add_column(overflow="fold")
        for row in block.rows:
            table.add_row(*map(Text, row))
        parts.append(table)
    return Group(*parts)


def plain_lines(facts: dict[str, Any]) -> Optional[list[str]]:
    """The lines `facts_view` prints off a terminal (rich at an unbounded width, trailing spaces dropped), without
    rich; None when a cell is not plain printable ASCII of moderate length (rich's cell widths, control codes
    and folding decide those: rich prints them)."""
    lines: list[str] = []
    for block in _all_blocks(facts):
        if block is None:
            lines.append("")
            continue
        rows = ([[c[0] for c in block.columns]] if block.show_header else []) + [list(r) for r in block.rows]
        if not all(_plain(cell) for cell in [block.title, *(c for r in rows for c in r)]):
            return None
        widths = [max(len(r[i]) for r in rows) for i in range(len(block.columns))]
        lines.append(block.title)
        for row in rows:
            cells = [
                cell.rjust(width) if justify == "right" else cell.ljust(width)
                for cell, width, (_, justify) in zip(row, widths, block.columns)
            ]
            lines.append("  ".join(cells).rstrip(" "))
    return lines


def _plain(text: str) -> bool:
    """Printable ASCII (one cell per character) short enough never to be folded."""
    return len(text) < 4000 and text.isascii() and text.isprintable()
