"""Issue 27: real tiny loops off the beaten path — eval loaders mid-epoch, torch.func ensembles, a NaN that
stops the run before any step, manual updates, submodules called directly, an optimizer watch never saw."""

from __future__ import annotations

import contextlib
import copy
import io
import warnings

import torch
from conftest import batches, mlp, names, problems, session, train_step
from torch import nn


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
    assert "eval-without-no-grad" not in names(s)  # vmap with autograd on, but a backward reaches the ensemble
    assert problems(s) == []


def _evaluate_an_ensemble(no_grad: bool, through_watched_model: bool):
    """The torch.func ensembling tutorial's evaluation: stacked members under vmap, predictions only."""
    from torch.func import functional_call, stack_module_state, vmap

    members = [mlp() for _ in range(3)]
    params, buffers = stack_module_state(members)
    base = members[0] if through_watched_model else copy.deepcopy(members[0]).to("meta")

    def fmodel(p, b, x):
        return functional_call(base, (p, b), (x,))

    opt = torch.optim.SGD(members[0].parameters(), lr=0.1)
    with session(members[0], opt, every=1) as s:
        for x, y in batches(3):
            train_step(members[0], opt, x, y)  # something else trains meanwhile
            with torch.no_grad() if no_grad else contextlib.nullcontext():
                predictions = vmap(fmodel, in_dims=(0, 0, None))(params, buffers, x)
            predictions.argmax(-1)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.save(params, io.BytesIO())  # watch's gradient hook on the user's tensors: not saved, no warning
    return s


_VMAP_LINE = _evaluate_an_ensemble.__code__.co_firstlineno + 16


def test_an_ensemble_evaluated_inside_vmap_with_autograd_on_is_found():
    for through_watched_model in (False, True):  # a meta copy (not watched), and a watched model
        s = _evaluate_an_ensemble(no_grad=False, through_watched_model=through_watched_model)
        found = [f for f in s.findings if f.name == "eval-without-no-grad"]
        assert len(found) == 1 and "inside `torch.func.vmap`" in found[0].message, s.findings
        assert "4 parameter tensor(s)" in found[0].message  # 2 Linear layers, stacked
        assert found[0].fix.code.startswith("with torch.no_grad():")
        assert (found[0].location.file, found[0].location.line) == (__file__, _VMAP_LINE)  # the vmap call
        assert problems(s) == ["eval-without-no-grad"]


def test_an_ensemble_evaluated_inside_vmap_under_no_grad_is_quiet():
    for through_watched_model in (False, True):
        assert problems(_evaluate_an_ensemble(no_grad=True, through_watched_model=through_watched_model)) == []


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


def _hf_style(per_step_schedule: bool, epochs: int):
    """An HF `no_trainer`-style script: a per-step schedule over the whole run, an eval loader every 15 steps."""
    from torch.utils.data import DataLoader, TensorDataset

    train = DataLoader(TensorDataset(torch.randn(240, 8), torch.randint(0, 3, (240,))), batch_size=8)  # 30 batches
    evaluation = DataLoader(TensorDataset(torch.randn(32, 8), torch.randint(0, 3, (32,))), batch_size=8)
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    total = epochs * len(train)
    scheduler = (
        torch.optim.lr_scheduler.LambdaLR(opt, lambda i: max(0.0, 1 - i / total))
        if per_step_schedule
        else torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)
    )  # a per-epoch schedule
    with session(model, opt) as s:
        step = 0
        for _ in range(epochs):
            for x, y in train:
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                scheduler.step()  # the line the finding names
                step += 1
                if step % 15 == 0:
                    model.eval()
                    with torch.no_grad():
                        for ex, ey in evaluation:
                            nn.functional.cross_entropy(model(ex), ey)
                    model.train()
    return s


def test_an_eval_loader_mid_epoch_never_ends_the_first_epoch():
    assert problems(_hf_style(per_step_schedule=True, epochs=1)) == []  # the eval loader's second pass: LR 0


def test_a_per_epoch_schedule_stepped_per_batch_is_still_found_at_the_scheduler_step_line():
    [f] = [f for f in _hf_style(per_step_schedule=False, epochs=2).findings if f.name == "scheduler-stepped-per-batch"]
    assert "stepped 30 times during the first epoch (30 optimizer steps)" in f.message
    assert f.location.file == __file__
    import linecache

    assert linecache.getline(__file__, f.location.line).strip() == "scheduler.step()  # the line the finding names"


