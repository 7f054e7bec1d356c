"""prefix-strip-by-slicing: state-dict keys stripped with `k[7:]`, which mangles every key without the prefix."""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING, Iterator, Optional

from torchdoctor.sdk import WRAPPER_PREFIXES, Example, Finding, Fix, Pitfall
from torchdoctor.sdk.source import Edit, FixableFinding, SourceFile, end_of, literal, ref

if TYPE_CHECKING:
    from typing import TypeGuard

if TYPE_CHECKING:
    from typing import TypeGuard

_CONSUME = "torch.nn.modules.utils.consume_prefix_in_state_dict_if_present"
_SLICE_TEXT = re.compile(r"\[\s*(?:7|10|len\(\s*(?:['\"][\w.]*\.['\"]|\w+)\s*\))\s*:\s*\]")
# What a state dict is usually called; other dicts whose keys are sliced are not this pitfall.
_STATE_NAME = re.compile(r"state|sd\b|ckpt|checkpoint|weights|param|pretrained|model", re.I)

_SETUP = """
import torch
from torch import nn

model = nn.Linear(4, 2)
checkpoint = torch.load("model.pt", map_location="cpu", weights_only=True)
"""

PREFIX_STRIP_BY_SLICING = Pitfall(
    code="TD504",
    name="prefix-strip-by-slicing",
    severity="warning",
    summary="State-dict keys stripped with k[7:]: every key that lacks the 'module.' prefix is silently mangled.",
    why="""
        Checkpoints saved from `DataParallel`/`DistributedDataParallel` prefix keys with `module.` (and
        `torch.compile` with `_orig_mod.`). Cutting seven characters off every key breaks the moment one key lacks
        the prefix, e.g. a checkpoint saved without the wrapper: `conv1.weight` becomes `weight`, and
        `load_state_dict` reports missing and unexpected keys.
    """,
    fix="""
        Use `torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state_dict, "module.")`, which strips
        the prefix only where it is present. `torchdoctor lint --fix` rewrites the dict-comprehension form.
    """,
    bad=Example(
        """
        state = {k[7:]: v for k, v in checkpoint.items()}
        model.load_state_dict(state)
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        state = dict(checkpoint)
        torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state, "module.")
        model.load_state_dict(state)
        """,
        setup=_SETUP,
    ),
    details={
        "source": """
            Slices by 7 (`module.`), 10 (`_orig_mod.`), `len("prefix")` or `len(name)` (a name assigned once, to a
            string ending in a dot) of the key of a loop or comprehension over `.items()`/`.keys()` (also wrapped in
            `list(...)`, `tuple(...)` or `sorted(...)`) are reported, unless the key is checked with
            `startswith`/`replace` in the same loop.
        """,
    },
)


def _prefix(node: ast.Subscript, strings: dict[str, str]) -> Optional[str]:
    """The prefix a `k[7:]`-style slice cuts: 7 -> 'module.', 10 -> '_orig_mod.', len('x.') -> 'x.', and
    len(prefix) for a name bound once to a string (`strings`)."""
    s = node.slice
    if not isinstance(s, ast.Slice) or s.upper is not None or s.step is not None:
        return None
    lower = s.lower
    if (
        isinstance(lower, ast.Call)
        and isinstance(lower.func, ast.Name)
        and lower.func.id == "len"
        and len(lower.args) == 1
    ):
        arg = lower.args[0]
        text = strings.get(arg.id) if isinstance(arg, ast.Name) else literal(arg)
        if isinstance(text, str):
            return text if text.endswith(".") else None
    number = literal(lower)
    return {len(p): p for p in WRAPPER_PREFIXES}.get(number) if type(number) is int else None


