"""Which enabled checks could not run in a watch session, and why: a report never says "No problems found"
for checks that saw nothing to judge. Decided at the end of the session from what the hooks saw."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchdoctor.watch.contract import Event, RuntimeCheck

if TYPE_CHECKING:
    from torchdoctor.watch.context import WatchContext

_STEP_EVENTS = frozenset({Event.ZERO_GRAD, Event.STEP_PRE, Event.PERIODIC, Event.STEP_POST})
_LOOP_EVENTS = frozenset(Event) - {Event.START, Event.STOP}


def needs_optimizer(check: RuntimeCheck) -> bool:
    """The check judges optimizer steps: it says so (``needs_optimizer = True``), or it only listens to them."""
    declared = type(check).needs_optimizer
    if declared is not None:
        return bool(declared)
    events = set(type(check).subscribed_events()) & _LOOP_EVENTS
    return bool(events) and events <= _STEP_EVENTS


def needs_forward(check: RuntimeCheck) -> bool:
    """The check judges forwards: it says so (``needs_forward = True``), or it listens to them."""
    declared = type(check).needs_forward
    return bool(declared) if declared is not None else Event.FORWARD in type(check).subscribed_events()


def not_run(
    ctx: "WatchContext", checks: dict[str, RuntimeCheck], seen: dict[Event, int], under_functorch: int, found: set[str]
) -> list[dict[str, Any]]:
    """Groups of checks that could not run: {"checks": names, "why": ..., "how": ...}, with "applies": False
    for those that have nothing to judge in such a loop (no DataLoader); a check that found something ran."""
    groups: list[dict[str, Any]] = []
    taken: set[str] = set(found)

    def group(names: list[str], why: str, how: str, applies: bool = True) -> None:
        names = sorted(n for n in names if n not in taken)
        if names:
            taken.update(names)
            groups.append({"checks": names, "why": why, "how": how, **({} if applies else {"applies": False})})

    if not ctx.optimizers:
        group(
            [n for n, c in checks.items() if needs_optimizer(c)],
            "no optimizer was given to watch() or seen in the session",
            "pass it, watch(model, optimizer), or start the session after the trainer has built it",
        )
    elif not any(wo.steps for wo in ctx.optimizers):
        group(
            [n for n, c in checks.items() if needs_optimizer(c) or _STEP_EVENTS & set(type(c).subscribed_events())],
            "no optimizer step ran in the session",
            "run at least one optimizer.step() inside the session",
        )
    listening = [n for n, c in checks.items() if needs_forward(c)]
    if not seen.get(Event.FORWARD):
        if under_functorch:
            why = "the model ran only inside torch.func transforms (vmap, grad), where watch's hooks stand aside"
            how = "watch a forward outside the transform, or run these checks on a plain training loop"
        else:
            why = "no forward of the watched model ran in the session"
            how = "pass the module that the loop calls, and call it inside the session"
        group(listening, why, how)
    loaders = [n for n, c in checks.items() if set(type(c).subscribed_events()) & _LOOP_EVENTS == {Event.LOADER_ITER}]
    if not seen.get(Event.LOADER_ITER):
        group(
            loaders,
            "no DataLoader pass started in the session",  # nothing to judge in a loop without one
            "nothing to do if the loop reads no DataLoader; otherwise iterate it inside the session",
            applies=False,
        )
    return groups
