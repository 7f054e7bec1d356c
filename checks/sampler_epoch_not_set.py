"""sampler-epoch-not-set: a DistributedSampler reused for several epochs without set_epoch() repeats its order."""

from __future__ import annotations

import ast
import weakref
from typing import Any, Callable, Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import LoaderEvent, RuntimeCheck
from torchdoctor.sdk.source import (
    CallSite,
    Fact,
    FunctionScope,
    ModuleIndex,
    SourceFile,
    iter_names,
    last,
    literal,
    ref,
)

_TWO_RANKS = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

rank, world_size = 0, 2
model = nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.MSELoss()
dataset = TensorDataset(torch.randn(32, 4), torch.randn(32, 2))
"""

SAMPLER_EPOCH_NOT_SET = Pitfall(
    code="TD311",
    name="sampler-epoch-not-set",
    severity="warning",
    summary="A DistributedSampler is used for several epochs without set_epoch(epoch): every epoch sees the same "
    "order.",
    why="""
        DistributedSampler seeds its shuffle with `seed + epoch`. Without `sampler.set_epoch(epoch)` at the start
        of each epoch the epoch stays 0, so every epoch repeats the same permutation and shuffling buys nothing.
    """,
    fix="Call `sampler.set_epoch(epoch)` at the start of every epoch, before iterating the loader.",
    bad=Example(
        """
        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank)
        loader = DataLoader(dataset, sampler=sampler, batch_size=8)
        for epoch in range(2):
            for x, y in loader:
                optimizer.zero_grad()
                criterion(model(x), y).backward()
                optimizer.step()
        """,
        setup=_TWO_RANKS,
    ),
    good=Example(
        """
        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank)
        loader = DataLoader(dataset, sampler=sampler, batch_size=8)
        epochs = 2
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for x, y in loader:
                optimizer.zero_grad()
                criterion(model(x), y).backward()
                optimizer.step()
        """,
        setup=_TWO_RANKS,
    ),
    details={
        "source": """
            The lint rule reports a shuffling `DistributedSampler` feeding a DataLoader that is read inside a loop
            nested in another loop (or passed to a function called in a loop) when no `set_epoch(...)` call exists
            in the file (matched on the syntax tree, so the word in a comment does not count) and no project function
            called in the epoch loop calls it (calls are followed through imports, closures and methods of the same
            class, a few levels deep, from the project on disk). `watch` checks each epoch at run time.
        """,
        "runtime": """
            While a session is active, `DataLoader.__iter__` is patched (the original is restored at exit) so that
            each new pass over any loader is seen. For every sampler of that loader that has `set_epoch()` and an
            `epoch` attribute (such as `DistributedSampler`) and shuffles, `watch` remembers the epoch of its last
            pass; a new pass with the same epoch is a warning, given when that pass reads its second batch (at the
            user's loop line). A pass that reads at most one batch of a longer loader is a peek, not a pass
            (PyTorch's DDP tutorial calls `next(iter(loader))` for a log line before `set_epoch`): it is neither
            judged nor remembered. Calling `set_epoch(0)` every epoch is caught the same way. Samplers with
            `shuffle=False`, used for validation, are quiet.
        """,
    },
)


def _epoch_samplers(loader: Any) -> list[Any]:
    """The loader's samplers that have an epoch to advance (``set_epoch`` and an ``epoch`` attribute)."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    found = [getattr(loader, "sampler", None), getattr(batch_sampler, "sampler", None), batch_sampler]
    unique = {id(s): s for s in found if s is not None}
    return [s for s in unique.values() if callable(getattr(s, "set_epoch", None)) and hasattr(s, "epoch")]


def _count_batches(iterator: Any, on_second: Callable[[], None]) -> list[int]:
    """A counter of the batches `iterator` yields, calling `on_second` at its second batch: a per-instance
    wrapper of its ``_next_data`` (what ``__next__`` calls) that holds the iterator only weakly, so workers
    shut down as soon as the user drops it. [-1] where it is not a torch DataLoader iterator."""
    counter = [0]
    original = getattr(type(iterator), "_next_data", None)
    if original is None:
        return [-1]
    ref = weakref.ref(iterator)

    def counting() -> Any:
        counter[0] += 1
        if counter[0] == 2:
            on_second()
        return original(ref())

    iterator._next_data = counting
    return counter


@SAMPLER_EPOCH_NOT_SET.runtime
class SamplerEpochNotSet(RuntimeCheck):
    """At each ``iter(loader)``: a shuffling sampler whose ``epoch`` did not change since its last pass."""

    def on_start(self) -> None:
        self.last: dict[int, _Passes] = {}  # id(sampler) -> its passes so far
        self.reported: set[int] = set()

    def on_loader_iter(self, event: LoaderEvent) -> Iterator[Finding]:
        samplers = [s for s in _epoch_samplers(event.loader) if getattr(s, "shuffle", True)]
        if not samplers:  # a fixed order is what the user asked for (e.g. validation)
            return
        try:
            batches: Optional[int] = len(event.loader)
        except TypeError:  # no len(): an iterable dataset, where every pass counts
            batches = None
        dataset = type(getattr(event.loader, "dataset", None)).__name__
        started = []
        for sampler in samplers:
            previous = self.last.get(id(sampler))
            real: Optional[int] = None
            if previous is not None and previous.sampler() is sampler:  # else a new sampler at a recycled id
                real = previous.real if previous.peek() else previous.epoch
            passes = self.last[id(sampler)] = _Passes(sampler, real, sampler.epoch, batches, dataset)
            started.append(passes)
        if batches is None or batches <= 1:  # a peek would be the whole pass: judge now
            for passes in started:
                yield from self._judge(passes)
            return

        def second_batch() -> None:
            """A pass that reads a second batch is not a peek: judge it now, inside the user's loop."""
            try:
                for passes in started:
                    for finding in self._judge(passes):
                        self.ctx.emit(self, finding)
            except Exception as exc:  # never break the user's data loading
                self.ctx.fault(self, exc)

        counter = _count_batches(event.iterator, second_batch)
        for passes in started:
            passes.counter = counter

    def _judge(self, passes: "_Passes") -> Iterator[Finding]:
        """A real pass at the same epoch as the real pass before it."""
        sampler = passes.sampler()
        if sampler is None or passes.real is None or passes.real != passes.epoch or id(sampler) in self.reported:
            return
        self.reported.add(id(sampler))
        yield Finding(
            f"{type(sampler).__name__} of the DataLoader over {passes.dataset} started another pass "
            f"with epoch still {passes.epoch}: set_epoch() was not called, "
            "so every epoch shuffles into the same order.",
            fix=Fix(
                title="Advance the sampler's epoch before each pass:",
                code="for epoch in range(epochs):\n    sampler.set_epoch(epoch)\n    for x, y in loader:\n        ...",
            ),
            location=Location(key=type(sampler).__name__, step=self.ctx.step),
        )


class _Passes:
    """A sampler's latest pass (its epoch and batch counter) and the epoch of the last real pass before it."""

    def __init__(self, sampler: Any, real: Optional[int], epoch: int, batches: Optional[int], dataset: str) -> None:
        self.sampler = weakref.ref(sampler)
        self.real, self.epoch, self.batches, self.dataset = real, epoch, batches, dataset
        self.counter = [-1]  # batches read (-1: not counted)

    def peek(self) -> bool:
        """The pass read at most one batch of a loader that has more: `next(iter(loader))` (PyTorch's DDP
        tutorial does it for a log line), not a pass."""
        return self.batches is not None and self.batches > 1 and 0 <= self.counter[0] <= 1


# The function calls `.set_epoch(...)`, itself or through the functions it calls.
SETS_EPOCH = Fact.any("sets-epoch", lambda fn: "set_epoch" in fn.scope.call_attrs)


@SAMPLER_EPOCH_NOT_SET.source
def sampler_epoch_not_set(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or "DistributedSampler" not in src.text:
        return
    index = src.index
    if any(c.attr == "set_epoch" for c in index.all_calls()):
        return
    for scope, sampler, name in _shuffling_samplers(index):
        for loader in _loaders_of(scope, sampler, name):
            line = _epoch_loop_line(scope, loader)
            if line is None:
                continue
            known, unknown = _set_epoch_in_callee(src, scope, line, {loader, name} - {None})
            if known:
                continue
            caveat = (
                f" `{src.snippet(unknown.node)}` (line {unknown.node.lineno}) receives `{ref(unknown.node.args[0])}` "
                "but is not defined in the project, so it was not followed: if it calls set_epoch, silence this line."
                if unknown is not None
                else ""
            )
            yield Finding(
                f"`{src.snippet(sampler.node)}` feeds `{loader}`, which is read once per epoch (loop at line {line}), "
                "but set_epoch is never called in the linted files: DistributedSampler seeds its shuffle with the "
                "epoch, so every epoch sees the same order." + caveat,
                fix=Fix(title=f"At the start of every epoch call `{name or loader + '.sampler'}.set_epoch(epoch)`."),
                location=src.location(sampler.node),
            )
            break


def _set_epoch_in_callee(
    src: SourceFile, scope: FunctionScope, line: int, names: set[Optional[str]]
) -> tuple[bool, Optional[CallSite]]:
    """Whether a function called in the epoch loop calls set_epoch (itself or through its own calls), and else the
    first call there that is unknown (not followed) and receives the loader or sampler first: the verdict rests
    on it."""
    loop = next(lp for lp in scope.loops if lp.node.lineno == line)
    unknown = None
    for call in scope.calls:
        if loop.encloses(call.loop):
            callee = src.project.callee(scope, call)
            if src.project.fact(callee, SETS_EPOCH):
                return True, None
            if (
                callee is None
                and unknown is None
                and call.node.args
                and ref(call.node.args[0]) in names
                and not call.qualname.startswith(("torch.", "builtins."))
                and call.attr not in _NOT_EPOCH_CALLS
            ):
                unknown = call
    return False, unknown


# Calls that receive a loader without advancing its sampler's epoch.
_NOT_EPOCH_CALLS = frozenset({"len", "iter", "next", "enumerate", "zip", "print", "tqdm", "range", "list"})


def _shuffling_samplers(index: ModuleIndex) -> Iterator[tuple[FunctionScope, CallSite, Optional[str]]]:
    """DistributedSampler(...) calls that shuffle, with the name they are bound to (None when inline)."""
    for scope in index.scopes:
        bound = {id(b.value): b.target for b in scope.bindings if isinstance(b.value, ast.Call)}
        # `sampler = DistributedSampler(ds) if args.distributed else None`, as torchvision's and pytorch/examples'
        bound.update(
            {
                id(branch): b.target
                for b in scope.bindings
                if isinstance(b.value, ast.IfExp)
                for branch in (b.value.body, b.value.orelse)
                if isinstance(branch, ast.Call)
            }
        )
        for call in scope.calls:
            if last(call.qualname).endswith("DistributedSampler") and literal(call.kwarg("shuffle")) is not False:
                yield scope, call, bound.get(id(call.node))


def _loaders_of(scope: FunctionScope, sampler: CallSite, name: Optional[str]) -> list[str]:
    """Names of the DataLoaders fed by this sampler (passed by name or built inline)."""
    out = []
    for b in scope.bindings:
        if isinstance(b.value, ast.Call) and last(ref(b.value.func) or "").endswith("DataLoader"):
            for kw in b.value.keywords:
                if kw.arg in ("sampler", "batch_sampler") and (
                    kw.value is sampler.node or name is not None and ref(kw.value) == name
                ):
                    out.append(b.target)
    return out


def _epoch_loop_line(scope: FunctionScope, loader: str) -> Optional[int]:
    """Line of a loop that goes over `loader` more than once (a nested loop, or a call passing it inside a loop)."""
    for loop in scope.loops:
        node = loop.node
        if isinstance(node, (ast.For, ast.AsyncFor)) and loader in iter_names(node.iter) and loop.parent is not None:
            return loop.parent.node.lineno
    for call in scope.calls:
        if (
            call.loop is not None
            and any(ref(a) == loader for a in call.node.args)
            and not last(call.qualname).endswith("DataLoader")
        ):
            return call.loop.node.lineno
    return None
