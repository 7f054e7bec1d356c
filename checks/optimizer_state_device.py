"""optimizer-state-device: optimizer state lives on another device or dtype than its parameter."""

from __future__ import annotations

import ast
from typing import Any, Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import RuntimeCheck, StepEvent
from torchdoctor.sdk.source import (
    CallSite,
    Effect,
    Fact,
    Function,
    FunctionScope,
    ModuleIndex,
    SourceFile,
    literal,
    ref,
)

from ._optimizer_builds import optimizers_built_by_function, rebuilt_after
from ._user_names import name_of

# An earlier run saved SGD momentum buffers (float32); this run trains the same model in bfloat16.
_RESUME = """
import torch
from torch import nn

earlier = nn.Linear(4, 2)
earlier_optimizer = torch.optim.SGD(earlier.parameters(), lr=0.1, momentum=0.9)
earlier(torch.randn(8, 4)).sum().backward()
earlier_optimizer.step()
torch.save({"optimizer": earlier_optimizer.state_dict()}, "last.pt")

model = nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
criterion = nn.MSELoss()
loader = [(torch.randn(8, 4, dtype=torch.bfloat16), torch.randn(8, 2, dtype=torch.bfloat16)) for _ in range(3)]
"""

_LOOP = """
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""

OPTIMIZER_STATE_DEVICE = Pitfall(
    code="TD304",
    name="optimizer-state-device",
    severity="error",
    summary="Optimizer state (momentum, exp_avg, ...) lives on another device or dtype than its parameter.",
    why="""
        `optimizer.load_state_dict` casts the state to the device and floating-point dtype the parameters have at
        that moment. Load it while the model is on the CPU, then call `model.to("cuda")`, and the state stays on
        the CPU: the first `optimizer.step()` fails with `Expected all tensors to be on the same device`. Cast the
        model afterwards (`model.to(torch.bfloat16)`, `model.half()`) and the state keeps the old dtype: Adam's
        step fails, and SGD's momentum silently runs in another precision than its parameters.
    """,
    fix="""
        Move or cast the model first, then build the optimizer and load its state; `load_state_dict` then puts
        every state tensor on its parameter's device and dtype.
    """,
    bad=Example(
        'optimizer.load_state_dict(torch.load("last.pt")["optimizer"])\n'
        'model.to(torch.bfloat16)  # after the load: the momentum buffers stay float32 (same with .to("cuda"))' + _LOOP,
        setup=_RESUME,
    ),
    good=Example(
        'optimizer.load_state_dict(torch.load("last.pt")["optimizer"])\n'
        "model.to(torch.bfloat16)\n"
        "optimizer.load_state_dict(optimizer.state_dict())  # load again: the state follows each parameter" + _LOOP,
        setup=_RESUME,
    ),
    details={
        "runtime": """
            `watch` compares every optimizer state tensor that has its parameter's shape (momentum buffers,
            `exp_avg`, `exp_avg_sq`, ...) with that parameter: device always, and for optimizers from `torch.optim`
            also the floating-point dtype. It looks at the start of the session (the usual case: state loaded, then
            the model moved, then training starts) at steps 0, `every`, ... below 32, then every `10 * every`
            steps and from step `100 * every` on every `100 * every`, before the step. Scalars such as Adam's
            `step`, which PyTorch keeps on the CPU on purpose, are ignored. Device is metadata, so the check never
            synchronises. If `step()` then fails with `Expected all tensors to be on the same device`, the report
            lists where parameters and state live.
        """,
        "source": """
            The lint rule reports `optimizer.load_state_dict(...)` followed, in the same function, by
            `model.to(<not cpu>)` (a device or a dtype) or `model.cuda()` of the model the optimizer was built from,
            with no reload or rebuild after the move. A helper handed the optimizer that loads its state
            (`resume(path, model, optimizer)`, in this file, another or an installed library) counts as the load,
            and a helper handed the model that moves it (`to_device(model, "cuda")`) as the move, as long as one of
            the two is written in the function itself. `watch` compares the actual devices and dtypes of state and
            parameters at run time.
        """,
    },
)


@OPTIMIZER_STATE_DEVICE.runtime
class OptimizerStateDevice(RuntimeCheck):
    """At start and at the set-up steps (`ctx.setup_due`): compare state tensors with their parameters (metadata
    only, no sync)."""

    setup = True  # what it judges changes seldom

    def on_start(self) -> Iterator[Finding]:
        self.reported: set[tuple[str, str]] = set()
        for wo in self.ctx.optimizers:
            yield from self._check(wo)

    def on_periodic(self, event: StepEvent) -> Iterator[Finding]:
        yield from self._check(event.optimizer)

    def _check(self, wo: Any) -> Iterator[Finding]:
        builtin = type(wo.optimizer).__module__.startswith("torch.optim")
        bad: list[tuple[Any, str, Any]] = []
        for p in wo.params():
            for key, value in wo.optimizer.state.get(p, {}).items():
                if getattr(value, "shape", None) != p.shape or value.dim() == 0:
                    continue  # scalars such as Adam's `step` live on the CPU on purpose
                if value.device != p.device or (
                    builtin and value.is_floating_point() and p.is_floating_point() and value.dtype != p.dtype
                ):
                    bad.append((p, key, value))
        if not bad:
            return
        p, key, value = bad[0]
        what = "device" if value.device != p.device else "dtype"
        if (wo.label, what) in self.reported:
            return
        self.reported.add((wo.label, what))
        name = self.ctx.param_name(p)
        shown = f"`{name}`" if name else "a parameter"
        got, want = (f"on {value.device}", f"on {p.device}") if what == "device" else (value.dtype, p.dtype)
        opt = name_of(wo.optimizer, "optimizer")
        yield Finding(
            f"{wo.label} state `{key}` of {shown} is {got} but the parameter is {want} "
            f"({len(bad)} state tensor(s) affected): the state was loaded or created before the model was moved "
            "or cast, and step() will fail or mix precisions.",
            fix=Fix(
                f"After the model is moved or cast, load {wo.label}'s state again: load_state_dict puts each "
                "state tensor on its parameter's device and dtype (or move the model before loading the state)",
                f"{opt}.load_state_dict({opt}.state_dict())",
            ),
            location=Location(param=name, key=str(key), device=str(p.device), step=self.ctx.step),
        )


def _moves_off_cpu(call: ast.Call) -> bool:
    target = call.args[0] if call.args else None
    for kw in call.keywords:
        if kw.arg == "device":
            target = kw.value
    if isinstance(target, ast.Call) and target.args:
        target = target.args[0]  # torch.device("cpu")
    value = literal(target)
    return not (isinstance(value, str) and value.startswith("cpu"))


def _moved_before(scope: FunctionScope, model: str, pos: tuple) -> bool:
    """The model was moved before `pos` (`model = Net().to(device)`, `model.cuda()`): a later move may be a no-op."""
    return any(
        c.pos < pos
        and (
            c.receiver == model
            or any(b.target == model and b.value is not None and c.node in ast.walk(b.value) for b in scope.bindings)
        )
        for c in scope.calls_named("to", "cuda")
    )


def _loads_state(fn: Function) -> frozenset[Effect]:
    """What the function loads a state dict into (`x.load_state_dict(...)`)."""
    return frozenset(Effect(c.receiver) for c in fn.scope.calls_named("load_state_dict") if c.receiver)


def _moves(fn: Function) -> frozenset[Effect]:
    """What the function moves off the CPU or casts (`x.cuda()`, `x.to("cuda")`, `x.to(torch.bfloat16)`)."""
    return frozenset(
        Effect(c.receiver)
        for c in fn.scope.calls_named("cuda", "to")
        if c.receiver and (c.attr == "cuda" or _moves_off_cpu(c.node))
    )


# What helpers do to the optimizer and the model: a load in `resume(path, model, optimizer)` in another file, a
# move in `to_device(model, device)`, count as the caller's own.
LOADS_STATE = Fact.effects("loads-state-dict", _loads_state)
MOVES = Fact.effects("moves-off-cpu", _moves)


def _passing(scope: FunctionScope, index: ModuleIndex) -> dict[str, list[CallSite]]:
    """The calls of `scope` that may run a project or library function, by the names they are handed (as an
    argument or keyword value); worked out once per function."""
    question = ("calls passing", id(scope))
    found = index.memo.get(question)
    if found is None:
        found = index.memo[question] = {}
        for call in scope.calls:
            node = call.node
            if type(node.func) is ast.Attribute and call.qualname.startswith("torch."):
                continue  # `torch.save(model, ...)`, `x.to(...)` on a torch name: never a helper
            for arg in node.args:
                if isinstance(arg, ast.Name):
                    found.setdefault(arg.id, []).append(call)
                elif isinstance(arg, ast.Attribute):
                    found.setdefault(ref(arg) or "", []).append(call)
            for kw in node.keywords:
                value = kw.value
                if type(value) is ast.Name or type(value) is ast.Attribute:
                    found.setdefault(ref(value) or "", []).append(call)
    return found


def _through_helpers(
    src: SourceFile,
    scope: FunctionScope,
    name: str,
    after: tuple,
    fact: Fact[frozenset[Effect]],
    until: Optional[tuple] = None,
) -> list[CallSite]:
    """The calls after `after` (and before `until`) that hand `name` to a function that, itself or through its
    calls, does what `fact` says to it (`resume(path, model, optimizer)` loading the optimizer's state)."""
    return [
        c
        for c in _passing(scope, src.index).get(name, ())
        if c.pos > after
        and (until is None or c.pos < until)
        and any(e.receiver == name for e in src.project.at_call(scope, c, fact) or ())
    ]


def _position(call: CallSite) -> tuple:
    return call.pos


@OPTIMIZER_STATE_DEVICE.source
def optimizer_state_device(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or "load_state_dict" not in src.text and ".to(" not in src.text and ".cuda(" not in src.text:
        return
    index = src.index
    direct = "load_state_dict" in src.text  # else only a helper can load the state
    for scope, builds in optimizers_built_by_function(index):
        for built in builds:
            after = built.binding.pos
            moved = [
                c
                for c in scope.calls_named("cuda", "to")
                if c.pos > after and c.receiver == built.model and (c.attr == "cuda" or _moves_off_cpu(c.node))
            ]
            loaded = (
                [c for c in scope.calls_named("load_state_dict") if c.pos > after and c.receiver == built.optimizer]
                if direct
                else []
            )
            if not moved and not loaded:
                continue  # a load and a move both done by helpers is not looked for
            # the first load and the first move after it decide: a helper is followed only where it could be either
            first: tuple = loaded[0].pos if loaded else max(c.pos for c in moved)
            helped = _through_helpers(src, scope, built.optimizer, after, LOADS_STATE, first)
            loads = sorted(loaded + helped, key=_position)
            if not loads:
                continue
            moves = [c for c in moved if c.pos > loads[0].pos]
            before = moves[0].pos if moves else None
            moves = sorted(
                moves + _through_helpers(src, scope, built.model, loads[0].pos, MOVES, before), key=_position
            )
            for load in loads[:1]:
                move = next((c for c in moves if c.pos > load.pos), None)
                if (
                    move is None
                    or _moved_before(scope, built.model, load.pos)
                    or rebuilt_after(scope, built, move.pos)
                    or any(
                        c.receiver == built.optimizer and c.pos > move.pos for c in scope.calls_named("load_state_dict")
                    )
                ):
                    continue
                via = f" (it loads `{built.optimizer}`'s state)" if load.attr != "load_state_dict" else ""
                by_helper = f" (it moves `{built.model}`)" if move.receiver != built.model else ""
                yield Finding(
                    f"`{src.snippet(load.node)}` (line {load.pos[0]}){via} runs before `{src.snippet(move.node)}` "
                    f"(line {move.pos[0]}){by_helper}: load_state_dict casts the state to the device and dtype the "
                    "parameters have at that moment, so it stays behind when the model is moved or cast, and "
                    "`step()` fails with 'Expected all tensors to be on the same device' (or mixes precisions).",
                    fix=Fix(
                        f"Move or cast the model first, then load the state: put line {move.pos[0]} before line "
                        f"{load.pos[0]}:",
                        f"{src.segment(move.node)}\n{src.segment(load.node)}",
                    ),
                    location=src.location(load.node),
                )
