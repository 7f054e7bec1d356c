"""What a lint detector (``@pitfall.source``) receives — a parsed `SourceFile` — and the program-model
queries over it (scopes, bindings, call sites, loops, names), the facts a rule declares about functions
(`Fact`, `Effect`, asked through `src.project`), plus `Edit` for safe ``--fix``es."""

from torchdoctor.lint.facts import Effect, Fact, Function, enclosing_ifs, rebind
from torchdoctor.lint.flow import (
    BACKWARD_METHODS,
    TENSOR_FACTORIES,
    backprop_names,
    backward_targets,
    calls_in,
    clears_every_grad,
    first_method_call,
    graph_refs,
    inner_scopes,
    is_backward,
    is_module_ctor,
    is_optimizer,
    is_optimizer_ctor,
    iter_names,
    literal,
    optimizer_bindings,
    qualname,
)
from torchdoctor.lint.index import Binding, CallSite, FunctionScope, Loop, ModuleIndex, last, ref
from torchdoctor.lint.source import Edit, FixableFinding, SourceFile, Spanned, end_of, has_word

__all__ = [
    "BACKWARD_METHODS",
    "Binding",
    "CallSite",
    "Edit",
    "Effect",
    "Fact",
    "FixableFinding",
    "Function",
    "FunctionScope",
    "Loop",
    "ModuleIndex",
    "SourceFile",
    "Spanned",
    "TENSOR_FACTORIES",
    "backprop_names",
    "backward_targets",
    "calls_in",
    "clears_every_grad",
    "enclosing_ifs",
    "end_of",
    "first_method_call",
    "graph_refs",
    "has_word",
    "inner_scopes",
    "is_backward",
    "is_module_ctor",
    "is_optimizer",
    "is_optimizer_ctor",
    "iter_names",
    "last",
    "literal",
    "optimizer_bindings",
    "qualname",
    "rebind",
    "ref",
]
