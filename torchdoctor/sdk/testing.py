"""Run a pitfall's Bad/Good examples through its own detectors — the contract every pitfall keeps.

``run_example(pitfall, pitfall.bad, "source")`` returns that detector's findings for the example: the
contract test asserts the Bad example fires and the Good one stays quiet in every door that can see it
(`Example.runnable`). Plug-in authors can call it from their own tests the same way.

Checkpoint files are checked as ``check-ckpt --scan-values`` does, and compared with the example's `model`
when it binds an ``nn.Module`` (as ``check-ckpt --model`` does).

``paste_problems(pitfall, "source")`` is the contract of the fixes: the code every finding of the Bad
example proposes must parse, and must be what makes the Good example good (Good = Bad with the fix's code
pasted in); a checkpoint fix's code must run when pasted after the Bad example.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterator

from torchdoctor.findings import Finding
from torchdoctor.pitfall import Example, Pitfall, PitfallError, Scope

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar", ".safetensors", ".pkl")


def run_example(pitfall: Pitfall, example: Example, scope: "Scope | str") -> list[Finding]:
    """The findings of `pitfall`'s `scope` detector on `example` (only this pitfall's, folded)."""
    scope = Scope(scope)
    if scope not in pitfall.detectors:
        raise PitfallError(f"pitfall {pitfall.name} has no {scope} detector")
    if not example.runnable(scope):
        raise PitfallError(f"pitfall {pitfall.name}: this example is not runnable in {scope}")
    runner = {Scope.SOURCE: _lint, Scope.RUNTIME: _watch, Scope.CHECKPOINT: lambda p, e: _check_files(p, e)[0]}.get(
        scope
    )
    if runner is None:
        raise PitfallError(
            f"pitfall {pitfall.name}: {scope} examples can't run in one process; "
            f"give Example(unseen={{'{scope}': why}})"
        )
    return [f for f in runner(pitfall, example) if f.name == pitfall.name]


def paste_problems(pitfall: Pitfall, scope: "Scope | str") -> list[str]:
    """What breaks the fixes contract in `scope` (empty when it holds): each code snippet the Bad example's
    findings propose (a fix's code, and statements quoted in its title) must parse; a checkpoint fix's code
    must run when pasted after the Bad example, in its namespace and folder; any other fix's code lines must
    all be in the Good example, unless the Good example's `recipe` says why its fix is a recipe."""
    scope = Scope(scope)
    bad, good = pitfall.bad, pitfall.good
    if scope == Scope.CHECKPOINT:
        return _check_files(pitfall, bad, paste=True)[1]
    problems = []
    found = run_example(pitfall, bad, scope)
    good_lines = {_code_line(line) for line in (good.setup + "\n" + good.code).splitlines()}
    for finding in found:
        for snippet in _snippets(finding):
            if not any(_parses(snippet + end) for end in ("", " pass", "\ndef _(): pass")):  # a decorator last
                problems.append(f"{pitfall.name} [{scope}]: the fix's code does not parse: {snippet!r}")
            elif str(scope) not in good.recipe:
                missing = [
                    line
                    for line in map(_code_line, snippet.splitlines())
                    if line and line != "..." and line not in good_lines
                ]
                if missing:
                    problems.append(
                        f"{pitfall.name} [{scope}]: the Good example is not the Bad one with the fix "
                        f"pasted in; it lacks {missing} (or say why in Example(recipe=...))"
                    )
    return problems


def _snippets(finding: Finding) -> list[str]:
    """The code a finding's fix proposes: its code block, and the first snippet quoted in its title when that
    is a statement (`total += loss.item()`; alternatives may follow it, expressions are not pasted)."""
    fix = finding.fix
    if fix is None:
        return []
    out = [fix.code] if fix.code else []
    quoted = re.search(r"`([^`]+)`", fix.title)
    first = quoted.group(1) if quoted else ""
    for text in (first, first + " pass") if first else ():  # ` pass`: a block header such as `with x:`
        if _parses(text):
            body = ast.parse(text).body
            if body and not isinstance(body[0], ast.Expr):  # a statement, not a name or an expression
                out.append(first)
            break
    return out


def _parses(text: str) -> bool:
    try:
        ast.parse(text)
    except SyntaxError:
        return False
    return True


def _code_line(line: str) -> str:
    """A line of code as the contract compares it: without indentation and a trailing `  # comment`."""
    text = line.split("  #", 1)[0].strip()
    return "" if text.startswith("#") else text


def _lint(pitfall: Pitfall, example: Example) -> list[Finding]:
    from torchdoctor.lint.runner import check_source, read_source

    setup, code = example.setup, example.code  # flush left already (Example cleans them)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "example.py"
        path.write_text(setup + "\n" + code, encoding="utf-8")
        return check_source(read_source(str(path), "example.py"), [pitfall])


def _watch(pitfall: Pitfall, example: Example) -> list[Finding]:
    from torchdoctor.watch.session import watch

    setup, code = example.setup, example.code  # flush left already (Example cleans them)
    namespace: dict[str, Any] = {"__name__": "__example__"}
    with _in_empty_folder(), _torch_switches_kept(), _source_shown(setup=setup, code=code):
        exec(compile(setup, "<example setup>", "exec"), namespace)
        if "model" not in namespace:
            raise PitfallError(f"pitfall {pitfall.name}: a runtime example's setup must bind `model`")
        session = watch(
            namespace["model"],
            namespace.get("optimizer"),
            checks=[pitfall.name],
            on_finding=lambda finding: None,
            report=False,
        )
        try:
            with session:
                exec(compile(code, "<example>", "exec"), namespace)
        except Exception:
            if example is not pitfall.bad or not _explains_crashes(pitfall):
                raise  # only a crash pitfall's Bad example may end with the error it explains
    return session.findings


@contextlib.contextmanager
def _source_shown(setup: str, code: str) -> Iterator[None]:
    """The example's lines readable through `linecache` while it runs, as a file's are: runtime checks quote
    the user's line in their fixes."""
    import linecache

    names = {"<example setup>": setup, "<example>": code}
    for name, text in names.items():
        linecache.cache[name] = (len(text), None, text.splitlines(True), name)
    try:
        yield
    finally:
        for name in names:
            linecache.cache.pop(name, None)


def _explains_crashes(pitfall: Pitfall) -> bool:
    """Whether the pitfall's runtime detector handles the CRASH event (its Bad example raises)."""
    from torchdoctor.watch.contract import Event, RuntimeCheck

    check = pitfall.detectors.get(Scope.RUNTIME)
    return isinstance(check, type) and issubclass(check, RuntimeCheck) and Event.CRASH in check.subscribed_events()


def _check_files(pitfall: Pitfall, example: Example, paste: bool = False) -> tuple[list[Finding], list[str]]:
    """The findings on the checkpoints the example writes; with `paste`, also what goes wrong when the code of
    each fix is run after the example (in a copy of its namespace, in its folder)."""
    from torchdoctor.ckpt.api import check_checkpoint

    setup, code = example.setup, example.code  # flush left already (Example cleans them)
    findings: list[Finding] = []
    problems: list[str] = []
    namespace: dict[str, Any] = {"__name__": "__example__"}
    with _in_empty_folder() as folder:
        exec(compile(setup + "\n" + code, "<example>", "exec"), namespace)
        written = sorted(p for p in folder.rglob("*") if p.suffix in CHECKPOINT_SUFFIXES)
        if not written:
            raise PitfallError(f"pitfall {pitfall.name}: the checkpoint example wrote no checkpoint file")
        model = namespace.get("model")
        for path in written:
            findings += [
                f
                for f in check_checkpoint(
                    path, model if _is_module(model) else None, select=[pitfall.name], scan_values=True
                ).findings
                if f.name == pitfall.name
            ]
        for snippet in (s for f in findings for s in _snippets(f)) if paste else ():
            before = {path: path.read_bytes() for path in written}
            try:
                with _safe_globals_kept():
                    exec(compile(snippet, "<fix>", "exec"), dict(namespace))
            except Exception as exc:
                problems.append(
                    f"{pitfall.name} [checkpoint]: the fix fails when pasted after the Bad example: "
                    f"{type(exc).__name__}: {exc}\n{snippet}"
                )
                continue
            for path in (p for p in written if p.read_bytes() != before[p]):  # a fix that rewrites the file
                if any(f.name == pitfall.name for f in check_checkpoint(path, select=[pitfall.name]).findings):
                    problems.append(f"{pitfall.name} [checkpoint]: {path.name} rewritten by the fix is still flagged")
                path.write_bytes(before[path])
    return findings, problems


def _is_module(value: Any) -> bool:
    """An `nn.Module` (what ``check-ckpt --model`` compares a checkpoint with)."""
    import torch

    return isinstance(value, torch.nn.Module)


@contextlib.contextmanager
def _in_empty_folder() -> Iterator[Path]:
    """Run an example in a fresh working folder, so files it writes go nowhere else."""
    old = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(old)


@contextlib.contextmanager
def _safe_globals_kept() -> Iterator[None]:
    """Undo `torch.serialization.add_safe_globals` calls a pasted fix makes (they are process-wide)."""
    import torch.serialization

    saved = torch.serialization.get_safe_globals()
    try:
        yield
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(saved)


@contextlib.contextmanager
def _torch_switches_kept() -> Iterator[None]:
    """Undo the process-wide torch switches an example may flip (cuDNN modes, deterministic algorithms, the
    number of threads), so one example never changes how the next one, or the caller's own tests, run."""
    import torch

    cudnn = torch.backends.cudnn
    saved = (
        cudnn.benchmark,
        cudnn.deterministic,
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        cudnn.benchmark, cudnn.deterministic = saved[0], saved[1]
        torch.use_deterministic_algorithms(saved[2], warn_only=saved[3])
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
