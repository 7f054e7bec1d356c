"""graph-retention-leak: tensors with autograd history kept across steps (`total += loss`) keep every step's graph."""

from __future__ import annotations

import ast
import inspect
import linecache
import re
from typing import TYPE_CHECKING, Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall, byte_size
from torchdoctor.sdk.runtime import ForwardEvent, RuntimeCheck, StepEvent, frame_variables, user_frames
from torchdoctor.sdk.source import (
    BACKWARD_METHODS,
    Binding,
    CallSite,
    FunctionScope,
    Loop,
    SourceFile,
    Spanned,
    backprop_names,
    backward_targets,
    graph_refs,
    is_backward,
    ref,
)

if TYPE_CHECKING:
    from torchdoctor.sdk.runtime import WatchedModel

# 17 steps: the runtime detector reports graphs kept from at least half of 16 consecutive steps.
_TRAINING = """
import torch
from torch import nn

model = nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.MSELoss()
loader = [(torch.randn(8, 4), torch.randn(8, 2)) for _ in range(17)]
"""

GRAPH_RETENTION_LEAK = Pitfall(
    code="TD308",
    name="graph-retention-leak",
    severity="error",
    summary="Tensors with autograd history are kept across steps (`total += loss`), so memory grows every step.",
    why="""
        A loss tensor references the graph that produced it. Adding it to a running total (or appending it to
        a list) that lives across iterations keeps every iteration's graph alive and chains them together:
        memory climbs step after step until the run dies with an out-of-memory error, typically after a few
        epochs.
    """,
    fix="Keep a Python number (`loss.item()`) or a detached tensor (`loss.detach()`) for logging.",
    bad=Example(
        """
        total_loss = 0
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            total_loss += loss
        """,
        setup=_TRAINING,
    ),
    good=Example(
        """
        total_loss = 0.0
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            total_loss += loss.item()
        """,
        setup=_TRAINING,
    ),
    details={
        "source": """
            The lint rule fires on `acc += expr`, `acc = acc + expr` and `lst.append(expr)` inside a loop when `expr`
            reads, outside
            `.item()`/`.detach()`/`float()`, a value that the same loop back-propagates (or that a Lightning
            `training_step` returns), the accumulator itself is never back-propagated, and it is not
            re-initialised in that loop (a reset only every N-th iteration for logging, `if step % log_every == 0:
            running = 0`, still keeps up to N graphs and does not count; the window of a gradient-accumulation
            step, whose `if` also steps the optimizer, does). It also fires on `meter.update(loss, n)` when `meter`
            is an instance of a project class whose method accumulates that argument into an attribute
            (`self.sum += val * n`, `self.values.append(val)`) without taking it out of autograd first. Summing loss
            terms before one `backward()` is therefore quiet, and so is
            keeping input data (a step method's `batch` parameter or a loop variable taken from a loader).
            Accumulations it cannot tie to a backward are left to `watch`, which measures the growth at run time.
        """,
        "runtime": """
            `watch` puts a sentinel hook on the `grad_fn` of each forward output built with gradients; the graph
            owns the sentinel, so it knows which graphs are alive and in which step each was built, and whether
            backward went through it; from step 16 on it does so for the forwards of every 4th step that watch
            observes only (a leak keeps them all, and the per-step cost stays small). A normal loop frees a step's
            graph by the next step (the next forward rebinds `loss`). After each step of the first optimizer it
            looks at the graphs built before the
            previous step that are still alive: when they come from at least half of 16 or more consecutive
            steps, something keeps them (`total_loss += loss`, also when reset every epoch), and it reports an
            error right then, however short the run; at session exit it also reports graphs kept since the first
            steps. The message gives the graphs and steps, and the bytes: for graphs never back-propagated, the
            activations one forward saves for backward (measured once per model by walking its graph,
            parameters and buffers excluded); for graphs that were, the graph nodes each one keeps; and, when
            CUDA is in use, how much `memory_allocated()` grows per step from the oldest graph still held (read
            at the tracked forwards, with no synchronisation). A steady loop, a bounded cache of recent
            losses, per-episode lists freed at each step (REINFORCE, whatever the episode length) and truncated
            BPTT are quiet. `watch` does not install `saved_tensors_hooks`: they would switch off autograd's in-place
            checks and make `torch.func` refuse to run.
        """,
    },
)


