"""missing-zero-grad, graph-retention-leak and eval-without-no-grad on small realistic training scripts."""

import pytest
from conftest import names

from torchdoctor.sdk import Severity

CANONICAL = """
import torch
import torch.nn as nn

def train_one_epoch(model, loader, optimizer, criterion, device):
    model.train()
    running = 0.0
    for step, (images, labels) in enumerate(loader):
        images, labels = images.to(device), labels.to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(model(images), labels)
        loss.backward()
        optimizer.step()
        running += loss.item()
    return running / len(loader)
"""


@pytest.mark.rule("missing-zero-grad")
def test_missing_zero_grad_in_a_loop_inside_a_function(lint, fired):
    code = CANONICAL.replace("        optimizer.zero_grad(set_to_none=True)\n", "")
    [f] = fired(lint(code), "missing-zero-grad")
    assert f.code == "TD301" and f.location.line == 12
    assert "optimizer.zero_grad()" in f.message and "line 11" in f.message


@pytest.mark.rule("missing-zero-grad")
def test_zero_grad_only_before_the_loop_still_fires(lint, fired):
    code = """
    import torch
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    for i, (x, y) in enumerate(loader):
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
    """
    assert len(fired(lint(code), "missing-zero-grad")) == 1


@pytest.mark.rule("missing-zero-grad")
def test_nested_loops_zero_grad_once_per_epoch_fires(lint, fired):
    code = """
    def fit(model, loader, optimizer, criterion, epochs):
        for epoch in range(epochs):
            optimizer.zero_grad()
            for batch in loader:
                loss = criterion(model(batch["x"]), batch["y"])
                loss.backward()
                optimizer.step()
    """
    [f] = fired(lint(code), "missing-zero-grad")
    assert "loop at line 5" in f.message


@pytest.mark.rule("missing-zero-grad")
def test_gan_loop_names_the_optimizer_that_is_never_cleared(lint, fired):
    code = """
    import torch
    opt_d = torch.optim.Adam(netD.parameters(), lr=2e-4)
    opt_g = torch.optim.Adam(netG.parameters(), lr=2e-4)
    for epoch in range(25):
        for real, _ in dataloader:
            opt_d.zero_grad()
            fake = netG(torch.randn(real.size(0), 100, 1, 1))
            loss_d = bce(netD(real), ones) + bce(netD(fake.detach()), zeros)
            loss_d.backward()
            opt_d.step()
            loss_g = bce(netD(fake), ones)
            loss_g.backward()
            opt_g.step()
    """
    [f] = fired(lint(code), "missing-zero-grad")
    assert "opt_g.zero_grad()" in f.message and f.location.line == 14


@pytest.mark.rule("missing-zero-grad")
def test_gan_loop_with_model_zero_grad_is_quiet(lint):
    code = """
    for real in dataloader:
        netD.zero_grad()
        errD = criterion(netD(real), label)
        errD.backward()
        optimizerD.step()
        netG.zero_grad()
        errG = criterion(netD(netG(noise)), label)
        errG.backward()
        optimizerG.step()
    """
    assert lint(code) == []


@pytest.mark.rule("missing-zero-grad")
def test_zero_grad_over_a_list_of_optimizers_is_quiet(lint):
    code = """
    optimizers = [opt_enc, opt_dec]
    for x in loader:
        for opt in optimizers:
            opt.zero_grad()
        loss = decoder(encoder(x)).mean()
        loss.backward()
        opt_enc.step()
        opt_dec.step()
    """
    assert lint(code) == []


@pytest.mark.rule("missing-zero-grad")
def test_gradient_accumulation_with_zero_grad_every_k_steps_is_quiet(lint):
    code = """
    def train(model, loader, optimizer, accum_steps=4):
        optimizer.zero_grad()
        for i, (x, y) in enumerate(loader):
            loss = model(x, labels=y).loss / accum_steps
            loss.backward()
            if (i + 1) % accum_steps == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
    """
    assert lint(code) == []


@pytest.mark.rule("missing-zero-grad")
@pytest.mark.parametrize(
    "clear",
    [
        "for p in model.parameters():\n                p.grad = None",
        "model.zero_grad(set_to_none=True)",
        "reset_grads(model)",
    ],
)
def test_other_ways_to_clear_gradients_are_quiet(lint, clear):
    code = f"""
    def reset_grads(model):
        for p in model.parameters():
            p.grad = None

    def train(model, loader, optimizer):
        for x, y in loader:
            {clear}
            loss = (model(x) - y).pow(2).mean()
            loss.backward()
            optimizer.step()
    """
    assert lint(code) == []


