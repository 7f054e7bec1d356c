"""Listening to loss calls (torch has no loss hooks), shared by the loss pitfalls.

`tap_losses` patches the named functions of ``torch.nn.functional`` with `MethodPatch` (the loss modules,
``nn.CrossEntropyLoss`` and friends, call those same functions) at the steps the session observes (for the rest
of the session once torch.compile compiled a graph, which may call them), and a check hears every `every`-th
call of each made at the observed steps: the call's tensors are handed to the check's listener for the
duration of the call only. A listener must keep nothing of them but numbers. Nothing runs while dynamo traces,
on fake tensors (torch.compile's tracing) or inside a torch.func transform.
"""

from __future__ import annotations

import ast
import functools
import linecache
from typing import Any, Callable, Optional

from torchdoctor.sdk import Location
from torchdoctor.sdk.runtime import MethodPatch, RuntimeCheck, is_library, user_frame

Listener = Callable[[str, Any, Any, dict], None]  # (function name, input, target, keyword arguments)

# Shape-preserving steps that stand between a softmax/sigmoid and the loss (view, reshape, squeeze, ...).
_PASS_THROUGH = (
    "View",
    "Reshape",
    "Squeeze",
    "Unsqueeze",
    "Permute",
    "Transpose",
    "Clone",
    "ToCopy",
    "Slice",
    "Select",
    "Index",
    "Expand",
    "TBackward",
    "AsStrided",
    "Flatten",
    "UnsafeView",
    "Alias",
    "Unbind",
)


def tap_losses(check: RuntimeCheck, names: tuple[str, ...], listener: Listener) -> None:
    """Call `listener` on every ``ctx.every``-th call of each ``torch.nn.functional.<name>`` (the first one
    included) made at the steps the check's session observes (the patch is off at the others); a listener that
    raises is reported once and goes quiet."""
    import torch.nn.functional as F

    skip = _not_now_probe()
    ctx = check.ctx
    every = ctx.every
    calls: dict[str, int] = {}
    broken: list[bool] = []

    def before(name: str, _obj: Any, args: tuple, kwargs: dict) -> None:
        if broken or skip() or not ctx.observing:  # (kept on for a compiled graph: unobserved steps too)
            return
        count = calls.get(name, 0)
        calls[name] = count + 1
        if count % every:
            return
        try:
            inp = args[0] if args else kwargs.get("input")
            target = args[1] if len(args) > 1 else kwargs.get("target")
            listener(name, inp, target, kwargs)
        except Exception as exc:  # never break the user's loss
            broken.append(True)
            check.ctx.fault(check, exc)

    graphs = _compiled_graphs()

    def compiled() -> bool:
        """torch.compile compiled a graph in the session: it may call the loss, and dynamo guards on the
        function it calls, so the patch stays on (taking it off and on would recompile that graph)."""
        return _compiled_graphs() > graphs

    for name in names:
        if callable(getattr(F, name, None)):  # a partial, not a closure: one Python call less per loss call
            check.ctx.hooks.add_observed(
                functools.partial(_patch, F, name, functools.partial(before, name)), keep=compiled
            )


def _patch(module: Any, name: str, before: Callable[..., None]) -> MethodPatch:
    return MethodPatch(module, name, before=before)


def _compiled_graphs() -> int:
    """The graphs dynamo compiled in this process so far (0 while dynamo was never imported)."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    try:
        return int(counters["stats"]["unique_graphs"]) if counters is not None else 0
    except Exception:
        return 0


def _not_now_probe() -> Callable[[], bool]:
    """True while dynamo traces, while a fake-tensor mode runs (torch.compile's AOT tracing and shape
    propagation run the functions of the graph on fake tensors, whose values can't be read), or inside a
    torch.func transform (functorch wrappers: no storage, no history)."""
    import torch

    compiling: Callable[[], bool] = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)
    mode: Callable[[Any], Any] = getattr(torch._C, "_get_dispatch_mode", None) or (lambda key: None)
    fake_key = getattr(getattr(torch._C, "_TorchDispatchModeKey", None), "FAKE", None)
    stack: Callable[[], Any] = getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack", None) or (
        lambda: None
    )
    # one expression: dynamo folds compiling() to True while it traces and never reaches the other calls
    return lambda: compiling() or (fake_key is not None and mode(fake_key) is not None) or stack() is not None


def produced_by(tensor: Any, names: tuple[str, ...], hops: int = 6) -> Optional[str]:
    """The autograd node among `names` (e.g. ``SoftmaxBackward0``) that made `tensor`, looking through
    shape-preserving steps (view, reshape, ...); None when the history shows another op (or none)."""
    fn = getattr(tensor, "grad_fn", None)
    for _ in range(hops):
        if fn is None:
            return None
        kind = type(fn).__name__
        if kind in names:
            return kind
        if not kind.startswith(_PASS_THROUGH) or not fn.next_functions:
            return None
        fn = fn.next_functions[0][0]
    return None


def user_location() -> Location:
    """The file and line of the user's code that called the loss (the innermost frame outside torch,
    torchdoctor, the training frameworks and installed libraries)."""
    frame = user_frame(1)
    if is_library(frame):
        return Location()
    return Location(file=frame.f_code.co_filename, line=frame.f_lineno)


def fixed_line(location: Location, edit: Callable[[ast.Call, str], Optional[str]]) -> Optional[str]:
    """The user's loss line (read from its file), unindented, with the first call that `edit` rewrites
    replaced by `edit`'s text; None when the line can't be read or parsed alone, or nothing matches."""
    if not location.file or not location.line:
        return None
    text = linecache.getline(location.file, location.line).strip()
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    calls = sorted(
        (n for n in ast.walk(tree) if isinstance(n, ast.Call)), key=lambda n: (n.col_offset, -(n.end_col_offset or 0))
    )
    for call in calls:
        replacement = edit(call, text)
        if replacement is not None:
            raw = text.encode()  # ast offsets count UTF-8 bytes
            return (raw[: call.col_offset] + replacement.encode() + raw[call.end_col_offset or 0 :]).decode()
    return None


def segment(text: str, node: ast.AST) -> str:
    return ast.get_source_segment(text, node) or ast.unparse(node)


def activation_argument(call: ast.Call, text: str, names: tuple[str, ...], layer: str) -> Optional[str]:
    """The tensor a softmax/sigmoid call on the line is applied to (`logits` in `torch.softmax(logits, 1)`,
    `out` in `out.sigmoid()`, `x` in `nn.Softmax(1)(x)`); None for any other call."""
    func = call.func
    if isinstance(func, ast.Call):
        inner = func.func
        name = inner.attr if isinstance(inner, ast.Attribute) else inner.id if isinstance(inner, ast.Name) else ""
        return segment(text, call.args[0]) if name == layer and call.args else None
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name not in names:
        return None
    if isinstance(func, ast.Attribute) and not _module_like(func.value):
        return segment(text, func.value)  # a method: `logits.softmax(dim=1)`
    return segment(text, call.args[0]) if call.args else None


def _module_like(node: ast.expr) -> bool:
    """`torch`, `F`, `nn.functional`, `torch.special`: where softmax/sigmoid are functions, not methods."""
    while isinstance(node, ast.Attribute):
        if node.attr in ("functional", "special", "nn"):
            return True
        node = node.value
    return isinstance(node, ast.Name) and node.id in ("torch", "F", "nn", "functional", "special", "self")
