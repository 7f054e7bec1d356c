"""The settings of one run, from three layers where a later one wins: the project, the environment, the caller.

1. The `[tool.torchdoctor]` table of the nearest pyproject.toml that has one, searched from the target's
   folder upwards (the linted path, the checkpoint file; the working directory for `env` and `watch()`),
   as ruff does; a pyproject.toml without the table is passed over::

       [tool.torchdoctor]
       select = ["missing-zero-grad", "TD503"]  # names or codes, of any front door
       ignore = ["deprecated-api"]
       fail-on = "warning"
       exclude = ["legacy/", "*_pb2.py"]        # lint only (gitignore syntax, relative to this file)

       [tool.torchdoctor.per-file-ignores]      # lint only, as ruff's: pattern (as exclude's) -> names or codes
       "tests/" = ["unsafe-torch-load"]

2. The environment: `TORCHDOCTOR_SELECT`, `TORCHDOCTOR_IGNORE` (comma-separated) and `TORCHDOCTOR_FAIL_ON`.
3. Command-line options (`--select`, `--ignore`, `--fail-on`, `--exclude`) or keyword arguments.

`select` and `fail-on` of a later layer replace the earlier ones; `ignore` and `exclude` add up.
The project and environment layers are shared by every front door, so each door skips the names that
belong to another door; the caller's own names must all fit the door (see `torchdoctor.selection`).
`cache_dir()` is where the lint results and the plug-in list are cached (`TORCHDOCTOR_CACHE_DIR` moves it).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

FAIL_ON = ("error", "warning", "info", "never")
DEFAULT_FAIL_ON = "error"
ENV_SELECT = "TORCHDOCTOR_SELECT"
ENV_IGNORE = "TORCHDOCTOR_IGNORE"
ENV_FAIL_ON = "TORCHDOCTOR_FAIL_ON"
ENVIRONMENT = "the environment"  # the origin of the environment layer
_VARIABLES = {"select": ENV_SELECT, "ignore": ENV_IGNORE, "fail-on": ENV_FAIL_ON}
_TABLE_KEYS = ("select", "ignore", "fail-on", "exclude", "per-file-ignores")


class SettingsError(ValueError):
    """A setting is malformed; the one-line message says where (the file and key, or the variable)."""


@dataclass(frozen=True)
class Layer:
    """What one source of settings says; `origin` is the pyproject.toml, `ENVIRONMENT`, or None (the caller)."""

    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    fail_on: Optional[str] = None
    exclude: tuple[str, ...] = ()
    origin: Optional[str] = None
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (pattern, names or codes), project only

    @property
    def shared(self) -> bool:
        """Project and environment layers apply to every front door; the caller's apply to one."""
        return self.origin is not None

    def where(self, key: str) -> str:
        """Where a shared layer's `key` was set, for messages: the variable, or the file and table key."""
        if self.origin == ENVIRONMENT:
            return _VARIABLES[key]
        return f"{self.origin} [tool.torchdoctor] {key}"


@dataclass(frozen=True)
class Settings:
    """The layers of one run, in order (project, environment, caller), and the project file if any."""

    layers: tuple[Layer, ...] = ()
    project: Optional[str] = None  # the pyproject.toml whose [tool.torchdoctor] table was read

    @property
    def root(self) -> Optional[str]:
        """The project's folder (the table's `exclude` patterns are relative to it)."""
        return os.path.dirname(self.project) if self.project else None

    @property
    def fail_on(self) -> str:
        """The threshold of the exit code: the last layer that sets one wins."""
        for layer in reversed(self.layers):
            if layer.fail_on is not None:
                return layer.fail_on
        return DEFAULT_FAIL_ON

    @property
    def exclude(self) -> list[tuple[str, Optional[str]]]:
        """Every `exclude` pattern with the folder it is relative to (None: the working directory)."""
        return [(pattern, self.root if layer.shared else None) for layer in self.layers for pattern in layer.exclude]

    @property
    def per_file_ignores(self) -> list[tuple[str, tuple[str, ...], str]]:
        """`per-file-ignores` of the project table: (pattern, names or codes, where it was set)."""
        return [
            (pattern, names, layer.where("per-file-ignores"))
            for layer in self.layers
            for pattern, names in layer.per_file_ignores
        ]


def load_settings(
    targets: "str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None" = None,
    *,
    select: "Iterable[str] | str | None" = None,
    ignore: "Iterable[str] | str | None" = None,
    fail_on: Optional[str] = None,
    exclude: Iterable[str] = (),
) -> Settings:
    """The settings for a run on `targets` (default: the working directory) with the caller's own values.

    Raises `SettingsError` for a malformed table, variable or value.
    """
    layers = []
    found = _nearest_table(targets)
    if found is not None:
        layers.append(_table_layer(*found))
    layers.append(_environment_layer(os.environ))
    layers.append(
        Layer(
            select=split_names(select or ()),
            ignore=split_names(ignore or ()),
            fail_on=_fail_on(fail_on, "fail-on") if fail_on is not None else None,
            exclude=tuple(exclude),
        )
    )
    return Settings(tuple(layers), found[0] if found is not None else None)