@pytest.mark.rule("missing-zero-grad")
def test_dist_autograd_context_needs_no_zero_grad(lint):
    code = """
    import torch.distributed.autograd as dist_autograd
    from torch.distributed.optim import DistributedOptimizer

    def run_trainer(model, data, opt):
        for epoch in range(10):
            for x, y in data:
                with dist_autograd.context() as context_id:
                    loss = loss_fn(model(x), y)
                    dist_autograd.backward(context_id, [loss])
                    opt.step(context_id)
    """
    assert lint(code) == []


@pytest.mark.rule("missing-zero-grad")
def test_lbfgs_closure_that_clears_is_quiet(lint):
    code = """
    optimizer = torch.optim.LBFGS(model.parameters())
    for x, y in loader:
        def closure():
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            return loss
        optimizer.step(closure)
    """
    assert lint(code) == []


@pytest.mark.rule("missing-zero-grad")
def test_scheduler_step_is_not_an_optimizer_step(lint):
    code = """
    for epoch in range(10):
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            scheduler.step()
    """
    assert lint(code) == []


@pytest.mark.rule("missing-zero-grad")
def test_amp_scaler_step_without_zero_grad_fires(lint, fired):
    code = """
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        with torch.autocast("cuda"):
            loss = criterion(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    """
    assert len(fired(lint(code), "missing-zero-grad")) == 1


LIGHTNING_MANUAL = """
import lightning as L

class GAN(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.epoch_loss = 0.0

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss = self.compute_loss(batch)
        self.manual_backward(loss)
        opt.step()
        return loss
"""


@pytest.mark.rule("missing-zero-grad")
def test_lightning_manual_optimization_without_zero_grad_fires(lint, fired):
    assert len(fired(lint(LIGHTNING_MANUAL), "missing-zero-grad")) == 1
    fixed = LIGHTNING_MANUAL.replace("        opt.step()\n", "        opt.step()\n        opt.zero_grad()\n")
    assert lint(fixed) == []


# graph-retention-leak


@pytest.mark.rule("graph-retention-leak")
def test_total_loss_plus_equals_loss_fires(lint, fired):
    code = CANONICAL.replace("running += loss.item()", "running += loss")
    [f] = fired(lint(code), "graph-retention-leak")
    assert f.code == "TD308" and f.location.line == 14 and f.fix.code == "running += loss.item()"


@pytest.mark.rule("graph-retention-leak")
def test_appending_the_loss_to_a_list_fires(lint, fired):
    code = CANONICAL.replace("running += loss.item()", "history.append(loss)")
    assert len(fired(lint(code), "graph-retention-leak")) == 1


@pytest.mark.rule("graph-retention-leak")
@pytest.mark.parametrize(
    "line",
    [
        "running += loss.item()",
        "running += loss.detach()",
        "running += loss.item() * images.size(0)",
        "running += float(loss)",
        "history.append(loss.item())",
    ],
)
def test_detached_accumulation_is_quiet(lint, line):
    assert lint(CANONICAL.replace("running += loss.item()", line)) == []


@pytest.mark.rule("graph-retention-leak")
@pytest.mark.parametrize("rebind", ["loss = loss.item()", "loss = float(loss)", "loss = loss.detach().cpu()"])
def test_loss_rebound_to_a_number_before_accumulating_is_quiet(lint, rebind):
    code = CANONICAL.replace("running += loss.item()", f"{rebind}\n        running += loss")
    assert rebind in code and lint(code) == []


@pytest.mark.rule("graph-retention-leak")
def test_loss_terms_summed_before_one_backward_are_quiet(lint):
    code = """
    def style_transfer_step(model, optimizer, style_targets, content):
        for step in range(300):
            optimizer.zero_grad()
            features = model(content)
            style_loss = 0
            for f, t in zip(features, style_targets):
                style_loss += mse_loss(gram(f), t)
            total = style_loss + content_weight * mse_loss(features[-1], content)
            total.backward()
            optimizer.step()
    """
    assert lint(code) == []


