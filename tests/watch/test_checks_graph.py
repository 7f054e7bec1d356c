"""graph-retention-leak: graphs kept across steps are found with a per-step figure; steady loops are quiet."""
from __future__ import annotations

import torch
from torch import nn

from conftest import batches, mlp, names, session, train_step

STEPS = 60  # more than the check's 50-step window


def _run(keep) -> object:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = batches(1)[0]
    with session(model, opt) as s:
        for _ in range(STEPS):
            keep(train_step(model, opt, x, y))
    return s


def test_losses_appended_to_a_list_leak_one_graph_per_step():
    kept: list[torch.Tensor] = []
    s = _run(kept.append)
    [f] = s.findings
    assert (f.name, f.code, str(f.severity)) == ("graph-retention-leak", "TD308", "error")
    assert "1.0 more per step" in f.message and "graph nodes" in f.message
    assert f.location.step == 50 and ".item()" in f.fix.code


def test_running_total_of_loss_tensors_leaks():
    total = [torch.zeros(())]
    s = _run(lambda loss: total.__setitem__(0, total[0] + loss))
    assert names(s) == ["graph-retention-leak"]


def test_loss_item_is_steady():
    total = [0.0]
    s = _run(lambda loss: total.__setitem__(0, total[0] + loss.item()))
    assert s.findings == []


def test_saved_activations_kept_alive_are_reported_in_bytes():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = batches(1)[0]
    kept = []
    with session(model, opt, checks=["graph-retention-leak"]) as s:
        for _ in range(STEPS):
            opt.zero_grad()
            out = model(x)
            kept.append(model(x).sum())  # a second forward whose activations are never freed
            nn.functional.cross_entropy(out, y).backward()
            opt.step()
    [f] = s.findings
    assert "saved activations grow by" in f.message and "KiB per step" in f.message


def test_cuda_allocator_figure_is_added_when_cuda_is_in_use(monkeypatch):
    kept: list[torch.Tensor] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 4096 * len(kept))  # 4 KiB per kept loss
    s = _run(kept.append)
    assert "CUDA allocated memory grows by 4 KiB per step" in s.findings[0].message