def _nan_batch_run(stop: str):
    """A NaN batch at step 2; the loop stops before any optimizer step sees it: the loss raises, the script
    exits on a non-finite `loss.item()` (MAE's and DETR's engines), or it breaks out of the loop."""
    import math
    import sys

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(x, (y % 2).float()) for x, y in batches(4)]
    data[2][0][0, 0] = float("nan")
    s = session(model, opt)
    try:
        with s:
            for x, y in data:
                opt.zero_grad()
                out = torch.sigmoid(model(x)).squeeze(1)
                if stop == "raise":
                    loss = nn.functional.binary_cross_entropy(out, y)  # RuntimeError on NaN input
                else:
                    loss = nn.functional.mse_loss(out, y)
                    if not math.isfinite(loss.item()):
                        if stop == "exit":
                            sys.exit(1)
                        break
                loss.backward()
                opt.step()
    except (RuntimeError, SystemExit):
        pass
    return s


def test_a_nan_that_stops_the_run_before_any_step_is_found():
    for stop, what in (("exit", "SystemExit"), ("break", "the loop ended")):
        s = _nan_batch_run(stop)
        [f] = [f for f in s.findings if f.name == "nonfinite-values"]
        assert what in f.message and "the batch already holds NaN (`x`" in f.message, (stop, f.message)
        assert f.location.file == __file__ and f.location.step == 2
    # a loss that raises on the NaN is a crash, explained once by its crash pitfall (one cause, one finding)
    raised = _nan_batch_run("raise")
    [f] = [f for f in raised.findings if f.name in ("nonfinite-values", "nan-in-loss-input")]
    assert f.name == "nan-in-loss-input" and f.location.step == 2, f.message
    assert "`loss`" in _nan_batch_run("exit").findings[0].message


def test_an_unrelated_error_or_masked_attention_scores_are_not_nonfinite():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batches(1)[0]
    try:
        with session(model, opt) as s:
            scores = model(x).masked_fill(torch.ones(16, 3).tril().bool(), float("-inf"))  # -inf on purpose
            loss = nn.functional.cross_entropy(model(x), y)
            raise KeyError("a bug of its own")
    except KeyError:
        pass
    assert problems(s) == [] and scores.isinf().any() and loss.isfinite()


def _manual_sgd(clear: str, steps: int = 4, accumulate: int = 1):
    """An optimizer-free loop (Karpathy's micrograd style): `p.data.add_(-lr * p.grad)`."""
    model = mlp()
    with session(model) as s:
        for i, (x, y) in enumerate(batches(steps * accumulate)):
            nn.functional.cross_entropy(model(x), y).backward()
            if (i + 1) % accumulate:
                continue
            for p in model.parameters():
                p.data.add_(-0.1 * p.grad)
                if clear == "none":
                    p.grad = None
                elif clear == "zero":
                    p.grad.zero_()
            if clear == "model":
                model.zero_grad()
    return s


def test_a_manual_sgd_loop_that_never_clears_gradients_is_missing_zero_grad():
    [f] = [f for f in _manual_sgd("never").findings if f.name == "missing-zero-grad"]
    assert "without an optimizer that watch() saw" in f.message and f.location.param == "2.bias"


def test_manual_updates_that_clear_or_accumulate_are_quiet():
    for clear in ("none", "zero", "model"):
        assert problems(_manual_sgd(clear)) == [], clear
    assert problems(_manual_sgd("model", accumulate=3)) == []


