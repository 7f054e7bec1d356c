"""Adoption: a running watch session takes on optimizers (and their models) that it was not given.

Torch tells us of every optimizer step through a public global hook
(``torch.optim.optimizer.register_optimizer_step_pre_hook``). `Follower` installs one for a session: the
first step of an optimizer the session does not watch yet adopts it (its own step and zero_grad hooks are
installed there and then, so that very step already reaches the checks), if `wanted` says so:

- ``watch(model)`` adopts an optimizer that steps parameters of a watched model (built after the session
  started, or a new one for a second fine-tuning stage);
- ``torchdoctor run`` adopts every optimizer and finds its models from the parameters it steps, among the
  outermost modules called since the session began (`RootTracker`: a listener on watch's module-call patch,
  removed again while no optimizer waits for its models).

An adopted optimizer whose parameters a newer adopted optimizer steps is retired (its hooks removed, and
the session drops it), so that a finished stage's optimizer state is not kept alive by the session.
"""

from __future__ import annotations

import functools
import weakref
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import torch
from torch import nn

from torchdoctor.watch.calls import RootPatch
from torchdoctor.watch.context import WatchedModel, WatchedOptimizer
from torchdoctor.wrappers import unwrap, unwrap_optimizer

if TYPE_CHECKING:
    from torchdoctor.watch.session import WatchSession

# The outermost modules called most recently, kept weakly; a script calls few distinct ones.
_MAX_ROOTS = 64
_is_compiling: Callable[[], bool] = (
    getattr(getattr(torch, "compiler", None), "is_compiling", None) or torch._dynamo.is_compiling
)


class RootTracker:
    """The outermost modules the program calls (a module called while no other module's forward runs in its
    thread), kept weakly, newest last. Installed only while some optimizer waits for its models: a listener
    on watch's patch of ``nn.Module._call_impl`` (`RootPatch`), not torch's global module hooks, whose coming
    and going would make dynamo recompile a compiled model (it guards on their number)."""

    def __init__(self) -> None:
        self.roots: dict[int, "weakref.ReferenceType[nn.Module]"] = {}
        self._patch: Optional[RootPatch] = None

    @property
    def installed(self) -> bool:
        return self._patch is not None

    def install(self) -> None:
        if self._patch is None:
            self._patch = RootPatch(self._enter)

    def remove(self) -> None:
        if self._patch is not None:
            self._patch.remove()
            self._patch = None

    def _enter(self, module: nn.Module) -> None:
        if id(module) not in self.roots:
            if len(self.roots) >= _MAX_ROOTS:
                self.roots.pop(next(iter(self.roots)))
            self.roots[id(module)] = weakref.ref(module, functools.partial(_forget, self.roots, id(module)))

    def alive(self) -> list[nn.Module]:
        return [m for ref in list(self.roots.values()) if (m := ref()) is not None]


def _forget(roots: dict[int, Any], key: int, ref: Any) -> None:
    """A root module was freed: drop its entry (unless a new module took its id meanwhile)."""
    if roots.get(key) is ref:
        del roots[key]


def models_of(params: Sequence[torch.Tensor], roots: list[nn.Module], known: set[int]) -> list[nn.Module]:
    """The outermost of `roots` that hold any of `params` (a module inside another candidate is dropped),
    with the roots whose parameters hold gradients (the same backward reached them; an optimizer that
    leaves them out is a finding), leaving out those whose unwrapped model is in `known` (ids). Parts of one
    model called one by one are replaced by the model that holds them all."""
    ids = {id(p) for p in params}
    candidates = [m for m in roots if id(unwrap(m)[0]) not in known and any(id(p) in ids for p in m.parameters())]
    if candidates:  # modules called alongside that got gradients too (trained by this backward, stepped or not)
        candidates += [
            m
            for m in roots
            if m not in candidates
            and id(unwrap(m)[0]) not in known
            and any(p.grad is not None and p.requires_grad for p in m.parameters())
        ]
    inside = {id(sub) for m in candidates for sub in m.modules() if sub is not m}
    outermost = [m for m in candidates if id(m) not in inside]
    if len(outermost) > 1:  # parts of one model called one by one (Lightning's training_step): the model
        owner = common_owner(outermost)
        if owner is not None and id(unwrap(owner)[0]) not in known:
            return [owner]
    return outermost


