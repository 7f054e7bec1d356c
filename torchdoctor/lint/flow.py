"""What names hold (optimizers, models, tensors, loaders) and where values flow, inside one function.

Every question here answers "yes" only when the code shows it; an unknown is a "no", so that the
rules built on top stay quiet when they cannot decide.
"""

from __future__ import annotations

import ast
import re
from operator import attrgetter
from typing import Iterable, Iterator, Optional

from torchdoctor.lint.index import Binding, CallSite, FunctionScope, Loop, ModuleIndex, child_fields, last, ref, resolve

OPTIMIZER_CLASSES = frozenset(
    {
        "SGD",
        "Adam",
        "AdamW",
        "Adamax",
        "Adagrad",
        "Adadelta",
        "Adafactor",
        "ASGD",
        "LBFGS",
        "NAdam",
        "RAdam",
        "RMSprop",
        "Rprop",
        "SparseAdam",
        "Lion",
        "LAMB",
        "Lamb",
        "FusedAdam",
        "FusedLAMB",
        "AdamW8bit",
        "Adam8bit",
    }
)
# The last name of every call `is_optimizer_ctor` accepts, unless its qualified name starts with torch.optim. (a
# function without such a call binds no optimizer: its bindings need not be looked at).
_OPTIMIZER_CALLS = OPTIMIZER_CLASSES | {"optimizers"}
_qualname = attrgetter("qualname")
_OPTIMIZER_NAME = re.compile(
    r"^(optim|optimi[sz]er|opt)(_?[A-Za-z0-9]+)?$|^[A-Za-z0-9]+_(optim|optimi[sz]er|opt)$", re.I
)
TENSOR_FACTORIES = frozenset(
    {
        "tensor",
        "as_tensor",
        "from_numpy",
        "zeros",
        "ones",
        "empty",
        "full",
        "rand",
        "randn",
        "randint",
        "arange",
        "linspace",
        "logspace",
        "eye",
        "zeros_like",
        "ones_like",
        "empty_like",
        "full_like",
        "rand_like",
        "randn_like",
        "stack",
        "cat",
        "Tensor",
        "FloatTensor",
        "LongTensor",
    }
)
BACKWARD_METHODS = frozenset({"backward", "manual_backward"})  # see is_backward
# Calls and attributes through which a value leaves autograd (its history is not kept).
_DETACHING_METHODS = frozenset({"item", "detach", "tolist", "numpy", "detach_"})
_DETACHING_FUNCTIONS = frozenset({"float", "int", "bool", "len", "round", "str", "repr", "format", "isinstance"})
_HISTORYLESS_ATTRS = frozenset({"data", "shape", "grad", "device", "dtype"})


def clears_every_grad(target: Optional[str]) -> bool:
    """`p.grad` (set to None, or `p.grad.zero_()`) of a plain name, as in `for p in model.parameters()`: the
    clear of every parameter it is run for. `model.head.weight.grad` clears one parameter, not the model's."""
    return target is not None and target.endswith(".grad") and "." not in target[:-5]


def is_optimizer_ctor(value: Optional[ast.expr], index: ModuleIndex) -> bool:
    """`torch.optim.Adam(...)`, `optim.SGD(...)`, `self.optimizers()` (Lightning) and the like."""
    if type(value) is not ast.Call:
        if type(value) is ast.Subscript:
            return is_optimizer_ctor(value.value, index)
        return False
    func = value.func
    if type(func) is ast.Attribute:  # the last segment of the callee's name is known without resolving it
        attr = func.attr
        if attr == "optimizers" or attr in OPTIMIZER_CLASSES:
            return True
        if not attr[:1].isupper():
            return False
        if type(func.value) is ast.Name:  # `base.Attr(...)`: from torch.optim when `base` is
            base = index.aliases.get(func.value.id, func.value.id)
            return base == "torch.optim" or base.startswith("torch.optim.")
        return qualname(func, index).startswith("torch.optim.")
    if type(func) is ast.Name and func.id not in index.aliases:  # a plain name: its own last segment
        return func.id in OPTIMIZER_CLASSES
    qual = index.aliases[func.id] if type(func) is ast.Name else qualname(func, index)
    return last(qual) in OPTIMIZER_CLASSES or qual.startswith("torch.optim.") and last(qual)[:1].isupper()


