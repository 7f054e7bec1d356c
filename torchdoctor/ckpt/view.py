"""The console structure view of `check-ckpt` (the facts part of the report).

Every cell and title is a `Text`, printed verbatim: a key or path from the file is never read as rich markup
or emoji codes (`[bold]w[/bold]` is shown as it is stored), and no markup parser runs.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from torchdoctor.ckpt.info import UNREADABLE
from torchdoctor.units import byte_size


def _table(title: str, **options: Any) -> Table:
    return Table(title=Text(title, style="bold"), title_justify="left", box=None, pad_edge=False, **options)


def _pairs(title: str, rows: list[tuple[str, str]]) -> Table:
    table = _table(title, show_header=False)
    table.add_column(style="dim", no_wrap=True)
    table.add_column(overflow="fold")
    for k, v in rows:
        table.add_row(Text(k), Text(v))
    return table


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


def one_view(facts: dict[str, Any]) -> RenderableType:
    """One checkpoint's structure tables (a file that could not be read: what it is and why)."""
    if facts["format"] == UNREADABLE:
        rows = [
            ("file", f"{facts['path']} ({byte_size(facts['file_size'])})"),
            ("format", f"unreadable: {facts['problems'][0]}"),
        ]
        return Group(Text(""), _pairs("Checkpoint", rows))
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
    parts: list[RenderableType] = [Text(""), _pairs("Checkpoint", rows)]
    if t["groups"]:
        groups = _table("Tensors by location")
        for col in ("path", "tensors", "elements", "bytes"):
            groups.add_column(Text(col), justify="left" if col == "path" else "right", overflow="fold")
        for g in t["groups"][:15]:
            groups.add_row(*map(Text, (g["path"], str(g["tensors"]), f"{g['elements']:,}", byte_size(g["bytes"]))))
        parts += [Text(""), groups]
    if t["largest"]:
        largest = _table("Largest tensors")
        for col in ("key", "shape", "dtype", "device", "bytes"):
            largest.add_column(Text(col), overflow="fold")
        for e in t["largest"][:5]:
            largest.add_row(*map(Text, (e["key"], str(e["shape"]), e["dtype"], e["device"], byte_size(e["bytes"]))))
        parts += [Text(""), largest]
    if facts.get("fix"):
        parts += [Text(""), _pairs("--fix", [("", line) for line in facts["fix"]])]
    return Group(*parts)


def facts_view(facts: dict[str, Any]) -> RenderableType:
    """All checkpoints of one run, one block each."""
    return Group(*(one_view(f) for f in facts.get("checkpoints", [])))