def find_project(targets: "str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None" = None) -> Optional[str]:
    """The nearest pyproject.toml with a `[tool.torchdoctor]` table, from the targets' common folder upwards."""
    found = _nearest_table(targets)
    return found[0] if found is not None else None


def _nearest_table(
    targets: "str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None",
) -> Optional[tuple[str, Any]]:
    """The nearest pyproject.toml that has the table (default: from the working directory), and the table."""
    if targets is None or isinstance(targets, (str, os.PathLike)):
        targets = [targets] if targets is not None else []
    paths = [os.path.abspath(os.fspath(t)) for t in targets] or [os.getcwd()]
    try:
        current = os.path.commonpath(paths)
    except ValueError:  # Windows: targets on different drives share no folder
        current = paths[0]
    while True:  # from a file (existing or not), the first candidate is beside it
        candidate = os.path.join(current, "pyproject.toml")
        table = _table(candidate) if os.path.isfile(candidate) else None
        if table is not None:
            return candidate, table
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def _table(path: str) -> Any:
    """The file's `[tool.torchdoctor]` value, None when it has none (SettingsError when it is not TOML)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    if b"torchdoctor" not in data:  # another tool's file: not worth parsing (nor importing a TOML parser for)
        return None
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.9/3.10 only
        import tomli as tomllib
    try:
        tool = tomllib.loads(data.decode("utf-8")).get("tool")
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"cannot read {path}: {exc}") from None
    return tool.get("torchdoctor") if isinstance(tool, dict) else None


def _table_layer(path: str, table: Any) -> Layer:
    """The `[tool.torchdoctor]` table of `path` as a layer."""
    if not isinstance(table, dict):
        raise SettingsError(f"{path}: [tool.torchdoctor] must be a table")
    unknown = [key for key in table if key not in _TABLE_KEYS]
    if unknown:
        raise SettingsError(
            f"{path}: unknown key {unknown[0]!r} in [tool.torchdoctor] (known: {', '.join(_TABLE_KEYS)})"
        )
    where = f"{path} [tool.torchdoctor]"
    return Layer(
        select=_string_list(table.get("select", ()), f"{where} select"),
        ignore=_string_list(table.get("ignore", ()), f"{where} ignore"),
        fail_on=_fail_on(table["fail-on"], f"{where} fail-on") if "fail-on" in table else None,
        exclude=_string_list(table.get("exclude", ()), f"{where} exclude"),
        origin=path,
        per_file_ignores=_per_file_ignores(table.get("per-file-ignores", {}), f"{where} per-file-ignores"),
    )


def _per_file_ignores(value: Any, where: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """`{"pattern" = ["name", ...]}` as (pattern, names) pairs."""
    if not isinstance(value, dict):
        raise SettingsError(f"{where} must be a table of pattern = [names or codes]")
    return tuple((str(pattern), _string_list(names, f"{where} {pattern!r}")) for pattern, names in value.items())


def _environment_layer(environ: Mapping[str, str]) -> Layer:
    """The `TORCHDOCTOR_SELECT` / `_IGNORE` / `_FAIL_ON` variables as a layer (empty ones are unset)."""
    fail_on = environ.get(ENV_FAIL_ON, "").strip()
    return Layer(
        select=split_names(environ.get(ENV_SELECT, "")),
        ignore=split_names(environ.get(ENV_IGNORE, "")),
        fail_on=_fail_on(fail_on, ENV_FAIL_ON) if fail_on else None,
        origin=ENVIRONMENT,
    )


def split_names(items: "Iterable[str] | str") -> tuple[str, ...]:
    """Names or codes given one per item and/or comma-separated, blanks dropped."""
    if isinstance(items, str):
        items = [items]
    return tuple(part.strip() for item in items for part in str(item).split(",") if part.strip())


def _string_list(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return split_names(value)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise SettingsError(f"{where} must be a list of strings")
    return split_names(value)


def _fail_on(value: Any, where: str) -> str:
    if value not in FAIL_ON:
        raise SettingsError(f"{where} must be one of {', '.join(FAIL_ON)}, not {value!r}")
    return str(value)


def cache_dir() -> str:
    """$TORCHDOCTOR_CACHE_DIR, else the platform's per-user cache folder (XDG on Linux) + `torchdoctor`."""
    if os.environ.get("TORCHDOCTOR_CACHE_DIR"):
        return os.environ["TORCHDOCTOR_CACHE_DIR"]
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or os.path.expanduser(r"~\AppData\Local")
    elif sys.platform == "darwin":
        base = os.path.expanduser("~/Library/Caches")
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "torchdoctor")
