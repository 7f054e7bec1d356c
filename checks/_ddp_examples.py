"""The distributed pitfalls' examples: their hidden setup (one rank of a `torchrun --nproc_per_node=2` job
with a small BatchNorm model, data and a loss, so each example reads as a complete program), and why the
examples test cannot run them."""

DDP_SETUP = """
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

local_rank = int(os.environ["LOCAL_RANK"])
if torch.cuda.is_available():
    torch.cuda.set_device(local_rank)
dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
dataset = TensorDataset(torch.randn(640, 6), torch.randint(0, 3, (640,)))
loss_fn = nn.CrossEntropyLoss()
epochs = 2
"""

# Why the examples contract test cannot run these examples (the page prints it after "does not flag this example:").
UNSEEN = {
    "distributed": "it needs the other ranks of a `torchrun --nproc_per_node=2` job, which the examples test "
    "does not start (it runs each example in a single process)."
}
