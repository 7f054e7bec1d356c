"""Checkpoint-loading rules in source: `torch.load` without `weights_only`, `module.` prefixes cut off by slicing."""
from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING, Iterator, Optional

from torchdoctor.findings import Finding, Severity
from torchdoctor.lint.flow import literal
from torchdoctor.lint.index import CallSite, FunctionScope, ref
from torchdoctor.lint.source import Edit, FixableFinding, SourceFile, Spanned, end_of
from torchdoctor.registry import Scope, check

if TYPE_CHECKING:
    from typing import TypeGuard

_CONSUME = "torch.nn.modules.utils.consume_prefix_in_state_dict_if_present"
_SLICE_TEXT = re.compile(r"\[\s*(?:7|10|len\(\s*['\"][\w.]*\.['\"]\s*\))\s*:\s*\]")
# What a state dict is usually called; other dicts whose keys are sliced are not this pitfall.
_STATE_NAME = re.compile(r"state|sd\b|ckpt|checkpoint|weights|param|pretrained|model", re.I)


def _only_a_state_dict(load: CallSite, scope: FunctionScope) -> bool:
    """The loaded object only ever goes to `load_state_dict` (directly, or by a constant key)."""
    state_args = [c.node.args[0] for c in scope.calls if c.attr == "load_state_dict" and c.node.args]
    if any(a is load.node for a in state_args):
        return True
    names = [b.target for b in scope.bindings if b.value is load.node and not b.augmented]
    if len(names) != 1 or "." in names[0] or isinstance(names[0], tuple):
        return False
    name = names[0]
    allowed = {id(a) for a in state_args if isinstance(a, ast.Name) and a.id == name}
    allowed |= {id(a.value) for a in state_args
                if isinstance(a, ast.Subscript) and isinstance(a.value, ast.Name) and a.value.id == name
                and isinstance(a.slice, ast.Constant)}
    uses = [n for n in ast.walk(scope.node) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]
    return bool(uses) and all(id(n) in allowed for n in uses) and len(scope.bindings_of(name)) == 1


@check(code="TD503", name="unsafe-torch-load", scope=Scope.SOURCE, severity="warning",
       summary="torch.load without weights_only=True can run arbitrary code from the file.")
def unsafe_torch_load(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or "load(" not in src.text:
        return
    for scope in src.index.scopes:
        for call in scope.calls:
            if call.qualname != "torch.load" or call.has_star_kwargs or call.kwarg("pickle_module") is not None:
                continue
            flag = call.kwarg("weights_only")
            if flag is not None and literal(flag) is False:
                yield Finding(
                    f"`{src.snippet(call.node)}` unpickles with weights_only=False: loading the file runs whatever "
                    "code its pickle names, so a checkpoint from elsewhere can take over the machine.",
                    fix="Load with weights_only=True (allow your own classes with "
                        "torch.serialization.add_safe_globals([...])), or only load files you made.",
                    location=src.location(call.node),
                )
            elif flag is None:
                edits: tuple[Edit, ...] = ()
                if _only_a_state_dict(call, scope):
                    arguments: list[Spanned] = [*call.node.args, *call.node.keywords]
                    last = max(arguments, key=end_of)
                    edits = (Edit(src.end(last), src.end(last), ", weights_only=True"),)
                yield FixableFinding(
                    f"`{src.snippet(call.node)}` does not say weights_only: before torch 2.6 it unpickles "
                    "arbitrary objects (running any code the file names), and from 2.6 on it refuses files with "
                    "anything but tensors and plain containers, so the behaviour depends on the installed torch.",
                    fix="Say what you mean: `torch.load(..., weights_only=True)` for a state dict or checkpoint of "
                        "tensors; weights_only=False only for files you made yourself.",
                    location=src.location(call.node),
                    severity=Severity.INFO,
                    edits=edits,
                )


def _prefix(node: ast.Subscript) -> Optional[str]:
    """The prefix a `k[7:]`-style slice cuts: 7 -> 'module.', 10 -> '_orig_mod.', len('x.') -> 'x.'."""
    s = node.slice
    if not isinstance(s, ast.Slice) or s.upper is not None or s.step is not None:
        return None
    lower = s.lower
    if isinstance(lower, ast.Call) and isinstance(lower.func, ast.Name) and lower.func.id == "len" and len(lower.args) == 1:
        text = literal(lower.args[0])
        if isinstance(text, str):
            return text if text.endswith(".") else None
    number = literal(lower)
    return {7: "module.", 10: "_orig_mod."}.get(number) if type(number) is int else None


def _key_loops(tree: ast.AST) -> Iterator[tuple[ast.AST, str, ast.expr]]:
    """(loop or comprehension, key name, the state dict) for iterations over `sd.items()` / `sd.keys()`."""
    for node in ast.walk(tree):
        gens = node.generators if isinstance(node, (ast.DictComp, ast.ListComp, ast.SetComp, ast.GeneratorExp)) else None
        pairs = [(g.target, g.iter) for g in gens] if gens else (
            [(node.target, node.iter)] if isinstance(node, ast.For) else [])
        for target, iterable in pairs:
            if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Attribute) \
                    and iterable.func.attr in ("items", "keys") and not iterable.args:
                key = target.elts[0] if isinstance(target, ast.Tuple) and target.elts else target
                if isinstance(key, ast.Name):
                    yield node, key.id, iterable.func.value