def _find_keeper() -> Optional[tuple[str, str, str, int]]:
    """The user's variable that keeps graphs across steps, looked for in the user's frames on the stack and in
    the attributes of their `self`: a container of several tensors attached to graphs (`losses`), or a running
    total whose graph chains additions (`total_loss`). Returns (name, what it is, file, line of the statement
    that adds to it in one of those frames, else the line its frame is at)."""
    frames = user_frames()
    for frame in frames:
        for name, value in frame_variables(frame):
            found = _keeps_graphs(value)
            if found is None and name == "self":
                for attr, item in list(getattr(value, "__dict__", {}).items())[:200]:
                    found = _keeps_graphs(item)
                    if found is not None:
                        name = f"self.{attr}"
                        break
            if found is not None:  # a module's variable (a global list) is added to in the functions it runs
                others = [f for f in frames if f is not frame]
                for where in [frame] + others if frame.f_code.co_flags & inspect.CO_OPTIMIZED else others + [frame]:
                    line = _adding_line(where, name)
                    if line is not None:
                        return name, found, where.f_code.co_filename, line
                return name, found, frame.f_code.co_filename, frame.f_lineno
    return None


def _keeps_graphs(value: object) -> Optional[str]:
    """What `value` is when it keeps graphs: a list/tuple/deque/dict of two or more tensors with a grad_fn,
    or a tensor whose graph is a chain of three or more additions (a running total)."""
    import collections

    import torch

    if isinstance(value, torch.Tensor):
        fn, adds = value.grad_fn, 0
        while fn is not None and type(fn).__name__ in ("AddBackward0", "AddBackward1") and adds < 3:
            adds += 1
            fn = fn.next_functions[0][0] if fn.next_functions else None
        return "a running total of tensors attached to their graphs" if adds >= 3 else None
    if isinstance(value, dict):
        items: list[object] = list(value.values())[:1000]
    elif isinstance(value, (list, tuple, collections.deque)):
        items = list(value)[:1000]
    else:
        return None
    attached = sum(1 for item in items if isinstance(item, torch.Tensor) and item.grad_fn is not None)
    return f"a {type(value).__name__} of {attached} tensors attached to their graphs" if attached >= 2 else None


def _detached(source: str, name: str, total: bool) -> str:
    """The statement that adds to `name`, rewritten to add a number (`.item()`, for a running total) or a
    tensor without graph (`.detach()`, for a container); a generic line when it is not one of those forms."""
    suffix = ".item()" if total else ".detach()"
    for pattern in (
        rf"^({re.escape(name)}\.(?:append|insert)\((?:.*,\s*)?)(.+)(\))$",
        rf"^({re.escape(name)}\s*\+=\s*)(.+)()$",
        rf"^({re.escape(name)}\s*=\s*{re.escape(name)}\s*\+\s*)(.+)()$",
    ):
        match = re.match(pattern, source.split("  #")[0].strip())
        if match:
            value = match.group(2).strip()
            value = value if re.fullmatch(r"[\w.]+", value) else f"({value})"
            return f"{match.group(1)}{value}{suffix}{match.group(3)}"
    return f"{name}.append(loss{suffix})" if not total else f"{name} += loss{suffix}"


def _adding_line(frame: object, name: str) -> Optional[int]:
    """The line of the frame's code that adds to `name` (`name.append(`, `name +=`, `name = name + ...`)."""
    code = frame.f_code  # type: ignore[attr-defined]
    pattern = re.compile(rf"(?<![\w.]){re.escape(name)}\s*(\.(append|extend|insert)\(|\+=|=\s*{re.escape(name)}\s*\+)")
    lines = [line for _, _, line in code.co_lines() if line is not None]
    for number in sorted(set(lines)):
        if pattern.search(linecache.getline(code.co_filename, number)):
            return number
    return None


