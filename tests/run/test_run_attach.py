"""`run_script`: a program runs as under `python`, and the doctor follows its optimizers and models unedited."""

from __future__ import annotations

import builtins
import json
import linecache
import sys
import warnings

from run_programs import GOOD_STEP, LOOP, problems

from torchdoctor.run.doctor import run_script
from torchdoctor.run.script import Target


def test_the_program_sees_what_python_gives_it(run_program, tmp_path):
    out = tmp_path / "seen.json"
    result = run_program(
        f"""
        import json, sys
        json.dump({{"argv": sys.argv, "path0": sys.path[0], "name": __name__, "file": __file__,
                   "main": sys.modules["__main__"].__file__}}, open({str(out)!r}, "w"))
    """,
        "--lr",
        "0.1",
    )
    seen = json.loads(out.read_text())
    script = str(tmp_path / "train.py")
    assert seen == {
        "argv": [script, "--lr", "0.1"],
        "path0": str(tmp_path),
        "name": "__main__",
        "file": script,
        "main": script,
    }
    assert result.outcome.status == 0 and result.exit_status == 0


def test_the_program_imports_from_pythonpath_and_runs_its_sitecustomize(run_program, tmp_path, monkeypatch):
    """The command line takes PYTHONPATH's folders off its own search path (`torchdoctor.isolation`), and a
    `sitecustomize.py` there makes it re-execute without them: the program gets both back, as under python."""
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "helper_of_the_project.py").write_text("VALUE = 7\n")
    (shims / "sitecustomize.py").write_text("import builtins\nbuiltins.CUSTOMIZED = True\n")
    monkeypatch.setenv("PYTHONPATH", str(shims))
    monkeypatch.delitem(sys.modules, "sitecustomize", raising=False)
    monkeypatch.setattr(builtins, "CUSTOMIZED", False, raising=False)
    out = tmp_path / "seen.json"
    result = run_program(
        f"""
        import json, sys
        import helper_of_the_project
        json.dump({{"value": helper_of_the_project.VALUE, "path1": sys.path[1], "custom": CUSTOMIZED}},
                  open({str(out)!r}, "w"))
    """
    )
    assert result.outcome.status == 0
    assert json.loads(out.read_text()) == {"value": 7, "path1": str(shims), "custom": True}


def test_exit_statuses_are_pythons(run_program):
    assert run_program("import sys; sys.exit(3)").exit_status == 3
    assert run_program("import sys; sys.exit(None)").exit_status == 0
    said = run_program("import sys; sys.exit('bad config')")
    assert (said.exit_status, said.outcome.exit_message, said.outcome.exception) == (1, "bad config", None)
    crashed = run_program("raise ValueError('boom')")
    assert crashed.exit_status == 1 and isinstance(crashed.outcome.exception, ValueError)
    assert crashed.report.facts["program"]["exception"] == "ValueError: boom"
    interrupted = run_program("raise KeyboardInterrupt")
    assert interrupted.exit_status == 130 and isinstance(interrupted.outcome.exception, KeyboardInterrupt)


def test_a_module_runs_as_python_dash_m(tmp_path, monkeypatch):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text(
        "import sys\nassert __name__ == '__main__'\nsys.exit(len(sys.argv) * 10 + sys.argv[0].endswith('train.py'))\n"
    )
    monkeypatch.chdir(tmp_path)
    result = run_script(Target(module="pkg.train", args=["a", "b"]), on_finding=lambda f: None)
    assert result.exit_status == 31
    assert result.report.facts["program"]["target"] == "-m pkg.train"


def test_a_correct_loop_is_quiet_and_its_model_is_found(run_program):
    result = run_program(LOOP.format(step=GOOD_STEP))
    assert problems(result) == [] and result.exit_status == 0
    facts = result.report.facts
    assert [m["label"] for m in facts["models"]] == ["Sequential"]
    assert facts["optimizers"] == [{"label": "SGD", "steps": 6}] and facts["adopted_optimizers"] == ["SGD"]
    assert result.report.scope == "run"


def test_the_step_clock_times_the_steps_of_the_optimizer_adopted_as_it_steps(run_program):
    """The session starts before the script builds its optimizer: the clock takes the first one that steps, so
    the report has a step-time breakdown and the performance checks their verdicts."""
    result = run_program(LOOP.replace("range(6)", "range(40)").format(step=GOOD_STEP))
    breakdown = result.report.facts["step_time"]
    assert breakdown["steps"] == 26 and breakdown["timed_every"] == 10  # 1-31 but the multiples of 5, then 33
    assert sum(phase["share"] for phase in breakdown["phases"].values()) > 0.99


