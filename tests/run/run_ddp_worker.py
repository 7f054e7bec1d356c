"""One rank of the `torchdoctor run` under DDP test: runs a correct DDP script and one that changes rank 0's
parameters after wrapping, each under the doctor (`run_script`), and writes the findings to OUT_DIR/rank<N>.json.

Usage: RANK=r WORLD_SIZE=2 PORTS=p1,p2 OUT_DIR=d python run_ddp_worker.py
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from torchdoctor.run.doctor import run_script
from torchdoctor.run.script import Target

SCRIPT = """
import sys
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

port, bug = sys.argv[1], sys.argv[2] == "bug"
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank={rank}, world_size=2)
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)))
if bug and dist.get_rank() == 0:  # rank 0 only, after wrapping
    with torch.no_grad():
        model.module[0].weight.add_(0.5)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(dist.get_rank())
for _ in range(12):
    x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
dist.destroy_process_group()
"""


def main() -> None:
    rank, out = int(os.environ["RANK"]), Path(os.environ["OUT_DIR"])
    script = out / f"ddp_rank{rank}.py"
    script.write_text(SCRIPT.replace("{rank}", str(rank)))
    results = {}
    for kind, port in zip(("good", "bug"), os.environ["PORTS"].split(",")):
        result = run_script(Target(path=str(script), args=[port, kind]), on_finding=lambda f: None)
        results[kind] = {
            "status": result.exit_status,
            "findings": [f.to_dict() for f in result.report.findings],
            "checks": result.report.facts.get("checks", []),
        }
        sys.argv = [sys.argv[0]]
    (out / f"rank{rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