def is_optimizer(key: Optional[str], scope: FunctionScope, index: ModuleIndex) -> bool:
    """`key` was bound to an optimizer in this function or as an attribute anywhere, or is named like one."""
    if key is None:
        return False
    name = key.rsplit(".", 1)[-1]
    if "sched" in name.lower():
        return False
    if _OPTIMIZER_NAME.match(name):
        return True
    if "." not in key:
        return any(b.target == key for b in optimizer_bindings(scope, index))
    question = ("optimizer attribute", key)
    found = index.memo.get(question)
    if found is None:  # an attribute may be bound in any function (`self.opt = ...` in `__init__`): asked once
        found = index.memo[question] = any(b.target == key for s in index.scopes for b in optimizer_bindings(s, index))
    return found


def optimizer_bindings(scope: FunctionScope, index: ModuleIndex) -> list[Binding]:
    """The bindings of `scope` whose value builds an optimizer (worked out once per function)."""
    question = ("optimizer bindings", id(scope))
    found = index.memo.get(question)
    if found is None:
        found = index.memo[question] = []
        named = _OPTIMIZER_CALLS.intersection(scope.call_attrs)
        if "torch.optim." in "\n".join(map(_qualname, scope.calls)):  # (tests run in C: most functions build none)
            ctors = {
                id(c.node)
                for c in scope.calls  # the same test, call by call, where some call may
                if c.attr in _OPTIMIZER_CALLS or c.qualname.startswith("torch.optim.")
            }
        elif named:  # no callee from torch.optim: only a call named like an optimizer class may build one
            ctors = {id(c.node) for c in scope.calls_named(*named)}
        else:
            return found  # no call here can build one: the commonest answer
        subscript = ast.Subscript
        for b in scope.bindings:
            value = b.value
            while type(value) is subscript:  # `self.optimizers()[0]`, as is_optimizer_ctor reads it
                value = value.value
            if id(value) in ctors and is_optimizer_ctor(b.value, index):
                found.append(b)
    return found


def qualname(func: ast.expr, index: ModuleIndex) -> str:
    """The dotted name of a callee with this module's import aliases resolved (`nn.Linear` -> `torch.nn.Linear`)."""
    return resolve(func, index.aliases)


def is_module_ctor(value: Optional[ast.expr], index: ModuleIndex) -> bool:
    """A call that builds a new `nn.Module`/`nn.Parameter`: `nn.Linear(...)`, a local Module subclass, torchvision
    models."""
    if not isinstance(value, ast.Call):
        return False
    qual = qualname(value.func, index)
    name = last(qual)
    if qual.startswith(("torch.nn.", "torchvision.models.", "timm.create_model")) and (
        name[:1].isupper() or "models" in qual
    ):
        return not qual.startswith("torch.nn.functional.")
    bases = index.classes.get(qual)
    return bases is not None and any(b.endswith("Module") for b in bases)


def graph_refs(expr: Optional[ast.AST]) -> set[str]:
    """Names read by `expr` outside `.item()`/`.detach()`/`float()`/`.data`: the values whose history it keeps."""
    if type(expr) is ast.Name:  # (`loss.backward()`: the commonest, a name reads itself)
        return {expr.id}
    out: set[str] = set()
    stack: list = [expr]  # untyped: the walk below dispatches on exact node types, which mypy cannot narrow
    pop, push, extend = stack.pop, stack.append, stack.extend
    while stack:
        node = pop()
        t = type(node)
        if t is ast.Name:
            out.add(node.id)
        elif t is ast.Attribute:
            if node.attr not in _HISTORYLESS_ATTRS:
                key = ref(node)
                if key is not None:
                    out.add(key)
                push(node.value)
        elif t is ast.Call:
            func = node.func
            if (
                type(func) is ast.Attribute
                and func.attr in _DETACHING_METHODS
                or type(func) is ast.Name
                and func.id in _DETACHING_FUNCTIONS
            ):
                continue
            push(func)
            extend(node.args)
            extend(kw.value for kw in node.keywords)
        elif node is not None and t is not ast.Constant and t is not ast.Lambda and t is not ast.JoinedStr:
            for f in child_fields(t):
                value = getattr(node, f, None)
                if type(value) is list:
                    extend(value)
                else:
                    push(value)
    return out


