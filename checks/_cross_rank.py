"""Shared by the cross-rank pitfalls (ddp-buffer-desync, ddp-param-desync, ddp-same-data): the session's
rank exchange, and the comparison and wording of the fingerprints the ranks exchanged.

Fingerprints are exchanged at PERIODIC points over torchdoctor's own gloo group with a timeout; every
rank makes the same comparison on the same data, so each reports the same finding at the same step (and
``on_finding="raise"`` stops all of them together).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from torchdoctor.sdk.runtime import RuntimeCheck, StepEvent

if TYPE_CHECKING:
    from torchdoctor.sdk.runtime import RankExchange, Round

SHOWN = 4  # names listed in a message

# (tensor name, the ranks whose tensor differs from rank 0's, rank 0's sum, the first such rank's sum)
Diff = tuple[str, list[int], float, float]


def differing(rnd: "Round", part: str, names: list[str]) -> list[Diff]:
    """Per tensor of `part` that some rank holds differently from rank 0, its `Diff`."""
    from torchdoctor.sdk.runtime import stats_differ

    vectors = [p.get(part) for p in rnd.payloads]
    if any(v is None or len(v) != len(names) for v in vectors):
        return []  # some rank took no fingerprint at this step, or the models differ: nothing to compare
    out = []
    for i, name in enumerate(names):
        ranks = [r for r in range(1, len(vectors)) if stats_differ(vectors[0][i], vectors[r][i])]
        if ranks:
            out.append((name, ranks, vectors[0][i][0], vectors[ranks[0]][i][0]))
    return out


def listing(diffs: list[Diff]) -> str:
    """The first few differing tensors with both sums, for a message."""
    shown = [f"{name} (sum {a:.6g} on rank 0, {b:.6g} on rank {ranks[0]})" for name, ranks, a, b in diffs[:SHOWN]]
    more = f" and {len(diffs) - SHOWN} more" if len(diffs) > SHOWN else ""
    return ", ".join(shown) + more


def ranks_of(diffs: list[Diff]) -> str:
    """'rank 1' / 'ranks 1, 3': the ranks that differ from rank 0."""
    ranks = sorted({r for _, rs, _, _ in diffs for r in rs})
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


class CrossRankCheck(RuntimeCheck):
    """A check that compares one `part` of the ranks' fingerprints at PERIODIC, and reports once."""

    part = ""

    def on_start(self) -> None:
        self.ex = self._exchange()
        self.reported = False

    def _exchange(self) -> Optional["RankExchange"]:
        """The session's exchange when `part` can be compared (a DDP model spanning every rank), else None."""
        from torchdoctor.sdk.runtime import exchange_for

        if self.ctx.world_size < 2:
            return None
        ex = exchange_for(self.ctx)
        return ex if ex.want(self.part, self) else None

    def _round(self, event: StepEvent) -> Optional["Round"]:
        """This step's exchanged fingerprints, or None (nothing to compare, or already reported)."""
        if self.ex is None or self.reported:
            return None
        return self.ex.round(event)


class FingerprintedInForward(CrossRankCheck):
    """Its fingerprint is taken in the next due step's forward, which the exchange arms after each step."""

    def on_step_post(self, event: StepEvent) -> None:
        if self.ex is not None and not self.reported:
            self.ex.on_step_post(event)