@pytest.mark.rule("graph-retention-leak")
def test_accumulated_loss_backpropagated_after_the_inner_loop_is_quiet(lint):
    code = """
    for epoch in range(epochs):
        for batch in loader:
            optimizer.zero_grad()
            loss = 0.0
            for t in range(seq_len):
                out, hidden = rnn(batch[t], hidden)
                loss += criterion(out, batch[t + 1])
            loss.backward()
            optimizer.step()
    """
    assert lint(code) == []


@pytest.mark.rule("graph-retention-leak")
def test_accumulator_reset_every_window_is_quiet(lint):
    code = """
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y) / k
        loss.backward()
        window += loss
        if (i + 1) % k == 0:
            optimizer.step()
            optimizer.zero_grad()
            print(window.item())
            window = 0
    """
    assert lint(code) == []


@pytest.mark.rule("graph-retention-leak")
def test_lightning_training_step_accumulating_the_returned_loss_fires(lint, fired):
    code = """
    import lightning as L

    class Classifier(L.LightningModule):
        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self(x), y)
            self.epoch_loss += loss
            return loss
    """
    [f] = fired(lint(code), "graph-retention-leak")
    assert "self.epoch_loss" in f.message


# eval-without-no-grad

EVALUATE = """
import torch

def evaluate(model, loader):
    model.eval()
    correct = 0
    for x, y in loader:
        pred = model(x).argmax(1)
        correct += (pred == y).sum().item()
    return correct / len(loader.dataset)

def main():
    acc = evaluate(model, val_loader)
"""


@pytest.mark.rule("eval-without-no-grad")
def test_validation_function_without_no_grad_fires(lint, fired):
    [f] = fired(lint(EVALUATE), "eval-without-no-grad")
    assert f.code == "TD306" and f.location.line == 8 and "model.eval()" in f.message


@pytest.mark.rule("eval-without-no-grad")
@pytest.mark.parametrize(
    "change",
    [
        ("def evaluate", "@torch.no_grad()\ndef evaluate"),
        ("def evaluate", "@torch.inference_mode()\ndef evaluate"),
        (
            "    acc = evaluate(model, val_loader)",
            "    with torch.no_grad():\n        acc = evaluate(model, val_loader)",
        ),
        ("    for x, y in loader:\n", "    with torch.no_grad():\n     for x, y in loader:\n"),
        ("    model.eval()\n", "    model.eval()\n    model.train()\n"),
    ],
)
def test_evaluation_with_autograd_off_is_quiet(lint, change):
    code = EVALUATE.replace(*change)
    assert change[1] in code
    assert lint(code) == []


@pytest.mark.rule("eval-without-no-grad")
def test_function_used_by_another_linted_file_is_left_to_runtime(lint):
    code = EVALUATE.replace("def main():\n    acc = evaluate(model, val_loader)\n", "")
    assert lint(code) == []  # never called here: the caller may disable grad


@pytest.mark.rule("eval-without-no-grad")
def test_module_level_inference_script_fires(lint, fired):
    code = """
    import torch
    model = torch.load("model.pt", weights_only=False)
    model.eval()
    out = model(torch.randn(1, 3, 224, 224))
    print(out.argmax())
    """
    assert len(fired(lint(code), "eval-without-no-grad")) == 1


@pytest.mark.rule("eval-without-no-grad")
def test_frozen_teacher_in_distillation_is_quiet(lint):
    code = """
    def distill(student, teacher, loader, optimizer):
        teacher.eval()
        for x, y in loader:
            optimizer.zero_grad()
            soft = teacher(x)
            loss = kd_loss(student(x), soft, y)
            loss.backward()
            optimizer.step()
    distill(student, teacher, loader, optimizer)
    """
    assert lint(code) == []


@pytest.mark.rule("eval-without-no-grad")
def test_set_grad_enabled_by_phase_is_quiet(lint):
    code = """
    def run(model, loaders):
        for phase in ["train", "val"]:
            if phase == "train":
                model.train()
            else:
                model.eval()
            for x, y in loaders[phase]:
                with torch.set_grad_enabled(phase == "train"):
                    out = model(x)
    run(model, loaders)
    """
    assert names(lint(code)) == []


@pytest.mark.rule("missing-zero-grad")
def test_loops_inside_try_and_match_blocks_are_seen(lint, fired):
    code = """
    def run(mode, model, loader, optimizer):
        match mode:
            case "train":
                try:
                    for x, y in loader:
                        loss = (model(x) - y).abs().mean()
                        loss.backward()
                        optimizer.step()
                except KeyboardInterrupt:
                    pass
    """
    assert len(fired(lint(code), "missing-zero-grad")) == 1