def _parent(module: nn.Module) -> Optional[nn.Module]:
    """The module that holds `module` as a child, found through the garbage collector's referrers (asked
    only when an optimizer's parameters lie in several separately called modules, once per optimizer)."""
    import gc

    for holder in gc.get_referrers(module):
        if not isinstance(holder, dict) or not any(v is module for v in holder.values()):
            continue
        for owner in gc.get_referrers(holder):
            if isinstance(owner, nn.Module) and owner.__dict__.get("_modules") is holder:
                return owner
            if isinstance(owner, dict) and owner.get("_modules") is holder:  # the module's __dict__
                for module_of in gc.get_referrers(owner):
                    if isinstance(module_of, nn.Module) and module_of.__dict__ is owner:
                        return module_of
    return None


def common_owner(parts: list[nn.Module], depth: int = 6) -> Optional[nn.Module]:
    """The nearest module that contains every one of `parts` (None when there is none within `depth` levels)."""
    ids = {id(p) for p in parts}
    owner: Optional[nn.Module] = parts[0]
    for _ in range(depth):
        owner = _parent(owner) if owner is not None else None
        if owner is None:
            return None
        if ids <= {id(m) for m in owner.modules()}:
            return owner
    return None


class Follower:
    """Adopts, into `session`, the optimizers it does not watch yet as they step (see the module docs).

    `discover=True` (``torchdoctor run``): every optimizer, and its models found from the modules called.
    `discover=False` (``watch(model)``): only an optimizer that steps a parameter of a watched model.
    """

    def __init__(self, session: "WatchSession", discover: bool) -> None:
        self.session = session
        self.discover = discover
        self.tracker = RootTracker()
        self.known: "weakref.WeakSet[Any]" = weakref.WeakSet()  # torch optimizers seen (watched or passed over)
        self.waiting: "weakref.WeakSet[Any]" = weakref.WeakSet()  # adopted, models not found yet
        self.retired: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self.keep_all = False  # set once a retired optimizer stepped again: both stay
        self.adopted: list[str] = []  # labels of the optimizers adopted, in order
        self.retired_steps: dict[str, int] = {}  # label -> steps, of the optimizers retired
        self._handle: Any = None
        # id -> weak reference of the optimizers known and not waiting: the check at every step is one lookup
        self._settled: dict[int, "weakref.ReferenceType[Any]"] = {}

    def install(self) -> "Follower":
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        ctx = self.session._ctx
        assert ctx is not None
        for wo in ctx.optimizers:
            self.known.add(wo.optimizer)
        self._handle = register_optimizer_step_pre_hook(self._on_step)
        if self.discover:
            self.tracker.install()
        return self

    def facts(self) -> dict[str, Any]:
        """What the report says of adoption: the optimizers adopted and those retired (with their steps)."""
        out: dict[str, Any] = {}
        if self.adopted:
            out["adopted_optimizers"] = list(self.adopted)
        if self.retired_steps:
            out["retired_optimizers"] = [{"label": k, "steps": v} for k, v in self.retired_steps.items()]
        return out

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self.tracker.remove()

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        settled = self._settled.get(id(optimizer))
        if settled is not None and settled() is optimizer:
            return
        if optimizer in self.known and optimizer not in self.waiting:
            try:
                self._settled[id(optimizer)] = weakref.ref(optimizer)
            except TypeError:  # an optimizer without weak references: the sets above keep answering
                pass
            return
        if _is_compiling():
            return
        try:
            self._adopt(optimizer)
        except Exception as exc:  # never break the user's step: say it once, and leave this optimizer alone
            self.known.add(optimizer)
            self.waiting.discard(optimizer)
            self.session.hook_errors.append(
                f"could not follow {type(optimizer).__name__} ({type(exc).__name__}: {exc})"
            )

    def _adopt(self, optimizer: Any) -> None:
        ctx = self.session._ctx
        if ctx is None:
            return
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if optimizer in self.waiting:  # adopted at an earlier step; its models may have been called since
            self._adopt_models(optimizer, params)
            return
        self.known.add(optimizer)
        watched = ctx.model_param_ids()
        if not self.discover and not any(id(p) in watched for p in params):
            return  # another model's optimizer (a GAN's other half): not this session's
        if optimizer in self.retired:
            self.keep_all = True
        elif not self.keep_all:
            self._retire_superseded(params)
        wo = adopt_optimizer(self.session, optimizer)
        if wo is not None:
            self.adopted.append(wo.label)
        if self.discover:
            self._adopt_models(optimizer, params)

    def _adopt_models(self, optimizer: Any, params: list[torch.Tensor]) -> None:
        ctx = self.session._ctx
        assert ctx is not None
        known = {id(wm.inner) for wm in ctx.models}
        found = models_of(params, self.tracker.alive(), known)
        for model in found:
            adopt_model(self.session, model)
        if any(isinstance(m, nn.parallel.DistributedDataParallel) for m in found):
            self.session.enable_distributed()  # the cross-rank checks, now that the script's process group is up
        held = ctx.model_param_ids()
        if any(id(p) in held for p in params):
            self.waiting.discard(optimizer)
        else:  # no module holding its parameters was called yet (or the tracker was off): look again next step
            self.waiting.add(optimizer)
        if self.waiting:
            self.tracker.install()
        else:
            self.tracker.remove()
            self.tracker.roots.clear()

    def adopt_called_models(self) -> None:
        """Before a crash is explained: with no model found yet (the program died before its first step),
        watch the outermost modules with parameters that it called, so that the explanation can name them."""
        ctx = self.session._ctx
        if not self.discover or ctx is None or ctx.models:
            return
        roots = [m for m in self.tracker.alive() if next(m.parameters(), None) is not None]
        params = [p for m in roots for p in m.parameters()]
        for model in models_of(params, roots, set()):
            adopt_model(self.session, model)

    def _retire_superseded(self, params: list[torch.Tensor]) -> None:
        """Drop the adopted optimizers whose parameters the new one steps (a new fine-tuning stage)."""
        ctx = self.session._ctx
        assert ctx is not None
        ids = {id(p) for p in params}
        for wo in list(ctx.optimizers):
            if isinstance(wo, AdoptedOptimizer) and any(id(p) in ids for p in wo.params()):
                retire_optimizer(self.session, wo)
                self.retired.add(wo.optimizer)
                self.retired_steps[wo.label] = wo.steps