def _cuda_allocated() -> Optional[int]:
    """The CUDA caching allocator's allocated bytes, when CUDA is in use in this process."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.memory_allocated())
    return None


def _cuda_growth(live: "_Live", old: list[int]) -> str:
    """How CUDA allocated memory grew from the oldest step still held to the latest tracked one."""
    held = sorted(t for t in live.cuda_at if t >= old[0])
    if len(held) < 2:
        return ""
    first, last = held[0], held[-1]
    grown = live.cuda_at[last] - live.cuda_at[first]
    if grown <= 0:
        return ""
    return (
        f"; CUDA allocated memory grows by {byte_size(grown // (last - first))} per step (from "
        f"{byte_size(live.cuda_at[first])} at step {first} to {byte_size(live.cuda_at[last])} at step {last})"
    )


class _Live:
    """Per model: its tracked forward graphs still alive, by the step they were built in."""

    def __init__(self) -> None:
        self.by_step: dict[int, int] = {}  # step (completed steps when built) -> graphs alive
        self.unreached = 0  # graphs alive that backward never went through (activations saved)
        self.cuda_at: dict[int, int] = {}  # step -> CUDA allocated bytes at its first tracked forward, while alive

    def old_steps(self, now: int) -> list[int]:
        """The steps before the previous one whose graphs are still alive."""
        return sorted(t for t, n in self.by_step.items() if n > 0 and t <= now - 2)


@GRAPH_RETENTION_LEAK.runtime
class GraphRetentionLeak(RuntimeCheck):
    """Sentinels count each step's forward graphs while they are alive. A normal loop frees a step's graph
    by the next step (the next forward rebinds `loss`); a loop that keeps graphs from at least half of the
    last `span` or more steps (`total += loss`, reset per epoch or never) holds them: reported at once,
    however short the run, and at session exit when nothing built since the first steps was ever freed.
    A bounded cache (the last 10 losses) and per-episode lists freed at each step (REINFORCE) are quiet."""

    span = 16  # a graph chain this many steps long, at least half of them alive, is a leak, not a cache
    sample = 4  # from step `span` on, the forwards of every `sample`-th step are tracked (a leak keeps them all)

    def on_start(self) -> None:
        from torchdoctor.sdk.runtime import first_graph_tensor

        self.first_graph_tensor = first_graph_tensor  # looked up once: on_forward runs at every step
        self.live: dict[str, _Live] = {}
        self.reported = False

    def tracked(self, step: int) -> bool:
        """Whether the forwards of `step` get a sentinel: every step's at first, then every `sample`-th of
        the steps the session observes."""
        return step < self.span or step % self.sample == 0 and self.ctx.observes(step)

    def tracked_between(self, first: int, last: int) -> int:
        """How many steps from `first` to `last` (both included) are tracked."""
        return sum(1 for t in range(first, last + 1) if self.tracked(t))

    def on_forward(self, event: ForwardEvent) -> None:
        step = self.ctx.step
        if not event.grad_enabled or self.reported or not self.tracked(step):
            return
        out = self.first_graph_tensor(event.output)
        if out is None:
            return
        live = self.live.get(event.model.label)
        if live is None:
            live = self.live[event.model.label] = _Live()

        def backward() -> None:
            live.unreached -= 1

        def freed(reached: bool) -> None:
            left = live.by_step.get(step, 1) - 1
            if left > 0:
                live.by_step[step] = left
            else:
                live.by_step.pop(step, None)
                live.cuda_at.pop(step, None)
            live.unreached -= not reached

        if self.ctx.graphs.track(out, on_backward=backward, on_free=freed):
            live.by_step[step] = live.by_step.get(step, 0) + 1
            live.unreached += 1
            event.model.graph_footprint(out)
            cuda = _cuda_allocated()  # a counter the allocator keeps on the host: no synchronisation
            if cuda is not None:
                live.cuda_at.setdefault(step, cuda)

    def on_step_post(self, event: StepEvent) -> Optional[list[Finding]]:
        if self.reported or event.optimizer is not self.ctx.optimizers[0]:
            return None
        now = event.step + 1  # the steps completed once this one is
        for label, live in self.live.items():
            old = live.old_steps(now)
            if old and now - old[0] >= self.span and 2 * len(old) >= self.tracked_between(old[0], now - 2):
                return [self._finding(label, live, old, now, at_exit=False)]
        return None

    def on_stop(self) -> Iterator[Finding]:
        if self.reported or not self.ctx.optimizers:
            return
        now = self.ctx.step
        for label, live in self.live.items():
            old = live.old_steps(now)
            if old and old[0] <= 1 and len(old) >= 2 and 2 * len(old) >= self.tracked_between(old[0], now - 2):
                yield self._finding(label, live, old, now, at_exit=True)
                return

    def _finding(self, label: str, live: _Live, old: list[int], now: int, at_exit: bool) -> Finding:
        self.reported = True
        nodes, saved = self._model(label).graph_footprint(None)
        graphs = sum(live.by_step[t] for t in old)
        memory = (
            f"about {byte_size(live.unreached * saved)} of activations never back-propagated are saved with them"
            if live.unreached and saved
            else f"each keeps its ~{nodes} graph nodes, and its saved activations too if backward() ran with "
            "retain_graph=True, so memory grows with every step"
        )
        memory += _cuda_growth(live, old)
        when = "when the session ended" if at_exit else f"after step {now - 1}"
        steps = (
            f"{len(old)} earlier steps"
            if self.tracked_between(old[0], now - 2) == now - 1 - old[0]
            else f"{len(old)} of the earlier steps it samples (from step {self.span} on, every {self.sample}th of "
            "the steps watch observes)"
        )
        keeper = _find_keeper()
        file: Optional[str] = None
        line: Optional[int] = None
        if keeper is not None:
            name, what, file, line = keeper
            culprit = f"`{name}` ({what}) keeps them"
            fix = Fix(
                title=f"Keep numbers, not graphs, in `{name}`:",
                code=_detached(linecache.getline(keeper[2], keeper[3]).strip(), name, "running" in what),
            )
        else:
            culprit = (
                "Something keeps a tensor that is still attached to its graph, e.g. `losses.append(loss)` or "
                "`total_loss += loss`"
            )
            fix = Fix(
                title="Keep numbers, not graphs, across steps:",
                code="total_loss += loss.item()  # or loss.detach(); in a list: losses.append(loss.item())",
            )
        return Finding(
            f"Autograd graphs of {label}'s forward outputs stay alive across steps: {when}, {graphs} graphs built in "
            f"{steps} (the oldest in step {old[0]}) are still alive ({memory}). {culprit}.",
            fix=fix,
            location=Location(file=file, line=line, module=label, step=now - 1),
        )

    def _model(self, label: str) -> "WatchedModel":
        return next(wm for wm in self.ctx.models if wm.label == label)


@GRAPH_RETENTION_LEAK.source
def graph_retention_leak(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or "backward" not in src.text and "training_step" not in src.text:
        return
    for scope in src.index.scopes:
        if not scope.loops or BACKWARD_METHODS.isdisjoint(scope.call_attrs) and not scope.class_name:
            continue  # a backward in a loop needs a loop and a backward (a training_step, a class)
        trained = _trained_names_by_loop(scope)
        if not trained:
            continue
        kept = _Backpropagated(scope)
        for b in scope.bindings:
            if b.loop is None or b.grad_off:
                continue
            if b.augmented or type(b.value) is ast.BinOp and _accumulates(b):
                leaked = _leaked_name(b.value, b.loop, b.pos, trained, scope)
                if leaked and b.target not in kept and not _reset_in_loop(scope, b.target, b.loop, b.node):
                    yield _leak_finding(src, b.node, b.target, leaked, trained)
        for call in scope.calls:
            if call.loop is None or call.grad_off or not call.receiver:
                continue
            args = call.node.args
            if not args:
                continue
            if call.attr == "append" and len(args) == 1:
                leaked = _leaked_name(args[0], call.loop, call.pos, trained, scope)
                if leaked and call.receiver not in kept and not _reset_in_loop(scope, call.receiver, call.loop, None):
                    yield _leak_finding(src, call.node, call.receiver, leaked, trained)
            elif "." not in call.receiver and call.receiver not in trained:
                leaked = None
                for a in args:  # the first argument holding a leaked name (a name not trained, a constant: none)
                    if type(a) is ast.Name and a.id not in trained or type(a) is ast.Constant:
                        continue
                    if not _assigned(call.receiver, scope, src.index.scopes[0]):
                        break  # no instance whose method could keep it (`torch.cat(...)`, `self.log(...)`)
                    leaked = _leaked_name(a, call.loop, call.pos, trained, scope)
                    if leaked:
                        break
                method = src.project.instance_method(scope, call.receiver, call.attr) if leaked else None
                attr = _accumulated_attribute(method, call, leaked) if method is not None and leaked else None
                if leaked and attr:
                    yield _leak_finding(src, call.node, f"{call.receiver}.{attr}", leaked, trained)


def _assigned(receiver: str, scope: FunctionScope, top: FunctionScope) -> bool:
    """Some binding gives `receiver` a value in this function or at module level: instance_method answers only
    for such a receiver (bound to `Cls(...)` there), so only then is an argument worth reading."""
    for where in (scope, top):
        for b in where.bindings_of(receiver):
            if b.value is not None:
                return True
    return False


class _Backpropagated:
    """The names whose value reaches a backward in `scope`, worked out on the first question (most functions
    never ask: nothing in them looks like a leak)."""

    def __init__(self, scope: FunctionScope) -> None:
        self.scope = scope
        self.names: Optional[set[str]] = None

    def __contains__(self, name: str) -> bool:
        if self.names is None:
            self.names = backprop_names(self.scope)
        return name in self.names


def _trained_names_by_loop(scope: FunctionScope) -> dict[str, list[tuple[Loop, ast.AST]]]:
    """name -> [(loop, backward node)] for every name a backward call in a loop differentiates."""
    out: dict[str, list[tuple[Loop, ast.AST]]] = {}
    for call in scope.calls_named(*BACKWARD_METHODS):
        if call.loop is not None and is_backward(call):
            for target in backward_targets(call):
                for name in graph_refs(target):
                    out.setdefault(name, []).append((call.loop, call.node))
    if scope.class_name and getattr(scope.node, "name", "") == "training_step" and scope.loops:
        for ret in scope.returns:
            for name in graph_refs(ret.value):
                out.setdefault(name, []).append((scope.loops[0], ret))
    return out


def _leaked_name(
    value: Optional[ast.expr], loop: Loop, pos: tuple, trained: dict, scope: FunctionScope
) -> Optional[str]:
    """A name in `value` holding a loss that the same loop back-propagates, still a tensor at `pos`.

    The last assignment of the name in the loop before `pos` decides: `loss = loss.item()` or
    `loss = float(loss)` leaves a number there, and then nothing is kept.
    """
    if type(value) is ast.Name and value.id not in trained or type(value) is ast.Constant:
        return None  # (the commonest arguments: what they read is themselves, or nothing)
    for name in sorted(graph_refs(value)):
        backwards = trained.get(name)
        if not backwards or not any(loop.encloses(other) or other.encloses(loop) for other, _ in backwards):
            continue
        before = [
            b for b in scope.bindings if b.target == name and not b.augmented and b.pos < pos and loop.encloses(b.loop)
        ]
        if before and not graph_refs(max(before, key=lambda b: b.pos).value):
            continue
        if _is_input(scope, name, pos):
            continue
        return name
    return None


def _accumulates(b: Binding) -> bool:
    """`total = total + loss` (or `loss + total`): the same accumulation as `total += loss`."""
    value = b.value
    return (
        isinstance(value, ast.BinOp)
        and isinstance(value.op, ast.Add)
        and (ref(value.left) == b.target or ref(value.right) == b.target)
    )


def _is_input(scope: FunctionScope, name: str, pos: tuple) -> bool:
    """The name holds input data, not a loss: its last binding before `pos` is a parameter (a step method's
    `batch`) or a loop variable taken from the data (`for batch in loader`). Inputs have no history."""
    before = [b for b in scope.bindings if b.target == name and b.pos <= pos and not b.augmented]
    if not before:
        return False
    latest = max(before, key=lambda b: b.pos)
    return isinstance(latest.node, (ast.arg, ast.For, ast.AsyncFor))


def _accumulated_attribute(method: FunctionScope, call: CallSite, leaked: str) -> Optional[str]:
    """The attribute a project method accumulates the argument holding `leaked` into (`self.sum += val * n` in
    `AverageMeter.update(self, val, n=1)`), so the object keeps every call's history; None when it does not."""
    node = method.node
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    params = [a.arg for a in node.args.posonlyargs + node.args.args][1:]  # without self
    passed = {params[i] for i, arg in enumerate(call.node.args) if i < len(params) and leaked in graph_refs(arg)}

    def still_tensor(names: set[str], pos: tuple) -> bool:
        """A parameter keeps its history at `pos` unless rebound before it to a value without (`v = v.data.sum()`)."""
        for name in names & passed:
            before = [
                b
                for b in method.bindings
                if b.target == name and not b.augmented and b.pos < pos and not isinstance(b.node, ast.arg)
            ]
            if not before or name in graph_refs(max(before, key=lambda b: b.pos).value):
                return True
        return False

    for b in method.bindings:
        if (
            b.target.startswith("self.")
            and (b.augmented or _accumulates(b))
            and still_tensor(graph_refs(b.value), b.pos)
        ):
            return b.target[len("self.") :]
    for c in method.calls:
        if (
            c.attr == "append"
            and c.receiver
            and c.receiver.startswith("self.")
            and c.node.args
            and still_tensor(graph_refs(c.node.args[0]), c.pos)
        ):
            return c.receiver[len("self.") :]
    return None


