"""train-mode-not-restored: training steps run with the model still in eval() after validation."""

from __future__ import annotations

import ast
from operator import attrgetter
from typing import Any, Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import ForwardEvent, RuntimeCheck, StepEvent
from torchdoctor.sdk.source import (
    BACKWARD_METHODS,
    CallSite,
    Effect,
    Fact,
    Function,
    FunctionScope,
    Loop,
    SourceFile,
    is_backward,
    qualname,
    rebind,
    ref,
)

_SETUP = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.CrossEntropyLoss()
loader = [(torch.randn(16, 8), torch.randint(0, 3, (16,))) for _ in range(3)]
val_loader = loader[:1]
"""

TRAIN_MODE_NOT_RESTORED = Pitfall(
    code="TD314",
    name="train-mode-not-restored",
    severity="warning",
    summary="Training steps run while the model is still in eval() after validation: Dropout off, BatchNorm frozen.",
    why="""
        `model.eval()` switches every Dropout and BatchNorm layer to inference behaviour, and it stays that
        way until `model.train()` is called. When validation ends an epoch with `model.eval()` and the next
        epoch starts without `model.train()`, every later step trains a different network: Dropout no
        longer regularises, BatchNorm normalises with its running statistics and stops updating them. Nothing
        fails; the model just overfits or converges to something worse, and only from the second epoch on.
    """,
    fix="""
        Put the model back in training mode where the training loop starts (or right after validation):
        `model.train()` at the top of every epoch.
    """,
    bad=Example(
        """
        for epoch in range(2):
            for x, y in loader:
                optimizer.zero_grad()
                criterion(model(x), y).backward()
                optimizer.step()
            model.eval()
            with torch.no_grad():
                val_loss = sum(criterion(model(x), y).item() for x, y in val_loader)
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        epochs = 2
        for epoch in range(epochs):
            model.train()
            for x, y in loader:
                optimizer.zero_grad()
                criterion(model(x), y).backward()
                optimizer.step()
            model.eval()
            with torch.no_grad():
                val_loss = sum(criterion(model(x), y).item() for x, y in val_loader)
        """,
        setup=_SETUP,
    ),
    details={
        "runtime": """
            `watch` remembers, per model, whether the last forward with gradients enabled ran in `train()` or
            `eval()` mode. At each `optimizer.step()` that updates the model's parameters, it reports when
            that forward ran in `eval()` mode although earlier steps trained in `train()` mode, and the model
            has Dropout or BatchNorm layers in `eval()` mode. Quiet: BatchNorm layers frozen on purpose with
            `bn.eval()` while the model itself is in `train()` mode; models with neither Dropout nor
            BatchNorm; a frozen teacher in `eval()` whose parameters no optimizer updates; runs that train
            in `eval()` mode from the first step (a deliberate choice this check cannot tell from a mistake),
            unless the model was in `train()` mode when the session started and ran a gradient-free forward in
            `eval()` before (a validation at iteration 0, as nanoGPT's loop does, never followed by `train()`).
        """,
        "source": """
            The lint rule looks for a loop that trains (a `backward()` and an optimizer `step()` inside it, or
            a call of a function defined in the same file that does both) and also calls `model.eval()`
            (directly, or inside such a function it calls with the model), where nothing in that loop — nor
            in the functions it calls that are defined in the file — calls `.train()` on the model. It stays
            quiet when the loop hands the model to a function it cannot see (that function may call
            `model.train()`), for `.eval()` on anything the loop does not call as a model, such as
            BatchNorm layers frozen one by one, for an `eval()` that comes before the iteration's training (every
            step, the first too, trains in eval mode: deliberate, e.g. BatchNorm statistics frozen for
            fine-tuning), and for models built from a class of the file whose layers are all torch.nn layers
            that eval() does not change (no Dropout, BatchNorm, InstanceNorm, RNN or Transformer layer, no
            `F.dropout`, nothing from another library).
        """,
    },
)


_EFFECTS = {
    "Dropout": "Dropout drops nothing",
    "Norm": "BatchNorm normalises with its frozen running statistics and stops updating them",
}


class _Mode:
    """Per model: the mode of its last forward with gradients, and whether it ever trained in train()."""

    def __init__(self) -> None:
        self.last_eval = False
        self.trained = False
        self.validated = False  # in train() mode when the session started, then run in eval() without gradients


@TRAIN_MODE_NOT_RESTORED.runtime
class TrainModeNotRestored(RuntimeCheck):
    """At each step: was the forward that produced this step's gradients run in eval() mode after train()?"""

    def on_start(self) -> None:
        self.modes: dict[str, _Mode] = {}
        self.started_in_train = {wm.label: wm.inner.training for wm in self.ctx.models}

    def on_forward(self, event: ForwardEvent) -> None:
        if event.model.label not in self.started_in_train:  # adopted since the start (`torchdoctor run`)
            self.started_in_train[event.model.label] = event.model.inner.training
        if not event.grad_enabled:  # validation under no_grad/inference_mode is what eval() is for
            if not event.training and self.started_in_train.get(event.model.label):
                self.modes.setdefault(event.model.label, _Mode()).validated = True
            return
        mode = self.modes.get(event.model.label)
        if mode is None:  # not setdefault: that builds a _Mode at every forward
            mode = self.modes[event.model.label] = _Mode()
        mode.last_eval = not event.training

    def on_step_post(self, event: StepEvent) -> None:
        for mode in self.modes.values():
            mode.trained = mode.trained or not mode.last_eval

    def on_step_pre(self, event: StepEvent) -> Optional[Iterator[Finding]]:
        suspects = [
            wm
            for wm in self.ctx.models
            if (mode := self.modes.get(wm.label)) is not None and mode.last_eval and (mode.trained or mode.validated)
        ]
        if not suspects:
            return None  # the every-step path: no parameter is looked at
        return self._eval_steps(event, suspects)

    def _eval_steps(self, event: StepEvent, suspects: list[Any]) -> Iterator[Finding]:
        stepped = {id(p) for p in event.optimizer.params()}
        for wm in suspects:
            if not any(id(p) in stepped for _, p in wm.named_parameters()):
                continue  # a frozen teacher or reference model: eval() is right for it
            layers = _layers_in_eval(wm.inner)
            if not layers:
                continue
            effects = [text for kind, text in _EFFECTS.items() if any(kind in layer for layer in layers)]
            since = (
                "earlier steps trained it in train() mode"
                if self.modes[wm.label].trained
                else "it was in train() mode when the session started and was validated in eval() mode since"
            )
            yield Finding(
                f"{event.optimizer.label}.step() applied gradients from a forward of {wm.label} in eval() mode, "
                f"although {since}: its {', '.join(layers)} layers run as in "
                f"inference ({'; '.join(effects)}). model.train() was probably not called again after validation.",
                fix=Fix(
                    title="Switch back to training mode at the start of every epoch:",
                    code="for epoch in range(epochs):\n"
                    "    model.train()\n"
                    "    for x, y in loader:\n"
                    "        ...\n"
                    "    model.eval()\n"
                    "    with torch.no_grad():\n"
                    "        val_loss = sum(criterion(model(x), y).item() for x, y in val_loader)",
                ),
                location=Location(module=wm.label, step=event.step),
            )


