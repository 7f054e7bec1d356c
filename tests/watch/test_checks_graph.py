"""graph-retention-leak: graphs kept across steps are found with a per-step figure; steady loops are quiet."""

from __future__ import annotations

import torch
from conftest import batches, mlp, names, session, train_step
from torch import nn

STEPS = 30  # past the check's 16-step span


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
    assert "after step 15, 15 graphs built in 15 earlier steps (the oldest in step 0) are still alive" in f.message
    assert "graph nodes" in f.message and f.location.step == 15 and f.fix.code == "kept.append(loss.detach())"


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
    assert "KiB of activations never back-propagated are saved with them" in f.message


def test_cuda_allocator_figure_is_added_when_cuda_is_in_use(monkeypatch):
    kept: list[torch.Tensor] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 4096 * len(kept))  # 4 KiB per kept loss
    s = _run(kept.append)
    message = s.findings[0].message
    assert "CUDA allocated memory grows by 4 KiB per step (from 0 bytes at step 0 to 60 KiB at step 15)" in message


def _epochs(keep_per_epoch, epochs: int = 3, steps: int = 16):
    """Short epochs whose running total is reset every epoch (the leak of the notes, in a 48-step loop)."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = batches(1)[0]
    with session(model, opt) as s:
        for _ in range(epochs):
            total = keep_per_epoch()
            for _ in range(steps):
                loss = train_step(model, opt, x, y)
                total = total + loss if isinstance(total, torch.Tensor) else total + loss.item()
    return s


def test_a_running_total_reset_every_short_epoch_is_a_leak():
    s = _epochs(lambda: torch.zeros(()))
    [f] = s.findings
    assert f.name == "graph-retention-leak" and f.location.step == 15


def test_the_same_loop_with_item_is_quiet():
    assert _epochs(lambda: 0.0).findings == []


def test_a_short_run_that_keeps_every_graph_is_reported_at_exit():
    kept: list[torch.Tensor] = []
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with session(model, opt) as s:
        for x, y in batches(6):
            kept.append(train_step(model, opt, x, y))
    [f] = s.findings
    assert "when the session ended, 5 graphs built in 5 earlier steps (the oldest in step 0)" in f.message


def test_reinforce_episodes_of_growing_length_freed_at_each_step_are_quiet():
    """pytorch/examples reinforcement_learning/reinforce.py: log-probs kept for one episode, freed after step()."""
    policy = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2), nn.Softmax(dim=-1))
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    with session(policy, opt, every=1) as s:
        for episode in range(24):
            saved_log_probs, rewards = [], []
            for _ in range(3 + episode):  # episodes grow as the policy improves
                m = torch.distributions.Categorical(policy(torch.randn(1, 4)))
                action = m.sample()
                saved_log_probs.append(m.log_prob(action))
                rewards.append(1.0)
            returns = torch.tensor(rewards).cumsum(0).flip(0)
            returns = (returns - returns.mean()) / (returns.std() + 1e-6)
            opt.zero_grad()
            torch.cat([-lp * r for lp, r in zip(saved_log_probs, returns)]).sum().backward()
            opt.step()
            del saved_log_probs[:], rewards[:]
    assert s.findings == []


def test_checks_watching_one_forward_share_one_sentinel_on_its_graph():
    from torchdoctor.watch.graphs import GraphTracker

    tracker = GraphTracker()
    w = torch.ones(3, requires_grad=True)
    out = (w * 2).sum()
    seen: list[str] = []
    assert tracker.track(out, on_backward=lambda: seen.append("a"), on_free=lambda reached: seen.append(f"a{reached}"))
    assert tracker.track(out, on_backward=lambda: seen.append("b"))
    assert tracker.sentinels == 1
    out.backward()
    assert seen == ["a", "b"]
    again = (w * 3).sum()
    assert tracker.track(again) and tracker.sentinels == 2  # another graph, its own sentinel
    del out
    assert seen == ["a", "b", "aTrue"] and tracker.sentinels == 1
    assert not tracker.track(torch.ones(2))  # no graph