def _reset_in_loop(scope: FunctionScope, target: str, loop: Loop, node: Optional[ast.AST]) -> bool:
    """The accumulator is re-initialised inside the same loop, so at most one window of history is kept; a reset
    only every N-th iteration for logging (`if step % log_every == 0: running = 0`) keeps up to N graphs and does
    not count (the window of a gradient-accumulation step, whose `if` also steps an optimizer, does)."""
    return any(
        b.target == target
        and not b.augmented
        and b.node is not node
        and loop.encloses(b.loop)
        and not _logging_window(loop, b.node)
        for b in scope.bindings
    )


def _logging_window(loop: Loop, node: ast.AST) -> bool:
    """`node` runs under an `if ... % n ...` of the loop that steps no optimizer (a logging window)."""
    line = getattr(node, "lineno", 0)
    block: list[ast.stmt] = list(getattr(loop.node, "body", []))
    while block:
        stmt = next((s for s in block if s.lineno <= line <= (s.end_lineno or s.lineno)), None)
        if stmt is None or stmt is node or isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return False
        if isinstance(stmt, ast.If) and any(
            isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in ast.walk(stmt.test)
        ):
            return not any(
                isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "step"
                for n in ast.walk(stmt)
            )
        block = [s for name in ("body", "orelse", "finalbody") for s in getattr(stmt, name, [])] + [
            s for h in getattr(stmt, "handlers", []) for s in h.body
        ]
    return False