def test_checks_that_listen_to_library_calls_work_on_optimizers_adopted_later(run_program):
    """GradScaler.step, the clip functions and LRScheduler.step are listened to from the start, though `run`
    adopts the optimizer only as it steps: a clip of scaled gradients and a per-epoch schedule stepped per batch
    are found (both checks stayed off under `run` when they waited for an optimizer given at start)."""
    result = run_program(
        """
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.1)
        scaler = torch.amp.GradScaler("cpu")
        loader = DataLoader(TensorDataset(torch.randn(96, 4), torch.randn(96, 1)), batch_size=8)
        for epoch in range(3):
            for x, y in loader:
                opt.zero_grad()
                scaler.scale(nn.functional.mse_loss(model(x), y)).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # before scaler.unscale_(opt)
                scaler.step(opt)
                scaler.update()
                scheduler.step()  # StepLR counts epochs
        """,
        select=["clip-before-unscale", "scheduler-stepped-per-batch"],
    )
    assert problems(result) == ["clip-before-unscale", "scheduler-stepped-per-batch"]


def test_a_planted_missing_zero_grad_is_caught_at_the_step_watch_catches_it(run_program):
    step = GOOD_STEP.replace("    optimizer.zero_grad()\n", "")
    result = run_program(LOOP.format(step=step))
    (finding,) = [f for f in result.report.findings if f.name == "missing-zero-grad"]
    assert finding.location.step == 1  # watch(model, optimizer) reports it at step 1 too
    assert result.exit_status == 1  # the program succeeded; an error finding under fail-on=error
    assert run_program(LOOP.format(step=step), fail_on="never").exit_status == 0
    assert run_program(LOOP.format(step=step) + "raise SystemExit(7)\n").exit_status == 7  # the program's own wins
    assert problems(run_program(LOOP.format(step=step), ignore=["missing-zero-grad"])) == []


def test_a_warning_from_a_script_run_by_path_points_at_its_line_and_breaks_nothing(run_program, monkeypatch):
    """runpy.run_path gives `__main__` neither `__loader__` nor `__spec__`; Python 3.12's warn_explicit raises
    ValueError for such module_globals (emulated here, so the test fails on any Python)."""
    real = warnings.warn_explicit

    def strict(*args, module_globals=None, **kwargs):
        spec = (module_globals or {}).get("__spec__")
        if module_globals is not None and module_globals.get("__loader__") is None and spec is None:
            raise ValueError("Module globals is missing a __spec__.loader")
        return real(*args, module_globals=module_globals, **kwargs)

    monkeypatch.setattr(warnings, "warn_explicit", strict)
    step = GOOD_STEP.replace("    optimizer.zero_grad()\n", "")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_program(LOOP.format(step=step), on_finding="warn")
    assert result.exit_status == 1 and result.report.findings[0].name == "missing-zero-grad"
    [warning] = [w for w in caught if "missing-zero-grad" in str(w.message)]
    assert warning.filename.endswith("train.py") and "optimizer.step()" in linecache.getline(
        warning.filename, warning.lineno
    )


def test_two_models_and_two_optimizers_are_followed(run_program):
    result = run_program("""
        import torch
        from torch import nn
        G = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 6))
        D = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
        opt_g = torch.optim.Adam(G.parameters(), lr=1e-3)
        opt_d = torch.optim.Adam(D.parameters(), lr=1e-3)
        bce = nn.BCEWithLogitsLoss()
        for _ in range(4):
            real, z = torch.randn(8, 6), torch.randn(8, 4)
            opt_d.zero_grad()
            fake = G(z)
            d_loss = bce(D(real), torch.ones(8, 1)) + bce(D(fake.detach()), torch.zeros(8, 1))
            d_loss.backward()
            opt_d.step()
            opt_g.zero_grad()
            g_loss = bce(D(fake), torch.ones(8, 1))
            g_loss.backward()
            opt_g.step()
    """)
    facts = result.report.facts
    assert problems(result) == []
    assert sorted(m["label"] for m in facts["models"]) == ["Sequential", "Sequential#2"]
    assert sorted((o["label"], o["steps"]) for o in facts["optimizers"]) == [("Adam", 4), ("Adam#2", 4)]


