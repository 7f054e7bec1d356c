"""The lint-only output formats: `path:line:col: CODE name message` lines (each followed by its indented fix)
and SARIF 2.1.0 for code-scanning UIs."""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Optional

from torchdoctor import __version__
from torchdoctor.findings import Finding, Fix, Severity
from torchdoctor.pitfall import Pitfall

_SARIF_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def text_entry(f: Finding) -> str:
    """One clickable line, as flake8 and ruff print them (`[*]` before the message when --fix can rewrite it),
    then the fix: its title, and its code indented as is."""
    loc = f.location
    where = f"{loc.file}:{loc.line or 1}:{loc.column or 1}" if loc and loc.file else "<unknown>:1:1"
    message = " ".join(f.message.split())
    fixable = "[*] " if getattr(f, "edits", ()) else ""
    lines = [f"{where}: {f.code} {f.name} {fixable}{message}"]
    if f.fix is not None:
        lines.append(f"    fix:{' ' if f.fix.title else ''}{f.fix.title}")
        lines += [f"        {line}" if line else "" for line in f.fix.code.splitlines()]
    return "\n".join(lines)


def artifact_location(file: str, root: str) -> dict[str, str]:
    """A SARIF artifactLocation: a percent-encoded URI relative to the project root (`uriBaseId` %SRCROOT%), or an
    absolute `file:` URI for a file outside it."""
    from pathlib import Path
    from urllib.parse import quote

    path = os.path.abspath(file)
    rel = os.path.relpath(path, root) if os.path.splitdrive(path)[0] == os.path.splitdrive(root)[0] else ".."
    if rel == ".." or rel.startswith(".." + os.sep):
        return {"uri": Path(path).as_uri()}
    return {"uri": quote(rel.replace(os.sep, "/")), "uriBaseId": "%SRCROOT%"}


def to_sarif(findings: Iterable[Finding], checks: Iterable[Pitfall], root: Optional[str] = None) -> str:
    """A SARIF 2.1.0 log with one run; rules are the checks that ran. File URIs are relative to `root` (the
    project root; default the working directory), which the log names as %SRCROOT%."""
    from pathlib import Path

    root = os.path.abspath(root or os.getcwd())
    rules = [
        {
            "id": c.code,
            "name": c.name,
            "shortDescription": {"text": c.summary},
            "help": {"text": f"torchdoctor explain {c.name}"},
            "defaultConfiguration": {"level": _SARIF_LEVEL[c.severity]},
        }
        for c in checks
    ]
    position = {r["id"]: i for i, r in enumerate(rules)}
    results: list[dict[str, Any]] = []
    for f in findings:
        result: dict[str, Any] = {
            "ruleId": f.code,
            "level": _SARIF_LEVEL[f.severity or Severity.INFO],
            "message": _sarif_message(f.message, f.fix),
        }
        if f.code in position:
            result["ruleIndex"] = position[f.code]
        if f.location is not None and f.location.file:
            region = {"startLine": f.location.line or 1}
            if f.location.column:
                region["startColumn"] = f.location.column
            result["locations"] = [
                {
                    "physicalLocation": {
                        "artifactLocation": artifact_location(f.location.file, root),
                        "region": region,
                    }
                }
            ]
        results.append(result)
    log = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "torchdoctor",
                        "version": __version__,
                        "informationUri": "https://pypi.org/project/torchdoctor/",
                        "rules": rules,
                    }
                },
                "originalUriBaseIds": {"%SRCROOT%": {"uri": Path(root).as_uri().rstrip("/") + "/"}},
                "results": results,
            }
        ],
    }
    return json.dumps(log, indent=2, ensure_ascii=False)


def _sarif_message(text: str, fix: Optional[Fix]) -> dict[str, str]:
    """A SARIF message: plain text, and Markdown with the fix's code in a fenced block."""
    if fix is None:
        return {"text": text}
    plain = [text, f"Fix: {fix.title}".rstrip(), *([fix.code] if fix.code else [])]
    markdown = [text, f"**Fix:** {fix.title}".rstrip(), *([f"```\n{fix.code}\n```"] if fix.code else [])]
    return {"text": "\n".join(plain), "markdown": "\n\n".join(markdown)}
