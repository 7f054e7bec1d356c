"""ddp-param-desync: parameters differ across DDP ranks because something changed them outside DDP's update."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import StepEvent

from ._cross_rank import CrossRankCheck, differing, listing, ranks_of
from ._ddp_examples import DDP_SETUP, UNSEEN

_PRETRAINED = (
    DDP_SETUP
    + """
pretrained = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
torch.save(pretrained.state_dict(), "pretrained.pt")
loader = DataLoader(dataset, batch_size=16, sampler=DistributedSampler(dataset))
"""
)

DDP_PARAM_DESYNC = Pitfall(
    code="TD402",
    name="ddp-param-desync",
    severity="error",
    summary="Parameters differ across DDP ranks: something changed them outside DDP's synchronised update.",
    why="""
        DDP broadcasts rank 0's parameters when it is built and then applies the same averaged gradients
        everywhere, so every rank holds the same model. Code that changes parameters on some ranks only, such as
        an update under `if rank == 0:`, a checkpoint loaded on rank 0 after wrapping, or a learning rate that
        depends on the rank, silently splits the job into different models: the averaged gradients no longer fit
        any of them, and what rank 0 saves is not what the others trained.
    """,
    fix="""
        Change parameters identically on every rank. Load checkpoints on every rank before wrapping the model in
        DDP (or broadcast rank 0's values after loading). Build the optimizer the same way on every rank.
    """,
    bad=Example(
        """
        model = DDP(model.to(device))
        if dist.get_rank() == 0:  # rank 0 only, after wrapping: the other ranks keep their random weights
            model.module.load_state_dict(torch.load("pretrained.pt", weights_only=True))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        """,
        setup=_PRETRAINED,
        unseen=UNSEEN,
    ),
    good=Example(
        """
        model.load_state_dict(torch.load("pretrained.pt", map_location="cpu", weights_only=True))  # every rank
        model = DDP(model.to(device))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        """,
        setup=_PRETRAINED,
        unseen=UNSEEN,
    ),
    details={
        "distributed": """
            Every `every` optimizer steps, just before the step (where every rank holds the result of the same
            averaged updates), each rank takes the sum and the sum of squares of every parameter of the DDP model;
            the ranks exchange these numbers over torchdoctor's own gloo group and compare them with rank 0's,
            within the tolerance that another summation order on other hardware explains. The first step where
            they differ is an error naming up to four parameters and the ranks. Only models wrapped in
            `DistributedDataParallel` over every rank are compared (a DDP over a subgroup, or FSDP, holds
            different values by design).
        """,
    },
)


@DDP_PARAM_DESYNC.distributed
class DDPParamDesync(CrossRankCheck):
    """Parameters fingerprinted at PERIODIC (before the step: every rank holds the result of the same
    averaged updates there) and compared with rank 0's."""

    part = "params"

    def on_periodic(self, event: StepEvent) -> Iterator[Finding]:
        rnd = self._round(event)
        if rnd is None or self.ex is None:
            return
        names, _ = self.ex.names("params")
        diffs = differing(rnd, "params", names)
        if not diffs:
            return
        self.reported = True
        yield Finding(
            f"{len(diffs)} parameter(s) differ between rank 0 and {ranks_of(diffs)} at step {rnd.step}, although DDP "
            f"keeps them identical: {listing(diffs)}. They were changed outside DDP's averaged update on some ranks "
            "only (an update under `if rank == 0:`, a checkpoint loaded on one rank after wrapping, a per-rank "
            "learning rate or optimizer), so the ranks now train different models.",
            fix=Fix(
                title="Change parameters identically on every rank; load checkpoints on every rank before wrapping "
                "in DDP, or copy rank 0's values to all ranks:",
                code="with torch.no_grad():\n    for p in model.module.parameters():\n        dist.broadcast(p, src=0)",
            ),
            location=Location(param=diffs[0][0], step=rnd.step),
        )