class AdoptedOptimizer(WatchedOptimizer):
    """An optimizer the session adopted as it stepped; `handles` are its hooks (removed when it retires)."""

    def __init__(self, optimizer: Any, label: str) -> None:
        super().__init__(optimizer, label)
        self.handles: list[Any] = []


def _label(kind: str, taken: list[str]) -> str:
    """`kind`, numbered when a watched object already has that label (``Adam#2``)."""
    if kind not in taken and not any(t.startswith(kind + "#") for t in taken):
        return kind
    n = 2
    while f"{kind}#{n}" in taken:
        n += 1
    return f"{kind}#{n}"


def adopt_optimizer(session: "WatchSession", optimizer: Any) -> Optional[AdoptedOptimizer]:
    """Watch `optimizer` from now on in the running `session`: its step and zero_grad events reach the checks."""
    ctx, hub = session._ctx, session._hub
    if ctx is None or hub is None:
        return None
    inner = unwrap_optimizer(optimizer)[0]
    if any(wo.optimizer is inner for wo in ctx.optimizers):
        return None
    wo = AdoptedOptimizer(optimizer, _label(type(inner).__name__, [w.label for w in ctx.optimizers]))
    wo.handles = hub.add_optimizer(wo)
    ctx.optimizers.append(wo)
    return wo


def adopt_model(session: "WatchSession", model: nn.Module) -> Optional[WatchedModel]:
    """Watch `model` from now on in the running `session` (its forwards, its parameters' names)."""
    ctx, hub = session._ctx, session._hub
    if ctx is None or hub is None:
        return None
    wm = WatchedModel(model, _label(type(unwrap(model)[0]).__name__, [m.label for m in ctx.models]))
    ctx.models.append(wm)
    ctx.forget_names()
    hub.add_model(wm)
    return wm


def retire_optimizer(session: "WatchSession", wo: WatchedOptimizer) -> None:
    """Stop watching `wo`: its hooks come off and the session forgets it (its last step count is kept)."""
    ctx = session._ctx
    if ctx is None:
        return
    for handle in wo.handles if isinstance(wo, AdoptedOptimizer) else []:
        ctx.hooks.remove(handle)
    ctx.optimizers.remove(wo)
    ctx.forget_names()
