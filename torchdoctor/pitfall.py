"""`Pitfall`: the one definition of a mistake torchdoctor diagnoses — its metadata, its documentation, and
the detector each front door runs for it.

A pitfall is declared once, in one module under ``checks/`` (or a plug-in's module), whatever the number
of doors that see it::

    FORGOT_ZERO_GRAD = Pitfall(code="TD301", name="missing-zero-grad", severity="error", summary=..., why=...,
                               fix=..., bad=Example(...), good=Example(...))

    @FORGOT_ZERO_GRAD.runtime
    class MissingZeroGrad(RuntimeCheck): ...

    @FORGOT_ZERO_GRAD.source
    def missing_zero_grad(src: SourceFile) -> Iterator[Finding]: ...

The registry collects every `Pitfall` found in a checks module; its docs page (``docs/checks/<name>.md``)
and ``torchdoctor explain`` are rendered from these fields by `page`. Each detector is validated when it
is attached, so a malformed plug-in fails at load time instead of inside the user's training loop.
This module is torch-free.
"""

from __future__ import annotations

import enum
import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, TypeVar

from torchdoctor.findings import Finding, Severity

_NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_CODE_RE = re.compile(r"^[A-Z]+[0-9]+$")
_VERSION_RE = re.compile(r"^\d+(\.\d+)*$")

D = TypeVar("D")


class Scope(str, enum.Enum):
    """Where a detector looks; each front door runs the detectors of its scope(s)."""

    ENV = "env"
    CHECKPOINT = "checkpoint"
    RUNTIME = "runtime"
    DISTRIBUTED = "distributed"
    SOURCE = "source"

    def __str__(self) -> str:
        return self.value


# How a finding of each scope is silenced, and the heading of the scope's section on a docs page.
_DOORS: dict[Scope, tuple[str, str]] = {
    Scope.ENV: (
        "`torchdoctor env`",
        '`torchdoctor env --ignore {name}`, or `ignore = ["{name}"]` under `[tool.torchdoctor]` in pyproject.toml',
    ),
    Scope.CHECKPOINT: (
        "`torchdoctor check-ckpt`",
        "`torchdoctor check-ckpt --ignore {name} FILE`, "
        '`check_checkpoint(path, ignore=["{name}"])`, or `ignore = ["{name}"]` under '
        "`[tool.torchdoctor]`",
    ),
    Scope.RUNTIME: (
        "`torchdoctor.watch`",
        '`torchdoctor.watch(model, optimizer, ignore=["{name}"])`, or `ignore = ["{name}"]` under `[tool.torchdoctor]`',
    ),
    Scope.DISTRIBUTED: (
        "`torchdoctor.watch` under torch.distributed",
        '`torchdoctor.watch(model, optimizer, ignore=["{name}"])` on every rank, or '
        '`ignore = ["{name}"]` under `[tool.torchdoctor]`',
    ),
    Scope.SOURCE: (
        "`torchdoctor lint`",
        "`# torchdoctor: ignore[{name}]` at the end of the reported line, "
        '`torchdoctor lint --ignore {name}`, or `ignore = ["{name}"]` under `[tool.torchdoctor]`',
    ),
}


class PitfallError(ValueError):
    """A pitfall or one of its detectors is malformed (raised when it is defined, never at run time)."""


@dataclass(frozen=True)
class Example:
    """A Bad or Good example: `code` is shown on the page; `setup` runs first but is not shown.

    Python examples are executed by the examples contract test through every door the pitfall has:
    source examples are linted (``setup + code``); runtime examples run ``setup`` (which must bind
    ``model`` and may bind ``optimizer``/``loader``), then ``code`` inside ``torchdoctor.watch``;
    checkpoint examples run in an empty folder and every checkpoint they write is checked. `unseen`
    says, per scope, why that door's detector cannot see this example; the page prints it.

    The fixes contract: the Good example is the Bad one with the code of each fix its findings propose
    pasted in (a checkpoint fix's code must run when pasted after the Bad example). Where a door's fix is
    a recipe in general names rather than the example's own lines (the runtime door sees no source),
    the Good example says so per scope in `recipe`, and only the recipe's syntax is checked.
    """

    code: str
    setup: str = ""
    language: str = "python"
    unseen: Mapping[str, str] = field(default_factory=dict)
    recipe: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "code", inspect.cleandoc(self.code))
        object.__setattr__(self, "setup", inspect.cleandoc(self.setup))

    def runnable(self, scope: Scope) -> bool:
        """Whether the contract test runs this example through `scope`'s detector."""
        return self.language == "python" and str(scope) not in self.unseen