def _layers_in_eval(model: Any) -> list[str]:
    """Type names of the Dropout/BatchNorm layers in eval() mode (the ones eval() changes)."""
    from torchdoctor.sdk.runtime import MODE_DEPENDENT

    return sorted({type(m).__name__ for m in model.modules() if isinstance(m, MODE_DEPENDENT) and not m.training})


def _evals_before_training(fn: Function) -> frozenset[Effect]:
    """The models a training function switches to eval() before its first backward (linear probing on frozen
    features, fine-tuning with frozen BatchNorm): it trains them in eval mode on purpose, whatever ran before."""
    backwards = [c.pos for c in fn.scope.calls if c.attr in BACKWARD_METHODS and is_backward(c)]
    if not backwards:
        return frozenset()
    first = min(backwards)
    return frozenset(Effect(str(c.receiver)) for c in fn.scope.calls if c.pos < first and _switches_to_eval(c))


def _as_called(value: frozenset[Effect], fn: Function, call: CallSite, callee: Function) -> frozenset[Effect]:
    return rebind(value, fn, call, callee)


# Read from the training function's own body (not followed further), in the caller's names.
EVAL_BEFORE_TRAINING: Fact[frozenset[Effect]] = Fact(
    "evals-before-training", _evals_before_training, frozenset(), through=_as_called
)


