"""`torchdoctor run` on a compiled nanoGPT-shaped loop: the loss computed inside the compiled forward, an
evaluation under no_grad and eval() every few steps, gradient accumulation. watch's patches must add no
recompilation and no compiled frame of their own, and no check may fail on torch.compile's fake tensors."""

from __future__ import annotations

import torch

PROGRAM = """
import torch
import torch.nn.functional as F
from torch import nn

class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.block = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 16), nn.GELU(), nn.Dropout(0.1))
        self.head = nn.Linear(16, 32)

    def forward(self, idx, targets):
        logits = self.head(self.block(self.emb(idx)))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

torch.manual_seed(0)
model = TinyGPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model = torch.compile(model, backend="aot_eager")
data = torch.randint(0, 32, (512,))

def get_batch():
    i = torch.randint(0, len(data) - 9, (4,))
    return torch.stack([data[j:j + 8] for j in i]), torch.stack([data[j + 1:j + 9] for j in i])

@torch.no_grad()
def estimate_loss():
    model.eval()
    loss = sum(model(*get_batch())[1].item() for _ in range(2)) / 2
    model.train()
    return loss

for it in range(16):
    if it % 5 == 0:
        print("eval", estimate_loss())
    for micro in range(2):
        logits, loss = model(*get_batch())
        (loss / 2).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
"""


def test_a_compiled_loop_with_its_loss_inside_the_forward_is_quiet_and_recompiles_as_unwatched(run_program):
    from torch._dynamo.utils import guard_failures

    torch._dynamo.reset()
    result = run_program(PROGRAM)
    assert result.report.findings == []  # no recompiling warning, no check failing on fake tensors
    [(code, reasons)] = list(guard_failures.items())
    assert code.co_name == "forward" and code.co_filename.endswith("train.py")  # the model's, not watch's patch
    assert [str(r).split(":")[1].strip() for r in reasons] == ["GLOBAL_STATE changed"]  # no_grad, then training
    torch._dynamo.reset()
