"""Seeing the watched modules' forwards for the cost of one Python call: a shared patch of
``nn.Module._call_impl``.

torch's global forward hooks send *every* module call of the process down the slow path of ``_call_impl``
(hook dictionaries, a closure, two hook calls), 2–3% of a 1 ms training step of a 6-module MLP on their
own (measured: tests/benchmarks/bench_watch.py's mlp3, no-op hooks). This patch wraps ``_call_impl`` on the
``nn.Module`` class instead: a call of a module that no session watches costs a dict lookup, and nothing of
ours lands in the user's modules, so ``torch.save(model)`` and ``copy.deepcopy(model)`` carry nothing of
watch. Shared by the live sessions (one patch, removed with its last listener), like
`torchdoctor.watch.patches.LoaderPatch`.

Under dynamo the wrapper calls the original at once (``torch.compiler.is_dynamo_compiling()`` is folded to
True while it traces), so compiled graphs get no break and no guard on our state.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Protocol

import torch
from torch import nn

# True while dynamo traces (it folds the call to True); in eager one trivial call, checked on every module call.
# Also for the module hooks of the checks: dynamo inlines a hook into the compiled forward, where it must add
# nothing (no graph break, no guard on our state)
_is_compiling: Callable[[], bool] = (
    getattr(getattr(torch, "compiler", None), "is_dynamo_compiling", None) or torch._dynamo.is_compiling
)
dynamo_tracing = _is_compiling
_grad_enabled = torch.is_grad_enabled


class CallListener(Protocol):
    """What a session gives the patch. `_depth` counts the calls of its modules running now (the patch keeps
    it); `_roots` holds the ids of the modules whose every call it wants to hear of. `_forward` is called
    after (also after a raise: `output` None) each call of a root, and of any listened module called at
    depth 0 (outside every other call of the listener's modules), unless `_quiet` holds the call's kind
    ``(id(module), module.training, torch.is_grad_enabled())``: the kinds it need not hear of now (None: all)."""

    _depth: int
    _roots: dict[int, Any]
    _quiet: Optional[set[tuple[int, bool, bool]]]

    def _forward(self, module: nn.Module, args: Any, output: Any) -> None:
        """A call of `module` returned `output` (None: it raised)."""

    def _transformed(self, module: nn.Module) -> None:
        """`module`, which no session listens to, returned inside a ``torch.func`` transform (a vmap ensemble's
        stateless base model, called through ``functional_call``)."""


# id(module) -> the listeners of its calls; the patch is on while any listener is
_listening: dict[int, tuple[CallListener, ...]] = {}
# id(module) -> its one listener, for the modules that listener does not report every call of (a model's
# submodules): called while that listener's depth is above 0, they need nothing (the commonest call by far)
_inner: dict[int, CallListener] = {}
_listeners: list["CallPatch"] = []
_original: list[Callable[..., Any]] = []
# the listeners that want the transformed calls of other modules too (`CallPatch(..., transformed=True)`)
_transformed: list[CallListener] = []
# `RootPatch` listeners, told of each outermost module call; `_inside.call`: a module call runs in this thread
_root_listeners: list[Callable[[nn.Module], None]] = []
_inside = threading.local()
_functorch_stack: Any = getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack", None)


def _call_impl(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    if _is_compiling():
        return _original[0](self, *args, **kwargs)
    if _root_listeners and not getattr(_inside, "call", False):
        return _outermost(self, args, kwargs)
    key = id(self)
    inner = _inner.get(key)
    if inner is not None and inner._depth:  # a submodule inside its model's forward
        return _original[0](self, *args, **kwargs)
    listeners = _listening.get(key)
    if listeners is None:
        if not _transformed or _functorch_stack is None or _functorch_stack() is None:
            return _original[0](self, *args, **kwargs)
        output = _original[0](self, *args, **kwargs)
        _tell_transformed(self)
        return output
    for listener in listeners:
        listener._depth += 1
    output = None
    try:
        output = _original[0](self, *args, **kwargs)
    finally:  # the listeners' depths, and `_forward` where it is due (here, not in a helper: a call less)
        for listener in listeners:
            listener._depth = depth = listener._depth - 1 if listener._depth > 0 else 0
            if not depth or key in listener._roots:  # else: a submodule inside the model's forward
                quiet = listener._quiet  # the commonest call, a usual forward at a quiet step, needs no call
                if quiet is None or (key, self.training, _grad_enabled()) not in quiet:
                    listener._forward(self, args, output)
    return output


def _tell_transformed(module: nn.Module) -> None:
    for listener in _transformed:
        listener._transformed(module)


def _tell_roots(module: nn.Module) -> None:
    for listener in list(_root_listeners):
        try:
            listener(module)
        except Exception:  # never into the user's forward (a listener only notes the module)
            pass


def _outermost(module: nn.Module, args: Any, kwargs: Any) -> Any:
    """A module call made outside every other module call of its thread while some `RootPatch` listens: tell
    them, then make the call (the calls inside it see `_inside.call` set and take the usual path)."""
    _tell_roots(module)
    _inside.call = True
    try:
        return _call_impl(module, *args, **kwargs)
    finally:
        _inside.call = False


def _skip_frames(*listener_codes: Any) -> None:
    """Tell dynamo never to start compiling at the patch's frames (it compiles the frames they call, and
    still inlines `_call_impl` into a frame it traces). A compiled module's ``__call__`` enters the patch
    first, and dynamo compiles the first frame outside torch: without this, every compiled module would share
    the patch's cache (and its recompile limit), and dynamo's messages would name our file. The listeners run
    there too, inside the compiled module's call: dynamo must not compile them (`listener_codes`: their
    ``_forward``), nor anything they call (the checks' handlers)."""
    eval_frame = getattr(getattr(torch, "_dynamo", None), "eval_frame", None)
    strategy = getattr(eval_frame, "set_code_exec_strategy", None)
    make, action = getattr(eval_frame, "FrameExecStrategy", None), getattr(eval_frame, "FrameAction", None)
    if strategy is None or make is None or action is None:
        return
    for code in (_call_impl.__code__, _outermost.__code__):
        strategy(code, make(action.SKIP, action.DEFAULT))
    for code in (_tell_transformed.__code__, _tell_roots.__code__, *listener_codes):
        strategy(code, make(action.SKIP, action.SKIP))


def _sort(key: int) -> None:
    """Whether the module `key` takes the fast path of `_inner`: one listener, which does not report its
    every call."""
    listeners = _listening.get(key, ())
    if len(listeners) == 1 and key not in listeners[0]._roots:
        _inner[key] = listeners[0]
    else:
        _inner.pop(key, None)


class CallPatch:
    """Handle of one session's listener on the calls of some modules (`listen` adds more); ``remove()``
    unsubscribes it and takes the patch off when no session listens any more."""

    def __init__(self, listener: CallListener, transformed: bool = False) -> None:
        self.listener = listener
        self.transformed = transformed
        if transformed:
            _transformed.append(listener)
        self.ids: set[int] = set()
        _install()
        _skip_frames(listener._forward.__code__)
        _listeners.append(self)

    def listen(self, modules: Any) -> None:
        """Also listen to the calls of `modules` (the listener's `_roots` already name those of them whose every
        call it wants)."""
        for module in modules:
            key = id(module)
            if key not in self.ids:
                self.ids.add(key)
                _listening[key] = (*_listening.get(key, ()), self.listener)
            _sort(key)

    def remove(self) -> None:
        for key in self.ids:
            rest = tuple(x for x in _listening.get(key, ()) if x is not self.listener)
            if rest:
                _listening[key] = rest
            else:
                _listening.pop(key, None)
            _sort(key)
        self.ids = set()
        if self.transformed and self.listener in _transformed:
            _transformed.remove(self.listener)
        if self in _listeners:
            _listeners.remove(self)
        _release()


class RootPatch:
    """Handle of a listener told of every outermost module call (one made while no other module's call runs
    in its thread), with the module; ``remove()`` unsubscribes it. Unlike torch's global module hooks, it
    never changes what dynamo guards on, so installing or removing it never recompiles a compiled model."""

    def __init__(self, listener: Callable[[nn.Module], None]) -> None:
        self.listener = listener
        _install()
        _root_listeners.append(listener)

    def remove(self) -> None:
        if self.listener in _root_listeners:
            _root_listeners.remove(self.listener)
            _release()


def _install() -> None:
    """Put the patch on ``nn.Module`` unless it is there."""
    if not _listeners and not _root_listeners and nn.Module.__dict__.get("_call_impl") is not _call_impl:
        _original[:] = [nn.Module.__dict__["_call_impl"]]  # kept after removal: a later patch may chain ours
        _skip_frames()
        nn.Module._call_impl = _call_impl  # type: ignore[method-assign]


def _release() -> None:
    """Take the patch off when nothing listens any more."""
    if not _listeners and not _root_listeners and nn.Module.__dict__.get("_call_impl") is _call_impl:
        nn.Module._call_impl = _original[0]  # type: ignore[method-assign]