def test_a_new_optimizer_for_a_second_stage_is_followed_and_the_first_let_go(run_program):
    result = run_program("""
        import gc, weakref
        import torch
        from torch import nn
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        def stage(optimizer, zero):
            for _ in range(3):
                if zero:
                    optimizer.zero_grad()
                nn.functional.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 3, (4,))).backward()
                optimizer.step()
        first = torch.optim.Adam(model.parameters(), lr=1e-3)
        stage(first, zero=True)
        gone = weakref.ref(first)
        del first
        for p in model[0].parameters():
            p.requires_grad_(False)
        stage(torch.optim.SGD(model[2].parameters(), lr=0.1), zero=False)  # stage 2 forgets zero_grad
        gc.collect()
        assert gone() is None, "the session kept the first stage's optimizer alive"
    """)
    assert result.exit_status == 1 and result.outcome.status == 0  # the assert in the program held
    facts = result.report.facts
    assert facts["retired_optimizers"] == [{"label": "Adam", "steps": 3}]
    assert facts["optimizers"] == [{"label": "SGD", "steps": 3}]
    assert problems(result) == ["missing-zero-grad"]


def test_an_optimizer_over_parameters_of_no_called_module_is_still_watched(run_program):
    result = run_program("""
        import torch
        w = torch.zeros(3, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            ((w - 1) ** 2).sum().backward()
            opt.step()
    """)
    assert result.report.facts["optimizers"] == [{"label": "SGD", "steps": 3}]
    assert result.report.facts["models"] == [] and problems(result) == []


def test_a_model_called_only_after_the_first_step_is_found_later(run_program):
    # the first step's loss uses the parameters directly; the model is called from the second step on
    result = run_program("""
        import torch
        from torch import nn
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        opt.zero_grad(); model.weight.sum().backward(); opt.step()
        for _ in range(3):
            opt.zero_grad(); model(torch.randn(2, 4)).sum().backward(); opt.step()
    """)
    assert [m["label"] for m in result.report.facts["models"]] == ["Linear"]


def test_parts_called_one_by_one_are_watched_as_the_model_that_holds_them(run_program):
    # Lightning's shape: training_step calls self.encoder and self.head, never the module itself
    result = run_program("""
        import torch
        from torch import nn
        class Task(nn.Module):
            def __init__(self):
                super().__init__()
                self.encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
                self.head = nn.Linear(16, 3)
            def training_step(self, x, y):
                return nn.functional.cross_entropy(self.head(self.encoder(x)), y)
        task = Task()
        opt = torch.optim.Adam(task.parameters(), lr=1e-3)
        for _ in range(3):
            opt.zero_grad()
            task.training_step(torch.randn(4, 8), torch.randint(0, 3, (4,))).backward()
            opt.step()
    """)
    assert [m["label"] for m in result.report.facts["models"]] == ["Task"] and problems(result) == []


def test_a_crash_is_explained_first_and_the_exit_status_is_the_programs(run_program):
    step = GOOD_STEP.replace("    optimizer.zero_grad()\n", "")  # TD301, an error sorted before TD330
    result = run_program(
        LOOP.format(step=step)
        + """
pred = nn.Linear(8, 1)(torch.randn(2**21, 8))
((pred - torch.randn(2**21)) ** 2).mean()  # (N, 1) - (N,): terabytes
"""
    )
    findings = result.report.sorted_findings()
    assert [f.name for f in findings] == ["out-of-memory", "missing-zero-grad"]
    assert result.report.facts["crash_explained_by"] == ["out-of-memory"]
    assert result.exit_status == 1 and "can't allocate memory" in str(result.outcome.exception)
    assert result.report.to_dict()["findings"][0]["name"] == "out-of-memory"


def test_a_crash_before_the_first_step_names_the_layer_of_the_called_model(run_program):
    result = run_program("""
        import torch
        from torch import nn
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to("meta")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(4, 8)
        x.to("meta")  # dropped
        model(x)
    """)
    (finding,) = result.report.findings
    assert finding.name == "device-mismatch" and finding.location.module == "0"


def test_a_part_the_optimizer_leaves_out_is_watched_with_its_model(run_program):
    # Lightning's shape with configure_optimizers over the head only: the encoder gets gradients, never steps
    result = run_program("""
        import torch
        from torch import nn
        class Task(nn.Module):
            def __init__(self):
                super().__init__()
                self.encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
                self.head = nn.Linear(16, 3)
        task = Task()
        opt = torch.optim.Adam(task.head.parameters(), lr=1e-3)
        for _ in range(3):
            opt.zero_grad()
            nn.functional.cross_entropy(task.head(task.encoder(torch.randn(4, 8))), torch.randint(0, 3, (4,))).backward()
            opt.step()
    """)  # noqa: E501 - the fixture's own line
    assert [m["label"] for m in result.report.facts["models"]] == ["Task"]
    assert problems(result) == ["param-not-in-optimizer"]