def _training_sets_eval(src: SourceFile, scope: FunctionScope, calls: list[CallSite], model: str) -> bool:
    """A function the loop calls switches `model` to eval() before its own backward."""
    return any(
        any(e.receiver == model for e in src.project.at_call(scope, call, EVAL_BEFORE_TRAINING) or ()) for call in calls
    )


@TRAIN_MODE_NOT_RESTORED.source
def train_mode_not_restored(src: SourceFile) -> Iterator[Finding]:
    """A training loop that calls model.eval() and never model.train() again."""
    if src.tree is None or ".eval()" not in src.text or "backward" not in src.text:
        return
    index = src.index
    functions = index.functions
    for scope in index.scopes:
        if not scope.loops:
            continue
        attrs = scope.call_attrs
        local = attrs.intersection(functions)
        if local:  # with the calls of the functions of this file it calls (a superset of what any loop reaches)
            attrs = attrs.union(*[f.call_attrs for name in local for f in functions[name]])
        if ("eval" not in attrs and "train" not in attrs) or "step" not in attrs or attrs.isdisjoint(BACKWARD_METHODS):
            continue  # nothing here switches a model to eval() (`.eval()`, `.train(False)`), or nothing trains
        reported: set[str] = set()
        for loop, calls in _outermost_loops(scope):
            if not _trains(calls, functions):
                continue
            reach: Optional[list[CallSite]] = None
            for call, model in _evals(calls, functions):
                if model in reported or _may_restore(calls, model, functions):
                    continue
                if reach is None:
                    reach = [*calls, *(c for site in calls for f in functions.get(site.attr, ()) for c in f.calls)]
                if not _called_as_model(reach, model):
                    continue
                if not _trains_before(calls, call, functions):
                    continue  # eval() before the iteration's training: every step, the first too, trains so on purpose
                if _training_sets_eval(src, scope, calls, model):
                    continue  # the training function puts the model in eval() itself: frozen BN on purpose
                if _without_mode_layers(src, scope, model):
                    continue  # eval() changes nothing in this model
                reported.add(model)
                yield Finding(
                    f"`{src.snippet(call.node)}` runs inside the training loop at line {loop.node.lineno} and "
                    f"nothing in that loop calls `{model}.train()`: from its second iteration on, every training "
                    "step runs with Dropout off and BatchNorm frozen.",
                    fix=Fix(title="Switch back to training mode at the top of the loop:", code=f"{model}.train()"),
                    location=src.location(call.node),
                )


