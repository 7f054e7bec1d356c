"""Project defaults from the `[tool.torchdoctor]` table of the nearest pyproject.toml.

Every front door reads the same table, so a project says once which checks it wants:

    [tool.torchdoctor]
    select = ["missing-zero-grad", "TD503"]  # names or codes; each front door keeps its own
    ignore = ["deprecated-api"]
    fail-on = "warning"
    exclude = ["legacy/", "*_pb2.py"]       # lint only (gitignore syntax)

Command-line options win: --select replaces `select`, --ignore adds to `ignore`, --fail-on replaces `fail-on`.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.9/3.10 only
    import tomli as tomllib

FAIL_ON_VALUES = ("error", "warning", "info", "never")
_LIST_KEYS = ("select", "ignore", "exclude")


class ConfigError(ValueError):
    """The `[tool.torchdoctor]` table is malformed; the message names the file and the key."""


@dataclass(frozen=True)
class ProjectConfig:
    """The defaults one pyproject.toml sets (empty when there is none)."""

    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    fail_on: Optional[str] = None
    exclude: tuple[str, ...] = ()
    path: Optional[str] = None


def find_pyproject(start: Optional[str] = None) -> Optional[str]:
    """The nearest pyproject.toml in `start` (default: the working directory) or above it."""
    current = os.path.abspath(start or os.getcwd())
    while True:
        candidate = os.path.join(current, "pyproject.toml")
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def load_project_config(start: Optional[str] = None) -> ProjectConfig:
    """Read `[tool.torchdoctor]` from the nearest pyproject.toml; raises ConfigError when it is malformed."""
    path = find_pyproject(start)
    if path is None:
        return ProjectConfig()
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    table = data.get("tool", {}).get("torchdoctor")
    if table is None:
        return ProjectConfig(path=path)
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.torchdoctor] must be a table")
    values: dict[str, Any] = {"path": path}
    for key, value in table.items():
        field = key.replace("-", "_")
        if field in _LIST_KEYS:
            values[field] = _string_list(path, key, value)
        elif field == "fail_on":
            if value not in FAIL_ON_VALUES:
                raise ConfigError(f"{path}: [tool.torchdoctor] fail-on must be one of {', '.join(FAIL_ON_VALUES)}, "
                                  f"not {value!r}")
            values["fail_on"] = value
        else:
            raise ConfigError(f"{path}: unknown key {key!r} in [tool.torchdoctor] "
                              "(known: select, ignore, fail-on, exclude)")
    return ProjectConfig(**values)


def _string_list(path: str, key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{path}: [tool.torchdoctor] {key} must be a list of strings")
    return tuple(v.strip() for v in value if v.strip())