class TwoEncoders(nn.Module):
    """MoCo-shaped: a query encoder trained through forward(), and a monitor that calls it directly."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder_q = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.1))
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder_q(x))


def _monitored(eval_mode: bool):
    model = TwoEncoders()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with session(model, opt) as s:
        for x, y in batches(4):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        if eval_mode:
            model.eval()
        with torch.no_grad():  # a kNN monitor on the features
            for x, _ in batches(3):
                model.encoder_q(x)
        model.train()
    return s


def test_a_submodule_called_directly_gives_forward_events():
    [f] = [f for f in _monitored(eval_mode=False).findings if f.name == "train-mode-in-eval"]
    assert "TwoEncoders ran 2 forwards under torch.no_grad()" in f.message
    assert problems(_monitored(eval_mode=True)) == []


def _trainer_that_builds_its_own_optimizer(model: nn.Module, steps: int = 3) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # built where watch() never saw it
    for x, y in batches(steps):
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()  # and never cleared: a real bug the optimizer checks would see


def _not_run(s) -> dict[str, str]:
    return {name: group["why"] for group in s.facts.get("not_run", []) for name in group["checks"]}


def test_a_session_whose_optimizer_checks_saw_nothing_says_so_and_why():
    model = mlp()
    with session(model) as s:
        _trainer_that_builds_its_own_optimizer(model)
    unseen = _not_run(s)
    if not s.facts["optimizers"]:  # the optimizer stayed out of the session's sight
        assert unseen["stale-optimizer-params"] == "no optimizer was given to watch() or seen in the session"
        assert {"nonfinite-values", "param-not-in-optimizer", "unused-parameters"} <= set(unseen)
    else:  # a session that adopts optimizers built after it started ran them
        assert not {"stale-optimizer-params", "nonfinite-values"} & set(unseen)
    assert "train-mode-in-eval" not in unseen  # the forwards were seen


def test_the_report_lists_checks_that_could_not_run_instead_of_no_problems_found(capsys):
    from torch.func import functional_call, vmap

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    params = dict(model.named_parameters())
    with session(model, opt, report=True) as s:  # forwards only under vmap, and no step
        vmap(lambda x: functional_call(model, params, (x,)))(torch.randn(4, 2, 8))
    unseen = _not_run(s)
    assert "inside torch.func transforms" in unseen["train-mode-in-eval"]
    assert unseen["missing-zero-grad"] == "no optimizer step ran in the session"
    printed = capsys.readouterr().err
    assert "No problems found." not in printed and "could not run" in printed
    assert "not run" in printed and "train-mode-in-eval" in printed


def test_a_plain_correct_loop_has_every_check_run():
    from torch.utils.data import DataLoader, TensorDataset

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(32, 8), torch.randint(0, 3, (32,))), batch_size=8)
    with session(model, opt) as s:
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    assert s.findings == [] and "not_run" not in s.facts


def test_a_graph_leak_is_located_at_the_line_that_keeps_the_loss():
    import linecache

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = batches(1)[0]
    history = []
    with session(model, opt) as s:
        for _ in range(20):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            history.append(loss)  # the leak
    [f] = s.findings
    assert "`history` (a list of " in f.message and f.location.file == __file__
    assert linecache.getline(__file__, f.location.line).strip() == "history.append(loss)  # the leak"
    assert f.fix.code == "history.append(loss.detach())"


def test_a_running_total_kept_on_self_is_named():
    class Loop:
        def __init__(self) -> None:
            self.model = mlp()
            self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
            self.running = torch.zeros(())

        def fit(self) -> None:
            for x, y in batches(20):
                self.opt.zero_grad()
                loss = nn.functional.cross_entropy(self.model(x), y)
                loss.backward()
                self.opt.step()
                self.running = self.running + loss

    loop = Loop()
    with session(loop.model, loop.opt) as s:
        loop.fit()
    [f] = s.findings
    assert "`self.running` (a running total" in f.message and f.location.line is not None
    assert f.fix.code == "self.running = self.running + loss.item()"


def test_validation_before_the_first_step_that_never_restores_train_mode():
    """nanoGPT's loop evaluates at iteration 0; without model.train() after it, every step trains in eval()."""

    def run(restore: bool):
        model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.1), nn.ReLU(), nn.Linear(16, 3))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with session(model, opt) as s:
            for i, (x, y) in enumerate(batches(4)):
                if i == 0:
                    model.eval()
                    with torch.no_grad():
                        model(x)
                    if restore:
                        model.train()
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
        return s

    [f] = [f for f in run(restore=False).findings if f.name == "train-mode-not-restored"]
    assert "was validated in eval() mode since" in f.message and f.location.step == 0
    assert problems(run(restore=True)) == []


def test_a_loop_without_a_dataloader_is_still_a_clean_bill_of_health(capsys):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with session(model, opt, report=True) as s:  # nanoGPT-style: batches sliced from tensors, no DataLoader
        for x, y in batches(3):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    [group] = s.facts["not_run"]
    assert group["applies"] is False and "sampler-epoch-not-set" in group["checks"]
    assert "✓ No problems found." in capsys.readouterr().err
