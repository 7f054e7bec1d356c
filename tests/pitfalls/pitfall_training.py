"""Run a pitfall's example loop for a few epochs under watch and measure how well the model learned: the
examples are honest only if the Bad one visibly learns worse than the Good one."""

from __future__ import annotations

from typing import Any, Callable

import torchdoctor
from torchdoctor.pitfall import Example, Pitfall


def train(
    pitfall: Pitfall, example: Example, epochs: int, score: Callable[[dict], float], **watch_kwargs: Any
) -> tuple[list, float]:
    """(this pitfall's findings, score(namespace)) after running the example's loop `epochs` times."""
    namespace: dict[str, Any] = {"__name__": "__example__"}
    exec(compile(example.setup, "<setup>", "exec"), namespace)
    loop = compile(example.code, "<example>", "exec")
    with torchdoctor.watch(
        namespace["model"],
        namespace.get("optimizer"),
        checks=[pitfall.name],
        on_finding=lambda f: None,
        report=False,
        **watch_kwargs,
    ) as session:
        for _ in range(epochs):
            exec(loop, namespace)
    return session.findings, score(namespace)