# Layers of torch.nn whose behaviour eval() changes (LayerNorm and GroupNorm keep no running statistics).
_MODE_LAYERS = (
    "Dropout",
    "BatchNorm",
    "InstanceNorm",
    "AlphaDropout",
    "RReLU",
    "Transformer",
    "MultiheadAttention",
    "LSTM",
    "GRU",
    "RNN",
)
_MODE_FREE = frozenset(
    {
        "Module",
        "Sequential",
        "ModuleList",
        "ModuleDict",
        "Parameter",
        "ParameterList",
        "Identity",
        "Flatten",
        "Unflatten",
        "LayerNorm",
        "GroupNorm",
        "Embedding",
        "Linear",
        "Bilinear",
        "Conv1d",
        "Conv2d",
        "Conv3d",
        "ConvTranspose1d",
        "ConvTranspose2d",
        "ConvTranspose3d",
        "MaxPool1d",
        "MaxPool2d",
        "MaxPool3d",
        "AvgPool1d",
        "AvgPool2d",
        "AvgPool3d",
        "AdaptiveAvgPool1d",
        "AdaptiveAvgPool2d",
        "AdaptiveMaxPool2d",
        "Upsample",
        "PixelShuffle",
        "ReLU",
        "LeakyReLU",
        "GELU",
        "SiLU",
        "Sigmoid",
        "Tanh",
        "Softmax",
        "LogSoftmax",
        "ELU",
        "Mish",
        "Hardswish",
        "Softplus",
        "PReLU",
        "ZeroPad2d",
        "ReflectionPad2d",
    }
)


def _without_mode_layers(src: SourceFile, scope: FunctionScope, model: str) -> bool:
    """The model is an instance of a class of this file whose layers are all torch.nn layers that eval() does
    not change (no Dropout, BatchNorm, ...; no `F.dropout`, no layer of another library): eval() is a no-op."""
    if "." in model:
        return False
    built = [b.value for s in (scope, src.index.scopes[0]) for b in s.bindings_of(model) if b.value is not None]
    if len(built) != 1 or not isinstance(built[0], ast.Call) or not isinstance(built[0].func, ast.Name):
        return False
    return _mode_free_class(src, built[0].func.id, set())


