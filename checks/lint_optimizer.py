"""Optimizer rules in source: an optimizer wrapped in DataParallel."""
from __future__ import annotations

from typing import Iterator, Optional

from torchdoctor.findings import Finding
from torchdoctor.lint.flow import is_optimizer
from torchdoctor.lint.index import last, ref
from torchdoctor.lint.source import SourceFile
from torchdoctor.registry import Scope, check


@check(code="TD505", name="dataparallel-optimizer", scope=Scope.SOURCE, severity="error",
       summary="An optimizer is wrapped in DataParallel/DistributedDataParallel, which only wraps modules.")
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