class Pitfall:
    """One pitfall: what it is, why it matters, how to fix it, examples, and a detector per door.

    Prose fields may be written as indented triple-quoted strings: they are stored flush left (the page
    is Markdown). `severity` is the default of its findings; a detector may set another on one finding.
    """

    def __init__(
        self,
        *,
        code: str,
        name: str,
        severity: "Severity | str",
        summary: str,
        why: str,
        fix: str,
        bad: Example,
        good: Example,
        since: str = "0.1.0",
        details: Optional[Mapping[str, str]] = None,
        silence: str = "",
    ) -> None:
        self.code = code
        self.name = name
        self.severity: Severity = Severity.parse(severity)
        self.summary, self.why, self.fix, self.silence = (inspect.cleandoc(t) for t in (summary, why, fix, silence))
        self.bad, self.good = bad, good
        self.since = since
        self.details = {k: inspect.cleandoc(v) for k, v in (details or {}).items()}  # scope -> how it is found
        self.detectors: dict[Scope, Any] = {}
        self.origin = "built-in"
        if not _NAME_RE.match(self.name):
            raise PitfallError(f"pitfall name {self.name!r} must be kebab-case")
        if not _CODE_RE.match(self.code):
            raise PitfallError(f"pitfall {self.name}: code {self.code!r} must look like TD101")
        if not _VERSION_RE.match(self.since):
            raise PitfallError(f"pitfall {self.name}: since={self.since!r} must be a version like 0.2.0")
        for text, what in ((self.summary, "summary"), (self.why, "why"), (self.fix, "fix")):
            if not text.strip():
                raise PitfallError(f"pitfall {self.name}: {what} must not be empty")
        for key in (*self.details, *self.bad.unseen, *self.good.unseen, *self.bad.recipe, *self.good.recipe):
            _scope(key, self.name)

    def __repr__(self) -> str:
        return f"Pitfall({self.code} {self.name}, {', '.join(map(str, self.scopes)) or 'no detector'})"

    # -- detectors ----------------------------------------------------------------------------------
    def detector(self, scope: "Scope | str") -> Callable[[D], D]:
        """Decorator attaching `scope`'s detector, validated for that scope's shape."""
        scope = _scope(scope, self.name)

        def attach(impl: D) -> D:
            if scope in self.detectors and self.detectors[scope] is not impl:
                raise PitfallError(f"pitfall {self.name} already has a {scope} detector")
            _validate(self.name, scope, impl)
            self.detectors[scope] = impl
            return impl

        return attach

    def env(self, impl: D) -> D:
        """Attach the environment detector: a function ``EnvFacts -> Iterable[Finding]``."""
        return self.detector(Scope.ENV)(impl)

    def checkpoint(self, impl: D) -> D:
        """Attach the checkpoint detector: a function ``CheckpointInfo -> Iterable[Finding]``."""
        return self.detector(Scope.CHECKPOINT)(impl)

    def runtime(self, impl: D) -> D:
        """Attach the runtime detector: a `RuntimeCheck` subclass."""
        return self.detector(Scope.RUNTIME)(impl)

    def distributed(self, impl: D) -> D:
        """Attach the cross-rank runtime detector: a `RuntimeCheck` subclass run under torch.distributed."""
        return self.detector(Scope.DISTRIBUTED)(impl)

    def source(self, impl: D) -> D:
        """Attach the lint detector: a function ``SourceFile -> Iterable[Finding]``."""
        return self.detector(Scope.SOURCE)(impl)

    @property
    def scopes(self) -> list[Scope]:
        """The scopes with a detector, in door order."""
        return [s for s in Scope if s in self.detectors]

    def impl(self, scope: Scope) -> Any:
        """The detector of `scope` (KeyError when the pitfall has none there)."""
        return self.detectors[scope]

    def complete(self, finding: Finding) -> Finding:
        """Fill in code, name and (unless the detector chose one) the default severity, on a copy (a detector may
        keep its finding)."""
        done = finding.copy()
        done.code, done.name = self.code, self.name
        if done.severity is None:
            done.severity = self.severity
        return done

    def silence_advice(self, scope: "Scope | str") -> str:
        """One line on how to silence this pitfall in `scope`'s door."""
        return "Silence it with " + _DOORS[Scope(scope)][1].format(name=self.name) + "."

    # -- documentation ------------------------------------------------------------------------------
    def page(self) -> str:
        """The pitfall's docs page as Markdown (``docs/checks/<name>.md`` and ``torchdoctor explain``)."""
        doors = ", ".join(_DOORS[s][0] for s in self.scopes) or "none"
        parts = [
            f"# {self.name} ({self.code})",
            self.summary,
            f"Severity: **{self.severity}** · Found by: {doors} · Since: {self.since}"
            + ("" if self.origin == "built-in" else f" · From: {self.origin}"),
            "## Why it matters",
            self.why.strip(),
            "## How to fix",
            self.fix.strip(),
            "## Bad",
            *_example_blocks(self.bad, self.scopes, fires=True),
            "## Good",
            *_example_blocks(self.good, self.scopes, fires=False),
        ]
        details = [(Scope(k), v) for k, v in self.details.items()]
        if details:
            parts.append("## How torchdoctor finds it")
            for scope, text in sorted(details, key=lambda d: list(Scope).index(d[0])):
                parts += [f"### {_DOORS[scope][0]}", text.strip()]
        parts.append("## Silencing it")
        parts.append("\n".join(f"- {_DOORS[s][0]}: {_DOORS[s][1].format(name=self.name)}" for s in self.scopes))
        if self.silence:
            parts.append(self.silence.strip())
        return "\n\n".join(parts) + "\n"


