"""shuffle-with-sampler: `DataLoader(shuffle=True, sampler=...)`, which PyTorch refuses at start-up."""

from __future__ import annotations

import ast
from typing import Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Pitfall
from torchdoctor.sdk.source import CallSite, SourceFile, last, literal

_SETUP = """
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dataset = TensorDataset(torch.randn(256, 4), torch.randint(0, 2, (256,)))
distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
"""

SHUFFLE_WITH_SAMPLER = Pitfall(
    code="TD502",
    name="shuffle-with-sampler",
    severity="error",
    summary="""
        DataLoader(shuffle=True) with a sampler or batch_sampler: PyTorch raises 'sampler option is mutually
        exclusive with shuffle'.
    """,
    why="""
        A sampler decides the order of the samples, so DataLoader refuses `shuffle=True` next to it and the script
        dies at start-up, often only on the distributed path where the sampler is added.
    """,
    fix="""
        Drop `shuffle=True` and let the sampler shuffle (`DistributedSampler(dataset, shuffle=True)` is the
        default).
    """,
    bad=Example(
        """
        loader = DataLoader(dataset, batch_size=64, shuffle=True, sampler=DistributedSampler(dataset))
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        sampler = DistributedSampler(dataset) if distributed else None
        loader = DataLoader(dataset, batch_size=64, shuffle=(sampler is None), sampler=sampler)
        """,
        setup=_SETUP,
    ),
    details={
        "source": "Only a literal `shuffle=True` next to a sampler that is not a literal `None` is reported, whether "
        "they are passed by keyword or by position (`DataLoader(ds, 32, True, sampler)`).",
    },
)


# DataLoader(dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None, ...): positions of each.
_POSITION = {"shuffle": 2, "sampler": 3, "batch_sampler": 4}


def _argument(call: CallSite, name: str) -> Optional[ast.expr]:
    """A DataLoader argument, by keyword or by position."""
    value = call.kwarg(name)
    if (
        value is None
        and len(call.node.args) > _POSITION[name]
        and not any(isinstance(a, ast.Starred) for a in call.node.args[: _POSITION[name] + 1])
    ):
        value = call.node.args[_POSITION[name]]
    return value


@SHUFFLE_WITH_SAMPLER.source
def shuffle_with_sampler(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or "DataLoader" not in src.text or "ampler" not in src.text:
        return
    for call in src.index.all_calls():
        if not last(call.qualname).endswith("DataLoader") or literal(_argument(call, "shuffle")) is not True:
            continue
        for option in ("sampler", "batch_sampler"):
            value = _argument(call, option)
            if value is not None and literal(value) is not None:
                yield Finding(
                    f"`{src.snippet(call.node)}` passes shuffle=True together with {option}=: DataLoader raises "
                    f"'{option} option is mutually exclusive with shuffle'. The sampler decides the order.",
                    fix=Fix(
                        title="Drop shuffle=True and let the sampler shuffle (DistributedSampler(dataset, "
                        "shuffle=True)), "
                        f"e.g. `DataLoader(dataset, {option}=..., shuffle=False)`."
                    ),
                    location=src.location(call.node),
                )
                break