@check(code="TD504", name="prefix-strip-by-slicing", scope=Scope.SOURCE, severity="warning",
       summary="State-dict keys stripped with k[7:]: every key that lacks the 'module.' prefix is silently mangled.")
def prefix_strip_by_slicing(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or ":]" not in src.text or not _SLICE_TEXT.search(src.text):
        return
    for loop, key, state in _key_loops(src.tree):
        if not _STATE_NAME.search(src.segment(state)):
            continue
        inside = list(ast.walk(loop))
        if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("startswith", "replace")
               and ref(n.func.value) == key for n in inside):
            continue  # guarded: only prefixed keys are cut
        for node in inside:
            if isinstance(node, ast.Subscript) and ref(node.value) == key and (prefix := _prefix(node)):
                yield FixableFinding(
                    f"`{src.snippet(node)}` cuts {len(prefix)} characters off every key of `{src.snippet(state)}`, "
                    f"assuming each one starts with '{prefix}': a key without it loses real characters "
                    "('conv1.weight' -> 'weight') and load_state_dict then reports missing and unexpected keys.",
                    fix=f'Strip the prefix only where it is present:\n{_CONSUME}(state_dict, "{prefix}")',
                    location=src.location(node),
                    edits=tuple(_prefix_edits(src, loop, key, state, node, prefix)),
                )
                break


def _prefix_edits(src: SourceFile, loop: ast.AST, key: str, state: ast.expr, cut: ast.Subscript,
                  prefix: str) -> Iterator[Edit]:
    """Rewrite the two canonical shapes, and only those, to `consume_prefix_in_state_dict_if_present`:

    `new = {k[7:]: v for k, v in sd.items()}`      -> `new = dict(sd)` + consume(new, 'module.')
    `new = OrderedDict()` + `for k, v in sd.items(): new[k[7:]] = v` (or via `name = k[7:]`)
                                                   -> `new = OrderedDict()` + `new.update(sd)` + consume(new, ...)
    """
    if src.tree is None or not src.imports_plain("torch") or ref(state) is None:
        return
    if isinstance(loop, ast.DictComp):
        gen = loop.generators[0]
        if loop.key is not cut or len(loop.generators) != 1 or gen.ifs or gen.is_async \
                or not _pair(gen.target) or ref(gen.target.elts[1]) != ref(loop.value):
            return
        stmt = next((s for s in ast.walk(src.tree) if isinstance(s, ast.Assign) and s.value is loop
                     and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)), None)
        name = ref(stmt.targets[0]) if stmt is not None else None
        if stmt is not None and name is not None and _own_lines(src, stmt):
            yield Edit(src.start(stmt), src.end(stmt), f'{name} = dict({src.segment(state)})\n'
                       f'{_indent(src, stmt)}{_CONSUME}({name}, "{prefix}")')
        return
    if not isinstance(loop, ast.For):
        return
    new = _loop_target_dict(loop, cut)
    if new is None or not _own_lines(src, loop) or not _starts_empty(src.tree, loop, new) \
            or _read_after(src.tree, loop, {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
                           | {t.id for s in loop.body for t in getattr(s, "targets", []) if isinstance(t, ast.Name)}):
        return
    yield Edit(src.start(loop), src.end(loop), f"{new}.update({src.segment(state)})\n"
               f'{_indent(src, loop)}{_CONSUME}({new}, "{prefix}")')


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
    if len(body) == 2 and body[0].value is cut and isinstance(body[0].targets[0], ast.Name) \
            and ref(store.slice) == body[0].targets[0].id:
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
    return isinstance(value, ast.Call) and not value.args and not value.keywords \
        and (ref(value.func) or "").split(".")[-1] in ("OrderedDict", "dict")


def _read_after(tree: ast.AST, loop: ast.For, names: set[str]) -> bool:
    """Whether the loop's own variables are read after it (the rewrite would leave them unbound)."""
    end = end_of(loop)[0]
    return any(isinstance(n, ast.Name) and n.id in names and isinstance(n.ctx, ast.Load)
               and n.lineno > end for n in ast.walk(tree))


def _own_lines(src: SourceFile, stmt: ast.stmt) -> bool:
    """Nothing but whitespace shares the statement's first and last lines."""
    (line, col), (end_line, end_col) = src.start(stmt), src.end(stmt)
    return not src.lines[line - 1][:col].strip() and not src.lines[end_line - 1][end_col:].strip()


def _indent(src: SourceFile, stmt: ast.stmt) -> str:
    return src.lines[stmt.lineno - 1][: src.start(stmt)[1]]