def _mode_free_class(src: SourceFile, name: str, seen: set[str]) -> bool:
    if name in seen or src.tree is None:
        return name in seen
    seen.add(name)
    cls = next((n for n in src.tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if cls is None:
        return False
    for base in cls.bases:
        qual = qualname(base, src.index)
        if qual not in ("torch.nn.Module", "nn.Module") and not _mode_free_class(src, qual, seen):
            return False
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and "dropout" in node.attr.lower():
            return False  # `F.dropout(x, training=self.training)`, `self.dropout`
        if not isinstance(node, ast.Call):
            continue
        qual = qualname(node.func, src.index)
        short = qual.rsplit(".", 1)[-1]
        if qual.startswith("torch.nn.") and not qual.startswith("torch.nn.functional."):
            if short not in _MODE_FREE or any(word in short for word in _MODE_LAYERS):
                return False
        elif short[:1].isupper() and not _mode_free_class(src, short, seen) and short not in ("super",):
            return False  # a layer of another class or library: unknown
    return True


def _outermost_loops(scope: FunctionScope) -> list[tuple[Loop, list[CallSite]]]:
    """Loops not nested in another loop of the same function (epoch loops), each with the calls inside it (at any
    depth), in source order: one pass over the function's calls for all of them."""
    roots = [loop for loop in scope.loops if loop.parent is None]
    if len(roots) == 1:  # every call in a loop is in this one
        inside = {id(roots[0]): [c for c in scope.calls if c.loop is not None]}
    else:
        inside = {id(loop): [] for loop in roots}
        for call in scope.calls:
            at = call.loop
            if at is not None:
                while at.parent is not None:
                    at = at.parent
                inside[id(at)].append(call)
    return [(loop, inside[id(loop)]) for loop in roots if not isinstance(loop.node, ast.FunctionDef)]


def _trains_before(calls: list[CallSite], switch: CallSite, functions: dict[str, list[FunctionScope]]) -> bool:
    """Whether the loop trains (a backward, a step, or a local function doing both) before `switch` in its body."""
    return any(c.pos < switch.pos and (c.attr == "step" or is_backward(c) or _trains([c], functions)) for c in calls)


def _trains(calls: list[CallSite], functions: dict[str, list[FunctionScope]]) -> bool:
    """Whether these calls, with those of the functions of this file they call (by name), run backward and an
    optimizer step; their last names answer first, in one pass."""
    attrs = set(map(_ATTR, calls))
    local = [f for name in attrs.intersection(functions) for f in functions[name]]
    for f in local:
        attrs |= f.call_attrs
    if "step" not in attrs or attrs.isdisjoint(BACKWARD_METHODS):
        return False
    return any(is_backward(c) for c in calls if c.attr in BACKWARD_METHODS) or any(
        is_backward(c) for f in local for c in f.calls if c.attr in BACKWARD_METHODS
    )


def _evals(calls: list[CallSite], functions: dict[str, list[FunctionScope]]) -> Iterator[tuple[CallSite, str]]:
    """`model.eval()` calls in the loop, also through a local function given the model as an argument."""
    names = _SWITCHES.union(set(map(_ATTR, calls)).intersection(functions))
    for call in calls:
        attr = call.attr
        if attr not in names:
            continue
        if (attr == "eval" or attr == "train") and _switches_to_eval(call):
            yield call, str(call.receiver)
        for function in functions.get(attr, ()):
            if _SWITCHES.isdisjoint(function.call_attrs):
                continue
            params: Optional[list[str]] = None
            for inner in function.calls:
                if inner.attr not in _SWITCHES or not _switches_to_eval(inner):
                    continue
                if params is None:
                    params = _params(function)
                if inner.receiver in params:
                    argument = _argument(call, params.index(inner.receiver))
                    if argument:
                        yield call, argument
                elif not function.bindings_of(str(inner.receiver).split(".")[0]):
                    yield call, str(inner.receiver)  # a global or enclosing model (`def test(): net.eval()`)


def _may_restore(calls: list[CallSite], model: str, functions: dict[str, list[FunctionScope]]) -> bool:
    """A `.train()` in the loop or in a local function it calls, or the model handed to unseen code."""
    for call in calls:
        if _switches_to_train(call):
            return True
        local = functions.get(call.attr, ())
        if any(_switches_to_train(c) for f in local for c in f.calls):
            return True
        passes_model = any(ref(a) == model for a in call.node.args) or any(
            ref(k.value) == model for k in call.node.keywords
        )
        if passes_model and not local and call.attr not in _HARMLESS:
            return True
    return False


def _called_as_model(calls: list[CallSite], model: str) -> bool:
    """The receiver of eval() is run as a model (`model(x)`) or handed to a function, in the loop or in the
    functions of this file it calls."""
    return any(
        (c.receiver is None and ref(c.node.func) == model)
        or (c.attr == "forward" and c.receiver == model)
        or (c.attr not in _HARMLESS and any(ref(a) == model for a in c.node.args))
        for c in calls
    )


def _params(function: FunctionScope) -> list[str]:
    node = function.node
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return []
    names = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
    return names[1:] if function.class_name and names[:1] in (["self"], ["cls"]) else names


def _argument(call: CallSite, position: int) -> Optional[str]:
    """The name passed at `position` of the callee's parameters (keywords by name are not followed)."""
    return ref(call.node.args[position]) if position < len(call.node.args) else None


def _switches_to_eval(call: CallSite) -> bool:
    """`x.eval()` or `x.train(False)`."""
    return call.receiver is not None and (
        (call.attr == "eval" and not call.node.args) or (call.attr == "train" and _is_false(call))
    )


def _switches_to_train(call: CallSite) -> bool:
    """`x.train()` / `x.train(True)` (not a function named `train`)."""
    return call.receiver is not None and call.attr == "train" and not _is_false(call)


def _is_false(call: CallSite) -> bool:
    """`.train(False)` / `.train(mode=False)`: that is eval(), not a restore."""
    arg = call.node.args[0] if call.node.args else call.kwarg("mode")
    return isinstance(arg, ast.Constant) and arg.value is False


_ATTR = attrgetter("attr")
_SWITCHES = frozenset({"eval", "train"})  # the last names of the calls that switch a model's mode
_HARMLESS = frozenset({"print", "len", "isinstance", "getattr", "hasattr", "id", "type", "str", "repr"})
