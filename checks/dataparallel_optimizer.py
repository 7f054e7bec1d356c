"""dataparallel-optimizer: an optimizer wrapped in DataParallel/DistributedDataParallel, which only wrap modules."""

from __future__ import annotations

import ast
from typing import Any, Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Pitfall
from torchdoctor.sdk.source import SourceFile, is_optimizer, last, ref

_SETUP = """
import torch
from torch import nn

model = nn.Linear(4, 2)
"""

DATAPARALLEL_OPTIMIZER = Pitfall(
    code="TD505",
    name="dataparallel-optimizer",
    severity="error",
    summary="An optimizer is wrapped in DataParallel/DistributedDataParallel, which only wraps modules.",
    why="""
        DataParallel replicates a module's forward across GPUs; an optimizer is not a module. Wrapping it fails
        (`'SGD' object has no attribute ...`) or hides the optimizer behind a wrapper whose `step()` is not the
        optimizer's.
    """,
    fix="Wrap the model, then build the optimizer from the wrapped model's parameters.",
    bad=Example(
        """
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        optimizer = nn.DataParallel(optimizer)
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        model = nn.DataParallel(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        """,
        setup=_SETUP,
    ),
    details={
        "source": """
            Reported when the first argument of `DataParallel(...)`/`DistributedDataParallel(...)` is a name built
            by an optimizer constructor or named like one (`optimizer`, `opt_g`, ...).
        """,
    },
)


@DATAPARALLEL_OPTIMIZER.source
def dataparallel_optimizer(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or "DataParallel" not in src.text:
        return
    index = src.index
    for scope in index.scopes:
        for call in scope.calls:
            if last(call.qualname) not in ("DataParallel", "DistributedDataParallel") or not call.node.args:
                continue
            wrapped: Optional[str] = ref(call.node.args[0])
            if is_optimizer(wrapped, scope, index):
                yield Finding(
                    f"`{src.snippet(call.node)}` wraps the optimizer `{wrapped}`: DataParallel only parallelises "
                    "modules; the optimizer is not a module and must stay as it is.",
                    fix=_fix(src, scope, call, wrapped),
                    location=src.location(call.node),
                )


def _fix(src: SourceFile, scope: Any, call: Any, optimizer: Optional[str]) -> Fix:
    """Wrap the model where the optimizer was wrapped, then build the optimizer again as it was built."""
    wrapper = src.segment(call.node.func)
    built = [
        b
        for b in scope.bindings
        if b.target == optimizer
        and b.value is not None
        and b.value is not call.node
        and isinstance(b.value, ast.Call)
        and b.pos < (call.node.lineno, call.node.col_offset)
    ]
    model = (
        next(
            (
                ref(a.func.value)
                for b in built[-1:]
                for a in ast.walk(b.value)
                if isinstance(a, ast.Call)
                and isinstance(a.func, ast.Attribute)
                and a.func.attr == "parameters"
                and ref(a.func.value)
            ),
            None,
        )
        or "model"
    )
    rebuild = (
        f"{optimizer} = {src.segment(built[-1].value)}"
        if built
        else f"{optimizer} = torch.optim.SGD({model}.parameters(), lr=0.1)  # with your optimizer's arguments"
    )
    return Fix(
        title=f"Wrap the model instead, on line {call.node.lineno}, then build the optimizer again from it:",
        code=f"{model} = {wrapper}({model})\n{rebuild}",
    )