ONE_STEP = """
import torch

def run_one_batch(model, optimizer, loader, batch):
    for x, y in LOOP:
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
        END
"""


@pytest.mark.rule("missing-zero-grad")
@pytest.mark.parametrize(
    "loop, end, once",
    [
        ("[batch]", "", True),
        ("range(1)", "", True),  # (a `for x, y in range(1)` makes no sense at run time, but says "once" all the same)
        ("loader", "break", True),
        ("loader", "return loss", True),
        ("(batch,)", "", True),
        ("[batch, batch]", "", False),
        ("range(2)", "", False),
        ("loader", "if loss.item() < 0.1:\n            break", False),  # may go round again
        ("loader", "if x is None:\n            continue\n        break", False),  # a `continue` goes round again
        ("loader", "", False),
    ],
)
def test_a_loop_that_runs_once_steps_once(lint, fired, loop, end, once):
    # one step adds nothing to gradients left from before: tests and benchmarks running "one batch"
    found = fired(lint(ONE_STEP.replace("LOOP", loop).replace("END", end)), "missing-zero-grad")
    assert len(found) == (0 if once else 1)


@pytest.mark.rule("missing-zero-grad")
def test_a_one_batch_loop_inside_an_epoch_loop_is_judged_by_the_epoch_loop(lint, fired):
    code = """
    def fit(model, optimizer, batch, epochs):
        for epoch in range(epochs):
            for x, y in [batch]:
                loss = ((model(x) - y) ** 2).mean()
                loss.backward()
                optimizer.step()
    """
    [f] = fired(lint(code), "missing-zero-grad")
    assert "loop at line 3" in f.message
    cleared = code.replace(
        "        for x, y in [batch]:", "        optimizer.zero_grad()\n        for x, y in [batch]:"
    )
    assert fired(lint(cleared), "missing-zero-grad") == []


@pytest.mark.rule("missing-zero-grad")
def test_a_helper_stepping_in_a_one_batch_loop_is_quiet(lint, fired):
    code = """
    def train_step(model, batch, optimizer):
        loss = model(batch).sum()
        loss.backward()
        optimizer.step()

    def smoke_test(model, optimizer, batch, loader):
        for b in [batch]:
            train_step(model, b, optimizer)
        for b in loader:
            train_step(model, b, optimizer)
    """
    [f] = fired(lint(code), "missing-zero-grad")
    assert f.location.line == 11


# opacus' module_modification_test `runOneBatch`: a loader the test built with one batch, cleared after the loop
CLEARED_AFTER = """
import torch

def run_one_batch(model, optimizer, loader, criterion):
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    optimizer.zero_grad()
"""


@pytest.mark.rule("missing-zero-grad")
def test_a_clear_right_after_the_loop_makes_the_finding_information(lint, fired):
    [f] = fired(lint(CLEARED_AFTER), "missing-zero-grad")
    assert (
        f.severity == Severity.INFO and "`optimizer.zero_grad()` (line 9) clears them only after the loop" in f.message
    )
    for other in (
        CLEARED_AFTER.replace("    optimizer.zero_grad()", "    if verbose:\n        optimizer.zero_grad()"),
        CLEARED_AFTER.replace("    optimizer.zero_grad()", "    other_optimizer.zero_grad()"),
        CLEARED_AFTER.replace("    optimizer.zero_grad()", "    print('done')"),
    ):
        [f] = fired(lint(other), "missing-zero-grad")
        assert f.severity == Severity.ERROR and "after the loop" not in f.message


@pytest.mark.rule("missing-zero-grad")
def test_a_one_step_helper_called_in_a_loop_fires_at_the_caller(lint, fired):
    # the helper's loop steps once per call (it returns): the steps repeat in the caller's loop, never cleared
    code = """
    def train_step(model, optimizer, loader):
        for x, y in loader:
            loss = model(x).sum()
            loss.backward()
            optimizer.step()
            return loss

    def fit(model, optimizer, loader, steps):
        for i in range(steps):
            train_step(model, optimizer, loader)
    """
    [f] = fired(lint(code), "missing-zero-grad")
    assert f.location.line == 11 and "loop at line 10" in f.message
    cleared = code.replace("            train_step(", "            optimizer.zero_grad()\n            train_step(")
    assert fired(lint(cleared), "missing-zero-grad") == []