def backward_targets(call: CallSite) -> list[ast.expr]:
    """The expressions a backward call differentiates: `loss` in `loss.backward()`, `scaler.scale(loss).backward()`,
    `self.manual_backward(loss)`, `accelerator.backward(loss)`, `torch.autograd.backward(loss)`."""
    func = call.node.func
    if isinstance(func, ast.Attribute):
        if call.node.args and not _tensor_like(func.value):
            return [call.node.args[0]]  # `accelerator.backward(loss)`: the receiver only runs the backward
        return [func.value, *call.node.args[:1]]
    return list(call.node.args[:1])


def _tensor_like(node: ast.expr) -> bool:
    """A backward receiver that is itself a tensor expression (`loss`, `out.sum()`, `scaler.scale(loss)`)
    rather than an object whose `backward(loss)` method runs one (`accelerator`, `self`, `fabric`)."""
    if isinstance(node, ast.Call):
        return True
    name = ref(node) or ""
    return name not in ("self", "torch.autograd", "autograd") and not name.endswith(
        ("accelerator", "fabric", "trainer", "engine")
    )


def is_backward(call: CallSite) -> bool:
    """A backward call (`loss.backward()`, `self.manual_backward(loss)`), not distributed autograd's; only calls
    whose method name is in `BACKWARD_METHODS` can be (a hot loop asks that first)."""
    if call.attr == "manual_backward":
        return True
    if call.attr != "backward":
        return False
    return "dist_autograd" not in call.qualname and "distributed.autograd" not in call.qualname


def backprop_names(scope: FunctionScope) -> set[str]:
    """Names whose value reaches a backward call in `scope` (directly or through assignments)."""
    names: set[str] = set()
    for call in scope.calls_named(*BACKWARD_METHODS):
        if is_backward(call):
            for target in backward_targets(call):
                names |= graph_refs(target)
    if scope.class_name and getattr(scope.node, "name", "") == "training_step":
        for ret in scope.returns:
            names |= graph_refs(ret.value)
    values: dict[str, list[ast.expr]] = {}
    for b in scope.bindings:
        if b.value is not None:
            values.setdefault(b.target, []).append(b.value)
    todo = list(names)
    while todo:
        for value in values.pop(todo.pop(), ()):
            new = graph_refs(value) - names
            names |= new
            todo.extend(new)
    return names


def calls_in(scope: FunctionScope, loop: Loop) -> list[CallSite]:
    """Calls of `scope` inside `loop` (at any depth), in source order."""
    inside = []
    for call in scope.calls:
        at = call.loop
        while at is not None:  # `loop.encloses(call.loop)`, written out: asked of every call of the function
            if at is loop:
                inside.append(call)
                break
            at = at.parent
    return inside


def inner_scopes(index: ModuleIndex, loop: Loop) -> Iterator[FunctionScope]:
    """Functions (closures) defined inside `loop`."""
    return (s for s in index.scopes if s.outer_loop is not None and loop.encloses(s.outer_loop))


def literal(expr: Optional[ast.expr]) -> object:
    """The value of a constant expression, or `...` (Ellipsis) when it is not a literal."""
    if isinstance(expr, ast.Constant):
        return expr.value
    return ...


def first_method_call(expr: ast.expr, names: frozenset[str]) -> Optional[ast.Call]:
    """The first call `x.<name>(...)` with a name among `names` in `expr`, in `ast.walk`'s order (breadth first,
    fields in order), found without ast.walk's generators: the optimizer rules ask it of every optimizer built."""
    name, constant, call, attribute = ast.Name, ast.Constant, ast.Call, ast.Attribute
    queue: list = [expr]  # read while it grows: a first-in, first-out walk (untyped: dispatched on exact types)
    for node in queue:
        t = type(node)
        if t is name or t is constant or node is None:  # (leaves; None is a `**mapping` entry's key in a dict)
            continue
        if t is call and type(node.func) is attribute and node.func.attr in names:
            return node
        for field in child_fields(t):
            value = getattr(node, field, None)
            if type(value) is list:
                queue.extend(value)
            elif value is not None:
                queue.append(value)
    return None


def iter_names(iterable: ast.expr) -> Iterable[str]:
    """Keys read by a loop's iterable: `loader` in `enumerate(tqdm(loader))`."""
    return (k for k in (ref(n) for n in ast.walk(iterable) if isinstance(n, (ast.Name, ast.Attribute))) if k)