def _leak_finding(src: SourceFile, node: Spanned, target: str, leaked: str, trained: dict) -> Finding:
    backward = trained[leaked][0][1]
    return Finding(
        f"`{src.snippet(node)}` keeps `{leaked}`, which is back-propagated at line {backward.lineno}, with its "
        f"autograd history: `{target}` holds every iteration's graph alive, so memory grows step after step.",
        fix=_source_fix(src, node, leaked),
        location=src.location(node),
    )


def _source_fix(src: SourceFile, node: Spanned, leaked: str) -> Fix:
    """The reported line with `leaked` detached: `.item()` in a running sum (a number), `.detach()` in what
    is appended (it may be more than one number)."""
    method = "detach" if isinstance(node, ast.Call) else "item"
    text = src.segment(node)
    uses = [n for n in ast.walk(node) if isinstance(n, ast.Name) and n.id == leaked and isinstance(n.ctx, ast.Load)]
    parents = {
        id(child) for n in ast.walk(node) if isinstance(n, (ast.Attribute, ast.Subscript)) for child in [n.value]
    }
    if node.lineno != node.end_lineno or not text.isascii() or not uses or any(id(n) in parents for n in uses):
        return Fix(
            title=f"Keep a number, not the graph: use `{leaked}.{method}()` instead of `{leaked}` on line "
            f"{node.lineno}."
        )
    for use in sorted(uses, key=lambda n: -n.col_offset):
        at = use.col_offset - node.col_offset
        text = text[:at] + f"{leaked}.{method}()" + text[at + len(leaked) :]
    return Fix(title=f"Keep a number, not the graph: write line {node.lineno} as", code=text)
