"""dataparallel-optimizer: an optimizer wrapped in DataParallel/DistributedDataParallel, which only wrap modules."""
from __future__ import annotations

from typing import Iterator, Optional

from torchdoctor.sdk import Example, Finding, Pitfall
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
        model = nn.DataParallel(model.to("cuda"))
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
                    fix=f"Wrap the model, then build the optimizer from it:\nmodel = {last(call.qualname)}(model)\n"
                        f"{wrapped} = torch.optim.SGD(model.parameters(), lr=...)",
                    location=src.location(call.node),
                )