def _key_loops(tree: ast.AST) -> Iterator[tuple[ast.AST, str, ast.expr]]:
    """(loop or comprehension, key name, the state dict) for iterations over `sd.items()` / `sd.keys()`."""
    for node in ast.walk(tree):
        gens = (
            node.generators if isinstance(node, (ast.DictComp, ast.ListComp, ast.SetComp, ast.GeneratorExp)) else None
        )
        pairs = (
            [(g.target, g.iter) for g in gens]
            if gens
            else ([(node.target, node.iter)] if isinstance(node, ast.For) else [])
        )
        for target, iterable in pairs:
            if (
                isinstance(iterable, ast.Call)
                and isinstance(iterable.func, ast.Name)
                and len(iterable.args) == 1
                and iterable.func.id in ("list", "tuple", "sorted")
            ):
                iterable = iterable.args[0]  # `for k, v in list(sd.items())` (a copy, to edit the dict)
            if (
                isinstance(iterable, ast.Call)
                and isinstance(iterable.func, ast.Attribute)
                and iterable.func.attr in ("items", "keys")
                and not iterable.args
            ):
                key = target.elts[0] if isinstance(target, ast.Tuple) and target.elts else target
                if isinstance(key, ast.Name):
                    yield node, key.id, iterable.func.value