# kuangliu/pytorch-cifar's main.py, in small: module-level loaders with workers, train()/test() functions over
# globals, eval under no_grad, a per-epoch cosine schedule, a checkpoint saved when the accuracy improves
CIFAR_STYLE = """
import os
import sys
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.linear = nn.Linear(8, 10)

    def forward(self, x):
        out = F.relu(self.bn(self.conv(x)))
        return self.linear(F.adaptive_avg_pool2d(out, 1).flatten(1))

def data(n):
    return torch.utils.data.TensorDataset(torch.randn(n, 3, 8, 8), torch.randint(0, 10, (n,)))

trainloader = torch.utils.data.DataLoader(data(64), batch_size=16, shuffle=True, num_workers=2)
testloader = torch.utils.data.DataLoader(data(32), batch_size=16, shuffle=False, num_workers=2)
net = Net()
criterion = nn.CrossEntropyLoss()
optimizer = optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=200)
best_acc = 0

def train(epoch):
    net.train()
    for batch_idx, (inputs, targets) in enumerate(trainloader):
        optimizer.zero_grad()
        loss = criterion(net(inputs), targets)
        loss.backward()
        optimizer.step()

def test(epoch):
    global best_acc
    net.eval()
    correct = total = 0
    with torch.no_grad():
        for inputs, targets in testloader:
            correct += net(inputs).max(1)[1].eq(targets).sum().item()
            total += targets.size(0)
    acc = 100.0 * correct / total
    if acc > best_acc:
        torch.save({"net": net.state_dict(), "acc": acc, "epoch": epoch}, sys.argv[1])
        best_acc = acc

for epoch in range(2):
    train(epoch)
    test(epoch)
    scheduler.step()
"""


def test_a_cifar_style_script_is_quiet_and_its_missing_zero_grad_caught(run_program, tmp_path):
    ckpt = str(tmp_path / "ckpt.pth")
    result = run_program(CIFAR_STYLE, ckpt)
    assert problems(result) == [] and result.exit_status == 0
    assert [m["label"] for m in result.report.facts["models"]] == ["Net"]
    assert result.report.facts["optimizers"] == [{"label": "SGD", "steps": 8}]
    bug = run_program(CIFAR_STYLE.replace("        optimizer.zero_grad()\n", ""), ckpt)
    (finding,) = [f for f in bug.report.findings if f.name == "missing-zero-grad"]
    assert finding.location.step == 1 and bug.exit_status == 1


def test_a_grad_scaler_step_that_adopts_its_optimizer_breaks_no_check(run_program):
    """`run` adopts the optimizer inside the first `scaler.step(opt)`: the GradScaler listener of
    nonfinite-values sees that call's end without its start, and must simply let it pass."""
    result = run_program(
        """
        import torch
        from torch import nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu")
        for _ in range(5):
            opt.zero_grad()
            scaler.scale(nn.functional.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 1))).backward()
            scaler.step(opt)
            scaler.update()
        """,
        select=["nonfinite-values"],
    )
    assert result.report.findings == [] and result.exit_status == 0


def test_checks_that_look_at_the_models_once_see_the_models_adopted_later(run_program, monkeypatch):
    """host-device-sync and tensor-cores-idle looked at the models when the session started, when `run` has none
    yet: on a (faked) Ampere GPU they now judge the model adopted at its first step."""
    import torchdoctor.checks.host_device_sync as hds
    import torchdoctor.checks.tensor_cores_idle as tci

    monkeypatch.setattr(hds, "on_cuda", lambda model: True)
    monkeypatch.setattr(hds, "debug_mode", lambda mode: None)
    monkeypatch.setattr(tci, "device_of", lambda model: ("cpu", (8, 0)))
    step = GOOD_STEP + "    warnings.warn('called a synchronizing CUDA operation', UserWarning)  # as loss.item()\n"
    source = "import warnings\n" + LOOP.replace("range(6)", "range(40)").format(step=step)
    result = run_program(source, select=["host-device-sync", "tensor-cores-idle"])
    assert {f.name for f in result.report.findings} == {"host-device-sync", "tensor-cores-idle"}