def _example_blocks(example: Example, scopes: list[Scope], *, fires: bool) -> list[str]:
    blocks = [f"```{example.language}\n{example.code.strip()}\n```"]
    for scope in scopes:
        reason = example.unseen.get(str(scope))
        if reason:
            verb = "does not flag" if fires else "cannot check"
            blocks.append(f"{_DOORS[scope][0]} {verb} this example: {reason.strip()}")
    return blocks


def _scope(value: "Scope | str", name: str) -> Scope:
    try:
        return Scope(value)
    except ValueError:
        raise PitfallError(
            f"pitfall {name}: unknown scope {value!r} (one of {', '.join(s.value for s in Scope)})"
        ) from None


def _validate_handler(name: str, impl: type, attr: str, base: Callable[..., Any]) -> None:
    """An ``on_<event>`` handler must accept the arguments the session passes (those of the base class's
    handler), as pluggy verifies a hook implementation's signature when it is registered."""
    handler = getattr(impl, attr)
    if handler is base or not callable(handler):
        return
    expected = len(inspect.signature(base).parameters)  # self, and the event where there is one
    try:
        inspect.signature(handler).bind(*range(expected))
    except TypeError:
        raise PitfallError(
            f"pitfall {name}: {impl.__name__}.{attr}{inspect.signature(handler)} must accept the "
            f"arguments the session passes: {attr}{inspect.signature(base)}"
        ) from None
    except ValueError:
        return  # a builtin or C callable: its signature can't be read, so it is trusted


def _validate(name: str, scope: Scope, impl: Any) -> None:
    """Check that `impl` has the shape `scope`'s engine calls, so a bad detector fails at definition."""
    if scope in (Scope.RUNTIME, Scope.DISTRIBUTED):
        from torchdoctor.watch.contract import RuntimeCheck, handler_names

        if not (isinstance(impl, type) and issubclass(impl, RuntimeCheck)):
            raise PitfallError(f"pitfall {name}: the {scope} detector must be a RuntimeCheck subclass, not {impl!r}")
        known = handler_names()
        for attr in dir(impl):
            if attr.startswith("on_") and attr not in known:
                import difflib

                near = difflib.get_close_matches(attr, sorted(known), n=1)
                hint = f" (did you mean {near[0]}?)" if near else f" (known: {', '.join(sorted(known))})"
                raise PitfallError(f"pitfall {name}: {impl.__name__}.{attr} is not a watch event{hint}")
            if attr.startswith("on_"):
                _validate_handler(name, impl, attr, getattr(RuntimeCheck, attr))
        return
    if isinstance(impl, type) or not callable(impl):
        raise PitfallError(f"pitfall {name}: the {scope} detector must be a function, not {impl!r}")
    try:
        params = list(inspect.signature(impl).parameters.values())
    except (TypeError, ValueError):
        return  # a builtin or C callable: its signature can't be read, so it is trusted
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if len(required) > 1 or (not positional and not any(p.kind == p.VAR_POSITIONAL for p in params)):
        raise PitfallError(
            f"pitfall {name}: the {scope} detector {getattr(impl, '__name__', impl)} must take "
            "exactly one argument (the facts it inspects)"
        )
