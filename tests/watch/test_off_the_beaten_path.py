"""Issue 27: real tiny loops off the beaten path — eval loaders mid-epoch, torch.func ensembles, a NaN that
stops the run before any step, manual updates, submodules called directly, an optimizer watch never saw."""
from __future__ import annotations

import copy

import torch
from torch import nn

from conftest import batches, mlp, names, problems, session


def test_a_vmap_ensemble_trained_through_stack_module_state_is_not_stale():
    """The torch.func ensembling tutorial: the optimizer holds stacked copies, the model is called functionally."""
    from torch.func import functional_call, stack_module_state, vmap

    members = [mlp() for _ in range(3)]
    params, buffers = stack_module_state(members)
    base = copy.deepcopy(members[0]).to("meta")
    opt = torch.optim.SGD(params.values(), lr=0.1)

    def one(p, b, x):
        return functional_call(base, (p, b), (x,))

    with session(members[0], opt, every=1) as s:
        for x, y in batches(3):
            opt.zero_grad()
            out = vmap(one, in_dims=(0, 0, None))(params, buffers, x)  # (members, batch, classes)
            nn.functional.cross_entropy(out.flatten(0, 1), y.repeat(3)).backward()
            opt.step()
    assert "stale-optimizer-params" not in names(s)
    assert problems(s) == []


def test_functional_call_with_a_copy_of_the_parameters_is_not_stale_but_a_replaced_layer_is():
    from torch.func import functional_call

    model = mlp()
    fast = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}  # MAML-style weights
    opt = torch.optim.SGD(fast.values(), lr=0.1)
    with session(model, opt, every=1) as s:
        for x, y in batches(3):
            opt.zero_grad()
            nn.functional.cross_entropy(functional_call(model, fast, (x,)), y).backward()
            opt.step()
    assert "stale-optimizer-params" not in names(s)

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model[2] = nn.Linear(16, 3)  # the real bug next to it: replaced after the optimizer was built
    with session(model, opt, every=1) as s:
        for x, y in batches(3):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    assert "stale-optimizer-params" in names(s)
