"""What the source shows of an activation (softmax, sigmoid) fed to a loss that applies its own: shared by the
source detectors of softmax-before-cross-entropy and sigmoid-before-bce-with-logits.

A loss call is `F.<loss>(...)`, `nn.<Loss>()(...)`, or a name (`criterion`, `self.criterion`) every binding of
which in the file builds `nn.<Loss>(...)`. Its input shows the activation when it is the activation's call, a
name last bound to one in the same function, or the output of a model (`model(x)`, or a name bound to it) whose
construction shows it: `nn.Sequential(..., nn.Softmax(...))`, or a project class whose `forward` (in this file
or an imported project module) returns the activation on every `return`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Union

from torchdoctor.sdk.source import CallSite, FunctionScope, ModuleIndex, SourceFile, last, qualname, ref

_FUNCTIONAL = "torch.nn.functional."
_MAX_BINDINGS = 8


@dataclass(frozen=True)
class Activation:
    """Which activation a rule looks for: its function names and its layer class name."""

    functions: frozenset[str]  # last names of the calls: `softmax` (torch.softmax, F.softmax, x.softmax)
    layer: str  # `Softmax` (nn.Softmax)


@dataclass
class Evidence:
    """Where the activation is: `node` in this file (the call, or the model's layer), or a forward elsewhere."""

    node: Optional[ast.expr]  # the activation's call in this file (a direct or bound input)
    how: str  # a phrase for the message
    fixable: bool  # `node` is the activation's call written inside the loss call's input


def loss_calls(
    src: SourceFile, losses: frozenset[str], classes: frozenset[str]
) -> Iterator[tuple[FunctionScope, CallSite, str, ast.expr]]:
    """(scope, call, loss name, input) for each call of a loss among `losses` (functional names) or `classes`
    (nn class names)."""
    index = src.index
    built = _loss_built(index, classes) if any(c in src.text for c in classes) else frozenset()
    built_last = {target.rsplit(".", 1)[-1] for target in built}  # what `x.crit(...)` or `crit(...)` must end in
    # A function none of whose calls ends in such a name (nor in a loss function's), none of whose callees is
    # an expression (`nn.CrossEntropyLoss()(...)`: no name, ''), is skipped at once; a name bound to a loss that
    # is also an import alias would hide under the alias's name: then no function is skipped.
    wanted = losses | built_last | {""}
    every = not built_last.isdisjoint(index.aliases)
    known: dict[tuple[Union[str, int], str], Optional[str]] = {}
    for scope in index.scopes if every else [s for s in index.scopes if not wanted.isdisjoint(s.call_attrs)]:
        # Only calls named in `wanted` pass the test below (a callee name that is no alias is its own last name;
        # an expression callee has none, '').
        for call in scope.calls if every else [c for c in scope.calls if c.attr in wanted]:
            func = call.node.func
            if call.attr not in losses and (
                (type(func) is ast.Name and func.id not in built_last)
                or (type(func) is ast.Attribute and func.attr not in built_last)
            ):
                continue  # neither `F.<loss>(...)` nor a call through a name bound to a loss
            name = _loss_name(call, scope, index, losses, classes, built, known)
            if name is None:
                continue
            node = call.node
            inp = node.args[0] if node.args else call.kwarg("input")
            if inp is not None and not isinstance(inp, ast.Starred):
                yield scope, call, name, inp


def _loss_built(index: ModuleIndex, classes: frozenset[str]) -> frozenset[str]:
    """The names some binding of the file (a parameter's default included) sets to an `nn.<Loss>(...)` of
    `classes`: a call through any other name is no loss call, whatever its bindings (asked once per file). Only
    the functions that call such a class, or take one as a parameter's default, are read."""
    question = ("names bound to a loss", classes)
    found = index.memo.get(question)
    if found is None:
        aliases, targets = index.aliases, set()

        def named(value: Optional[ast.expr]) -> str:
            """The last name of the class a call builds (the full resolution only for a loss class's)."""
            if type(value) is not ast.Call:
                return ""
            func = value.func
            if type(func) is ast.Attribute:
                return func.attr
            return last(aliases.get(func.id, func.id)) if type(func) is ast.Name else ""

        for s in index.scopes[1:]:  # the functions (the module body, first, takes no parameters: below)
            args = s.node.args  # type: ignore[union-attr]
            if (args.defaults or args.kw_defaults) and _default_built(args, classes, named):
                defaults = _defaults(s)  # `self.loss = loss` binds a parameter's default
                for b in s.bindings:
                    value = b.value
                    if type(value) is ast.Name:
                        value = defaults.get(value.id, value)
                    if type(value) is ast.Call and named(value) in classes and _loss_class(value, index, classes):
                        targets.add(b.target)
            elif not classes.isdisjoint(s.call_attrs):
                targets |= _bound_to_class(s, index, classes)
        if not classes.isdisjoint(index.scopes[0].call_attrs):
            targets |= _bound_to_class(index.scopes[0], index, classes)
        found = index.memo[question] = frozenset(targets)
    return found


def _bound_to_class(scope: FunctionScope, index: ModuleIndex, classes: frozenset[str]) -> set[str]:
    """The names the function (no parameter's default of which builds a loss) binds to an `nn.<Loss>(...)`: a
    binding's value that is a call is one of the function's calls, whose last name (`attr`) is the one `named`
    reads of its node, so the function's calls of these names are all the candidates."""
    built = {c.node for c in scope.calls if c.attr in classes and _loss_class(c.node, index, classes)}
    return {b.target for b in scope.bindings if b.value in built} if built else set()


def _default_built(args: ast.arguments, classes: frozenset[str], named: Callable[[ast.expr], str]) -> bool:
    """Some parameter's default is a call of one of `classes` (by its last name)."""
    for d in (*args.defaults, *args.kw_defaults):
        if type(d) is ast.Call and named(d) in classes:
            return True
    return False


def _loss_name(
    call: CallSite,
    scope: FunctionScope,
    index: ModuleIndex,
    losses: frozenset[str],
    classes: frozenset[str],
    built: frozenset[str],
    known: dict[tuple[Union[str, int], str], Optional[str]],
) -> Optional[str]:
    """The loss `call` runs, if any (`known`: the answers for the names bound to a loss, by where they are bound)."""
    func = call.node.func
    if call.qualname.startswith(_FUNCTIONAL) and call.attr in losses:
        return call.attr
    if isinstance(func, ast.Call):  # nn.CrossEntropyLoss()(x, y)
        return _loss_class(func, index, classes)
    target = ref(func) if isinstance(func, (ast.Name, ast.Attribute)) else None
    if target is None or target not in built:
        return None
    # The answer depends on where the name may be bound (see _scopes_binding): the class, else the function.
    key = (scope.class_name if target.startswith("self.") and scope.class_name is not None else id(scope), target)
    if key in known:
        return known[key]
    values = [
        _default_if_parameter(b.value, s) for s in _scopes_binding(target, scope, index) for b in s.bindings_of(target)
    ]
    names = {_loss_class(v, index, classes) if isinstance(v, ast.Call) else None for v in values}
    answer = known[key] = names.pop() if values and len(values) <= _MAX_BINDINGS and len(names) == 1 else None
    return answer


def _default_if_parameter(value: Optional[ast.expr], scope: FunctionScope) -> Optional[ast.expr]:
    """`self.loss = loss` where `loss` is a parameter of that function: the parameter's default value."""
    return _defaults(scope).get(value.id, value) if isinstance(value, ast.Name) else value


def _defaults(scope: FunctionScope) -> dict[str, ast.expr]:
    """The default values of the function's parameters, by name (none for the module body)."""
    node = scope.node
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return {}
    args = node.args
    positional = args.posonlyargs + args.args
    defaults = dict(zip((a.arg for a in positional[len(positional) - len(args.defaults) :]), args.defaults))
    defaults.update((a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None)
    return defaults


def _loss_class(call: ast.Call, index: ModuleIndex, classes: frozenset[str]) -> Optional[str]:
    qual = qualname(call.func, index)
    return last(qual) if qual.startswith("torch.nn.") and last(qual) in classes else None


def _scopes_binding(target: str, scope: FunctionScope, index: ModuleIndex) -> list[FunctionScope]:
    """Where `target` may be bound: `self.x` in any method of the class, else this function and the module body."""
    if target.startswith("self.") and scope.class_name is not None:
        return [s for s in index.scopes if s.class_name == scope.class_name]
    chain = [scope]  # this function, the functions it is nested in (closures), the module body
    while chain[-1].parent is not None and len(chain) < 6:
        chain.append(chain[-1].parent)
    module_scope = index.scopes[0]
    return chain if chain[-1] is module_scope else [*chain, module_scope]


def activation_call(node: ast.expr, index: ModuleIndex, act: Activation) -> bool:
    """`torch.softmax(x)`, `F.softmax(x)`, `x.softmax(...)`, `nn.Softmax(dim)(x)` (not `log_softmax`)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Call):
        qual = qualname(func.func, index)
        return last(qual) == act.layer and qual.startswith("torch.nn")
    return last(qualname(func, index)) in act.functions


def _last_binding(name: str, scope: FunctionScope, before: tuple[int, int]) -> Optional[ast.expr]:
    """The value last bound to `name` before `before` in this function (for `for name in rows:`, `rows`)."""
    bound = [b for b in scope.bindings_of(name) if b.pos < before]
    if not bound or bound[-1].augmented:
        return None
    node = bound[-1].node
    if isinstance(node, (ast.For, ast.AsyncFor)) and not isinstance(node.target, ast.Name):
        return None  # `for out, label in pairs`: not the rows of one tensor
    return bound[-1].value


def evidence(
    src: SourceFile, scope: FunctionScope, call: CallSite, inp: ast.expr, act: Activation
) -> Optional[Evidence]:
    """How the source shows that the loss input `inp` is the activation's output (None when it does not)."""
    index = src.index
    if activation_call(inp, index, act):
        return Evidence(inp, "is computed by", True)
    value: Optional[ast.expr] = inp
    while isinstance(value, ast.Subscript):  # `probs[:n]`: rows of the same tensor
        value = value.value
    if isinstance(value, ast.Name):
        name = value.id
        value = _last_binding(name, scope, call.pos)
        while isinstance(value, ast.Subscript):
            value = value.value
        if isinstance(value, ast.Name):  # `src_prob = prob[:n]`: one more step
            value = _last_binding(value.id, scope, call.pos)
        if value is not None and activation_call(value, index, act):
            return Evidence(value, f"is `{name}`, bound to", False)
    if not isinstance(value, ast.Call) or value.args == [] and not value.keywords:
        return None
    model = ref(value.func)
    if model is None or isinstance(value.func, ast.Attribute) and not model.startswith("self."):
        return None  # `x.view(...)`, `torch.cat(...)`: not a model call
    built = [b.value for s in _scopes_binding(model, scope, index) for b in s.bindings_of(model)]
    if len(built) != 1 or not isinstance(built[0], ast.Call):
        return None
    ctor = _strip_moves(built[0])
    if ctor is None:
        return None
    layer = _sequential_last(ctor, index, act)
    if layer is not None:
        return Evidence(layer, f"comes from `{model}`, which ends with", False)
    where = _forward_returns(src, ctor, act)
    if where is not None:
        return Evidence(None, f"comes from `{model}`, whose forward ({where}) returns", False)
    return None


def _strip_moves(call: ast.Call) -> Optional[ast.Call]:
    """`Net(...).to(device).train()` -> `Net(...)`."""
    node: ast.expr = call
    for _ in range(4):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("to", "cuda", "cpu", "train", "float", "half", "bfloat16", "double")
        ):
            node = node.func.value
        else:
            break
    return node if isinstance(node, ast.Call) else None


def _sequential_last(ctor: ast.Call, index: ModuleIndex, act: Activation) -> Optional[ast.expr]:
    """The activation layer ending `nn.Sequential(..., nn.Softmax(dim=1))`."""
    if qualname(ctor.func, index) != "torch.nn.Sequential" or not ctor.args:
        return None
    layer = ctor.args[-1]
    if isinstance(layer, ast.Call) and last(qualname(layer.func, index)) == act.layer:
        return layer
    return None


def _forward_returns(src: SourceFile, ctor: ast.Call, act: Activation) -> Optional[str]:
    """`file:line` of the forward of the project class `ctor` builds, when every return gives the activation."""
    if not isinstance(ctor.func, ast.Name):
        return None
    name = ctor.func.id

    def ask(program: Any, module: Any) -> Optional[str]:
        owner, cls = module, name
        if (cls, "forward") not in owner.methods:
            target = module.imports(program).get(name)
            if target is None or target[0] is None or target[1] is None:
                return None
            owner, cls = program.module(target[0]), target[1]
            if owner is None:
                return None
        forward = owner.methods.get((cls, "forward"))
        if forward is None or not forward.returns:
            return None
        for ret in forward.returns:
            value = ret.value
            if isinstance(value, ast.Name):
                value = _last_binding(value.id, forward, (ret.lineno, ret.col_offset))
            if value is None or not activation_call(value, owner.index, act):
                return None
        path = owner.path if owner is not module else src.path
        return f"{path.rsplit('/', 1)[-1]}:{forward.returns[-1].lineno}"

    # the program model's question API (it records the other files read, for the lint cache)
    answer: Optional[str] = src.project._ask(ask, None)
    return answer


def fixed_line(src: SourceFile, call: CallSite, found: Evidence, replacement: str) -> Optional[str]:
    """The loss call's line, unindented, with the activation's call replaced (None across several lines)."""
    node = found.node
    if (
        node is None
        or not found.fixable
        or call.node.lineno != getattr(node, "end_lineno", None)
        or node.lineno != call.node.lineno
    ):
        return None
    line = src.lines[node.lineno - 1]
    start, end = src.char_col(node.lineno, node.col_offset), src.char_col(node.lineno, node.end_col_offset or 0)
    return (line[:start] + replacement + line[end:]).strip()


def first_argument(src: SourceFile, node: Optional[ast.expr]) -> Optional[str]:
    """The tensor an activation call is applied to: `model(x)` in `torch.softmax(model(x), dim=1)`, `out` in
    `out.softmax(1)`."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if (
        isinstance(func, ast.Attribute)
        and not qualname(func, src.index).startswith("torch.")
        and not (ref(func.value) or "").startswith("self")
    ):
        return src.segment(func.value)  # a method: `out.softmax(1)`
    return src.segment(node.args[0]) if node.args else None