def _string_names(tree: ast.Module) -> dict[str, str]:
    """Names assigned exactly once in the file, to a string literal (`prefix = "module."`)."""
    seen: dict[str, list[object]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    seen.setdefault(target.id, []).append(literal(node.value))
    return {name: values[0] for name, values in seen.items() if len(values) == 1 and isinstance(values[0], str)}


@PREFIX_STRIP_BY_SLICING.source
def prefix_strip_by_slicing(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or ":]" not in src.text or not _SLICE_TEXT.search(src.text):
        return
    strings = _string_names(src.tree)
    for loop, key, state in _key_loops(src.tree):
        if not _STATE_NAME.search(src.segment(state)):
            continue
        inside = list(ast.walk(loop))
        if any(
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr in ("startswith", "replace")
            and ref(n.func.value) == key
            for n in inside
        ):
            continue  # guarded: only prefixed keys are cut
        for node in inside:
            if isinstance(node, ast.Subscript) and ref(node.value) == key and (prefix := _prefix(node, strings)):
                edits = tuple(_prefix_edits(src, loop, key, state, node, prefix))
                if edits:  # the rewrite `lint --fix` applies, to paste over those lines by hand
                    lines = f"{edits[0].start[0]}" + (
                        f"-{edits[0].end[0]}" if edits[0].end[0] > edits[0].start[0] else ""
                    )
                    fix = Fix(
                        title=f"Strip the prefix only where it is present: replace line {lines} with",
                        code="\n".join(line.strip() for line in edits[0].text.splitlines()),
                    )
                else:
                    fix = Fix(
                        title="Strip the prefix only where it is present, in place:",
                        code=f'{_CONSUME}({src.snippet(state)}, "{prefix}")',
                    )
                yield FixableFinding(
                    f"`{src.snippet(node)}` cuts {len(prefix)} characters off every key of `{src.snippet(state)}`, "
                    f"assuming each one starts with '{prefix}': a key without it loses real characters "
                    "('conv1.weight' -> 'weight') and load_state_dict then reports missing and unexpected keys.",
                    fix=fix,
                    location=src.location(node),
                    edits=edits,
                )
                break


def _prefix_edits(
    src: SourceFile, loop: ast.AST, key: str, state: ast.expr, cut: ast.Subscript, prefix: str
) -> Iterator[Edit]:
    """Rewrite the two canonical shapes, and only those, to `consume_prefix_in_state_dict_if_present`:

    `new = {k[7:]: v for k, v in sd.items()}`      -> `new = dict(sd)` + consume(new, 'module.')
    `new = OrderedDict()` + `for k, v in sd.items(): new[k[7:]] = v` (or via `name = k[7:]`)
                                                   -> `new = OrderedDict()` + `new.update(sd)` + consume(new, ...)
    """
    if src.tree is None or not src.imports_plain("torch") or ref(state) is None:
        return
    if isinstance(loop, ast.DictComp):
        gen = loop.generators[0]
        if (
            loop.key is not cut
            or len(loop.generators) != 1
            or gen.ifs
            or gen.is_async
            or not _pair(gen.target)
            or ref(gen.target.elts[1]) != ref(loop.value)
        ):
            return
        stmt = next(
            (
                s
                for s in ast.walk(src.tree)
                if isinstance(s, ast.Assign)
                and s.value is loop
                and len(s.targets) == 1
                and isinstance(s.targets[0], ast.Name)
            ),
            None,
        )
        name = ref(stmt.targets[0]) if stmt is not None else None
        if stmt is not None and name is not None and _own_lines(src, stmt):
            yield Edit(
                src.start(stmt),
                src.end(stmt),
                f'{name} = dict({src.segment(state)})\n{_indent(src, stmt)}{_CONSUME}({name}, "{prefix}")',
            )
        return
    if not isinstance(loop, ast.For):
        return
    new = _loop_target_dict(loop, cut)
    if (
        new is None
        or not _own_lines(src, loop)
        or not _starts_empty(src.tree, loop, new)
        or _read_after(
            src.tree,
            loop,
            {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
            | {t.id for s in loop.body for t in getattr(s, "targets", []) if isinstance(t, ast.Name)},
        )
    ):
        return
    yield Edit(
        src.start(loop),
        src.end(loop),
        f'{new}.update({src.segment(state)})\n{_indent(src, loop)}{_CONSUME}({new}, "{prefix}")',
    )


def _pair(target: ast.expr) -> TypeGuard[ast.Tuple]:
    return isinstance(target, ast.Tuple) and len(target.elts) == 2 and all(isinstance(e, ast.Name) for e in target.elts)


def _loop_target_dict(loop: ast.For, cut: ast.Subscript) -> Optional[str]:
    """`new` when the loop is `for k, v in ...` and its body is exactly `new[k[7:]] = v`, or `name = k[7:]` then
    `new[name] = v`."""
    if not _pair(loop.target):
        return None
    value = ref(loop.target.elts[1])
    body = [s for s in loop.body if isinstance(s, ast.Assign) and len(s.targets) == 1]
    if loop.orelse or len(body) != len(loop.body):
        return None
    last = body[-1]
    store = last.targets[0]
    if not (isinstance(store, ast.Subscript) and isinstance(store.value, ast.Name) and ref(last.value) == value):
        return None
    if len(body) == 1 and store.slice is cut:
        return store.value.id
    if (
        len(body) == 2
        and body[0].value is cut
        and isinstance(body[0].targets[0], ast.Name)
        and ref(store.slice) == body[0].targets[0].id
    ):
        return store.value.id
    return None


def _block_of(tree: ast.AST, stmt: ast.stmt) -> list:
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and any(s is stmt for s in block):
                return block
    return []


def _starts_empty(tree: ast.AST, loop: ast.For, new: str) -> bool:
    """The statement right before the loop is `new = OrderedDict()` / `dict()` / `{}`."""
    block = _block_of(tree, loop)
    i = next(i for i, s in enumerate(block) if s is loop) if block else 0
    prev = block[i - 1] if i > 0 else None
    if not (isinstance(prev, ast.Assign) and len(prev.targets) == 1 and ref(prev.targets[0]) == new):
        return False
    value = prev.value
    if isinstance(value, ast.Dict):
        return not value.keys
    return (
        isinstance(value, ast.Call)
        and not value.args
        and not value.keywords
        and (ref(value.func) or "").split(".")[-1] in ("OrderedDict", "dict")
    )


def _read_after(tree: ast.AST, loop: ast.For, names: set[str]) -> bool:
    """Whether the loop's own variables are read after it (the rewrite would leave them unbound)."""
    end = end_of(loop)[0]
    return any(
        isinstance(n, ast.Name) and n.id in names and isinstance(n.ctx, ast.Load) and n.lineno > end
        for n in ast.walk(tree)
    )


def _own_lines(src: SourceFile, stmt: ast.stmt) -> bool:
    """Nothing but whitespace shares the statement's first and last lines."""
    (line, col), (end_line, end_col) = src.start(stmt), src.end(stmt)
    return not src.lines[line - 1][:col].strip() and not src.lines[end_line - 1][end_col:].strip()


def _indent(src: SourceFile, stmt: ast.stmt) -> str:
    return src.lines[stmt.lineno - 1][: src.start(stmt)[1]]
