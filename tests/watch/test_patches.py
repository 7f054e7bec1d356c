"""The per-object method patches: paused between observed steps and resumed without a new wrapper, and never
over someone else's replacement."""

from __future__ import annotations

import types

import torch
from conftest import batches, session
from torch import nn

from torchdoctor.watch.patches import MethodPatch


def _owner() -> types.SimpleNamespace:
    return types.SimpleNamespace(loss=lambda x: x + 1)


def test_a_paused_patch_comes_back_with_its_wrapper_and_its_listeners():
    owner, heard = _owner(), []
    original = owner.loss
    patch = MethodPatch(owner, "loss", before=lambda obj, args, kwargs: heard.append(args))
    wrapper = owner.loss
    assert owner.loss(1) == 2 and heard == [(1,)]
    patch.pause()
    assert owner.loss is original and owner.loss(2) == 3 and heard == [(1,)]
    patch.resume()
    assert owner.loss is wrapper and owner.loss(3) == 4 and heard == [(1,), (3,)]
    patch.remove()
    assert owner.loss is original


def test_a_patch_resumed_over_someone_elses_replacement_wraps_theirs():
    owner, heard = _owner(), []
    patch = MethodPatch(owner, "loss", after=lambda obj, args, kwargs: heard.append(args))
    patch.pause()
    owner.loss = lambda x: x * 10  # another library patched it meanwhile
    theirs = owner.loss
    patch.resume()
    assert owner.loss is not theirs and owner.loss(2) == 20 and heard == [(2,)]
    patch.remove()
    assert owner.loss is theirs


def test_two_sessions_share_one_wrapper_through_pauses():
    owner, first, second = _owner(), [], []
    a = MethodPatch(owner, "loss", before=lambda obj, args, kwargs: first.append(args))
    b = MethodPatch(owner, "loss", before=lambda obj, args, kwargs: second.append(args))
    a.pause()
    owner.loss(1)
    a.resume()
    b.pause()
    owner.loss(2)
    assert first == [(2,)] and second == [(1,)]
    a.remove()
    b.remove()
    assert not hasattr(owner.loss, "__wrapped__")


def test_the_loss_taps_are_off_between_observed_steps_and_on_at_them():
    """`torch.nn.functional.cross_entropy` is patched only at the steps the session observes (every 100th from
    step 1000), and is torch's own again once the session ends."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    (x, y), original = batches(1)[0], nn.functional.cross_entropy
    patched_at: list[int] = []
    with session(model, opt):
        for step in range(1150):
            if nn.functional.cross_entropy is not original:
                patched_at.append(step)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    assert nn.functional.cross_entropy is original
    assert patched_at[:33] == [*range(32), 40] and patched_at[-2:] == [1000, 1100]
    assert 1050 not in patched_at and 999 not in patched_at
