"""Planted bugs from the classes real code showed (issue 24), each beside a look-alike control that must stay quiet.

Every case writes a small project (a pyproject.toml marks its root), lints one file as an editor would, and
asks only the rule the bug belongs to. `BUG` is the buggy project with the line the finding must name;
`CONTROL` is the same project with the one change that makes it correct (or deliberate).
"""

import textwrap

import pytest

from torchdoctor import registry
from torchdoctor.lint.runner import lint_paths


def lint_project(root, files, target, rule):
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'demo'\n", encoding="utf-8")
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    result = lint_paths([str(root / target)], [registry.get(rule)], cwd=str(root), jobs=1)
    return result.findings


def case(rule, target, bug, control, line, **extra):
    """One planted bug: `bug` and `control` map file names to source; the finding must be at `line` of target."""
    return pytest.param(rule, target, bug, control, line, extra, id=f"{rule}:{target}:{line}")


# ---- missing-zero-grad: whose gradients a clear touches, and when -----------------------------------------------

GAN = """
import torch

def train(netG, netD, loader, criterion, noise):
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4)
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4)
    for real in loader:
        {clear_d}
        errD = criterion(netD(real), 1) + criterion(netD(netG(noise).detach()), 0)
        errD.backward()
        optimizerD.step()
        netG.zero_grad()
        errG = criterion(netD(netG(noise)), 1)
        errG.backward()
        optimizerG.step()
"""

GAN_CLASS = """
import torch
from torch import nn

class GANTrainer:
    def __init__(self, gen, disc):
        self.gen, self.disc = gen, disc
        self.opt_g = torch.optim.Adam(self.gen.parameters(), lr=2e-4)
        self.opt_d = torch.optim.Adam([{{"params": self.disc.parameters(), "lr": 1e-4}}])

    def fit(self, loader, noise):
        for real in loader:
            {clear_d}
            loss_d = self.disc(real).mean() - self.disc(self.gen(noise).detach()).mean()
            loss_d.backward()
            self.opt_d.step()
            self.gen.zero_grad()
            loss_g = -self.disc(self.gen(noise)).mean()
            loss_g.backward()
            self.opt_g.step()
"""

EVERY_KTH = """
def train(model, loader, optimizer, criterion, k=4):
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        if (i + 1) % k == 0:
            optimizer.zero_grad()
"""

ACCUMULATE = """
def train(model, loader, optimizer, criterion, k=4):
    for i, (x, y) in enumerate(loader):
        if i % k == 0:
            optimizer.zero_grad()
        loss = criterion(model(x), y) / k
        loss.backward()
        if (i + 1) % k == 0:
            optimizer.step()
"""

LIBRARY_CALL = """
import torch
from mylib.optim import clip_gradient

def train(model, loader, optimizer, criterion):
    for x, y in loader:
        {clear}
        loss = criterion(model(x), y)
        loss.backward()
        clip_gradient(optimizer, 5.0)
        optimizer.step()
"""

LAST_LAYER_ONLY = """
def reset_head(model):
    model.head.weight.grad = None

def train(model, loader, optimizer, criterion):
    for x, y in loader:
        reset_head(model)
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
"""

# ---- eval-without-no-grad: the ways projects turn autograd off ---------------------------------------------------

WRAPS_DECORATOR = """
import functools
import torch

def {name}(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        {body}
    return wrapper
"""

EVALUATE = """
from utils import {name}

@{name}{call}
def evaluate(model, loader):
    model.eval()
    total = 0
    for x, y in loader:
        total += (model(x).argmax(1) == y).sum().item()
    return total

acc = evaluate(model, val_loader)
"""

SMART = """
import torch

def smart_inference_mode(torch_1_9=True):
    def decorate(fn):
        return (torch.inference_mode if torch_1_9 else {grad_off})()(fn)
    return decorate
"""

# ---- train-mode-not-restored: deliberate eval and models eval() does not change ------------------------------------

TRAIN_MODE = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), {layer}, nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x):
        return self.body(x)

def fit(loader, val_loader, epochs):
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                print(model(x).argmax(1))
"""

FROZEN_BN = """
import torch

def validate(model):
    with torch.no_grad():
        for x, y in val_loader:
            print(model(x).argmax(1))

def finetune(model, loader, optimizer, epochs):
    for epoch in range(epochs):
        {first}
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        {after}
        validate(model)
"""

# ---- local-rank-argument -----------------------------------------------------------------------------------------

LOCAL_RANK = """
import argparse
{extra}
parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
args = parser.parse_args()
"""


CASES = [
    case(
        "missing-zero-grad",
        "gan.py",
        {"gan.py": GAN.format(clear_d="")},
        {"gan.py": GAN.format(clear_d="netD.zero_grad()")},
        11,
    ),
    case(
        "missing-zero-grad",
        "gan.py",
        {"gan.py": GAN.format(clear_d="")},
        {"gan.py": GAN.format(clear_d="optimizerD.zero_grad()")},
        11,
    ),
    case(
        "missing-zero-grad",
        "trainer.py",
        {"trainer.py": GAN_CLASS.format(clear_d="")},
        {"trainer.py": GAN_CLASS.format(clear_d="self.disc.zero_grad()")},
        16,
    ),
    case(
        "missing-zero-grad",
        "train.py",
        {"train.py": EVERY_KTH},
        {"train.py": ACCUMULATE},
        6,
        message="runs only when `(i + 1) % k == 0`",
    ),
    case(
        "missing-zero-grad",
        "train.py",
        {"train.py": EVERY_KTH},
        {
            "train.py": EVERY_KTH.replace(
                "        optimizer.step()\n        if (i + 1) % k == 0:\n",
                "        if (i + 1) % k == 0:\n            optimizer.step()\n",
            )
        },
        6,
    ),
    case(
        "missing-zero-grad",
        "train.py",
        {"train.py": LIBRARY_CALL.format(clear="")},
        {"train.py": LIBRARY_CALL.format(clear="optimizer.zero_grad()")},
        11,
        message="`clip_gradient(optimizer, 5.0)` receives `optimizer` but is not defined in the project",
        severity="warning",
    ),
    case(
        "missing-zero-grad",
        "train.py",
        {
            "train.py": "from helpers import step_all\n"
            + LIBRARY_CALL.format(clear="").replace(
                "from mylib.optim import clip_gradient", "from helpers import clip_gradient"
            ),
            "helpers.py": "def clip_gradient(optimizer, value):\n    for group in optimizer.param_groups:\n"
            "        pass\n",
        },
        {
            "train.py": LIBRARY_CALL.format(clear="").replace(
                "from mylib.optim import clip_gradient", "from helpers import clip_gradient"
            ),
            "helpers.py": "def clip_gradient(optimizer, value):\n    optimizer.zero_grad()\n",
        },
        12,
    ),
    case(
        "eval-without-no-grad",
        "val.py",
        {
            "val.py": EVALUATE.format(name="timed", call=""),
            "utils.py": WRAPS_DECORATOR.format(name="timed", body="return fn(*args, **kwargs)"),
        },
        {
            "val.py": EVALUATE.format(name="timed", call=""),
            "utils.py": WRAPS_DECORATOR.format(
                name="timed", body="with torch.no_grad():\n            return fn(*args, **kwargs)"
            ),
        },
        9,
    ),
    case(
        "eval-without-no-grad",
        "val.py",
        {
            "val.py": EVALUATE.format(name="smart_inference_mode", call="()"),
            "utils.py": SMART.format(grad_off="torch.no_grad")
            .replace("torch.inference_mode if torch_1_9 else ", "")
            .replace("(torch.no_grad)", "(contextlib.nullcontext)"),
        },
        {
            "val.py": EVALUATE.format(name="smart_inference_mode", call="()"),
            "utils.py": SMART.format(grad_off="torch.no_grad"),
        },
        9,
    ),
    case(
        "eval-without-no-grad",
        "val.py",
        {
            "val.py": EVALUATE.format(name="timed", call="")
            .replace("from utils import timed", "import functools")
            .replace("@timed", "@functools.lru_cache")
        },
        {
            "val.py": EVALUATE.format(name="smart_inference_mode", call="()").replace(
                "from utils import", "from ultralytics.utils.torch_utils import"
            )
        },
        9,
        control_severity="info",
    ),
    case(
        "train-mode-not-restored",
        "fit.py",
        {"fit.py": TRAIN_MODE.format(layer="nn.Dropout(0.2)")},
        {"fit.py": TRAIN_MODE.format(layer="nn.LayerNorm(16)")},
        21,
    ),
    case(
        "train-mode-not-restored",
        "fit.py",
        {"fit.py": TRAIN_MODE.format(layer="nn.BatchNorm1d(16)")},
        {"fit.py": TRAIN_MODE.format(layer="nn.GELU()")},
        21,
    ),
    case(
        "train-mode-not-restored",
        "ft.py",
        {"ft.py": FROZEN_BN.format(first="", after="model.eval()")},
        {"ft.py": FROZEN_BN.format(first="model.eval()  # BatchNorm statistics frozen for fine-tuning", after="")},
        16,
    ),
    case(
        "missing-zero-grad",
        "train.py",
        {"train.py": LAST_LAYER_ONLY},
        {
            "train.py": LAST_LAYER_ONLY.replace(
                "    model.head.weight.grad = None", "    for p in model.parameters():\n        p.grad = None"
            )
        },
        10,
    ),
    case(
        "local-rank-argument",
        "train.py",
        {"train.py": LOCAL_RANK.format(extra="import torch")},
        {"train.py": LOCAL_RANK.format(extra="import deepspeed")},
        5,
    ),
]


@pytest.mark.parametrize("rule, target, bug, control, line, extra", CASES)
def test_planted_bug_is_found_and_its_look_alike_is_quiet(tmp_path, rule, target, bug, control, line, extra):
    found = lint_project(tmp_path / "bug", bug, target, rule)
    assert [f.location.line for f in found] == [line], [f.message for f in found]
    if "message" in extra:
        assert extra["message"] in found[0].message
    if "severity" in extra:
        assert str(found[0].severity) == extra["severity"]
    quiet = lint_project(tmp_path / "control", control, target, rule)
    if "control_severity" in extra:  # the verdict rests on an unknown decorator: a note that says so
        assert [str(f.severity) for f in quiet] == [extra["control_severity"]] and "not followed" in quiet[0].message
    else:
        assert quiet == [], [f.message for f in quiet]


def test_a_project_in_a_dot_folder_of_an_enclosing_repository_keeps_its_callers(tmp_path):
    """`~/.jobs/proj` inside a home-folder git repository: the callers of an eval function are still found."""
    (tmp_path / ".git").mkdir()
    files = {
        ".jobs/proj/evaluation.py": EVALUATE.split("@")[0] + "def evaluate(model, loader):\n    model.eval()\n"
        "    for x, y in loader:\n        print(model(x))\n",
        ".jobs/proj/main.py": "from evaluation import evaluate\nevaluate(model, val_loader)\n",
    }
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.replace("from utils import {name}\n", ""), encoding="utf-8")
    result = lint_paths(
        [str(tmp_path / ".jobs/proj/evaluation.py")], [registry.get("eval-without-no-grad")], cwd=str(tmp_path), jobs=1
    )
    assert [f.location.line for f in result.findings] == [6]


# ---- structure: the step and the loop in different classes or files ------------------------------------------------

BASE_TRAINER = """
class BaseTrainer:
    def __init__(self, model, optimizer, loader):
        self.model, self.optimizer, self.loader = model, optimizer, loader

    def train(self, epochs):
        for epoch in range(epochs):
            for batch in self.loader:
                self.run_step(batch)

    def run_step(self, batch):
        {clear}
        loss = self.model(*batch).mean()
        loss.backward()
        self.optimizer.step()
"""

SUBCLASS = """
from engine import BaseTrainer

class MyTrainer(BaseTrainer):
    def fit(self, loader):
        for batch in loader:
            self.run_step(batch)
            self.log_step()

    def log_step(self):
        print("step")
"""

OVERRIDE = """
class BaseTrainer:
    def train(self, loader):
        for batch in loader:
            self.run_step(batch)

    def run_step(self, batch):
        raise NotImplementedError


class SimpleTrainer(BaseTrainer):
    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def run_step(self, batch):
        {clear}
        loss = self.model(*batch).mean()
        loss.backward()
        self.optimizer.step()
"""

STRUCTURE_CASES = [
    # the step in a base class of another file, the loop in the subclass
    case(
        "missing-zero-grad",
        "train.py",
        {"train.py": SUBCLASS, "engine.py": BASE_TRAINER.format(clear="pass")},
        {"train.py": SUBCLASS, "engine.py": BASE_TRAINER.format(clear="self.optimizer.zero_grad()")},
        7,
    ),
    # the loop in a base class's train(), the step in the subclass's run_step()
    case(
        "missing-zero-grad",
        "trainer.py",
        {"trainer.py": OVERRIDE.format(clear="pass")},
        {"trainer.py": OVERRIDE.format(clear="self.optimizer.zero_grad()")},
        5,
    ),
]


@pytest.mark.parametrize("rule, target, bug, control, line, extra", STRUCTURE_CASES)
def test_planted_structure_bug_is_found_and_its_look_alike_is_quiet(tmp_path, rule, target, bug, control, line, extra):
    test_planted_bug_is_found_and_its_look_alike_is_quiet(tmp_path, rule, target, bug, control, line, extra)


# ---- over-broad off-switches -----------------------------------------------------------------------------------

EVAL_FN = """
def evaluate(model, loader):
    model.eval()
    total = 0
    for x, y in loader:
        total += (model(x).argmax(1) == y).sum().item()
    return total
"""

CALLERS = """
import torch
from evaluation import evaluate

def fit(model, loader, val_loader, optimizer, epochs):
    for epoch in range(epochs):
        with torch.no_grad():
            print(evaluate(model, val_loader))
    {final}
"""

CHAIN = """
import torch
from evaluation import evaluate

def gather(model, loader):
    return [evaluate(model, loader)]

{decorator}
def score(model, loader):
    return gather(model, loader)
"""

INLINE_VALIDATION = """
import torch

def fit(model, loader, val_loader, optimizer, criterion, epochs):
    for epoch in range(epochs):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        model.eval()
        {guard}
            for x, y in val_loader:
                print(criterion(model(x), y).item())

fit(model, loader, val_loader, optimizer, criterion, 10)
"""

PARTLY_FROZEN = """
def extract(model, loader):
    for name, p in model.named_parameters():
        {freeze}
    model.eval()
    for x in loader:
        print(model(x).shape)

extract(model, loader)
"""

LOG_WINDOW = """
def train(model, loader, optimizer, criterion, log_every=100):
    running_loss = 0.0
    for step, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        running_loss += {kept}
        if step % log_every == 0:
            print(running_loss / log_every)
            running_loss = 0.0
"""

OFF_SWITCH_CASES = [
    # a reset every log_every steps still keeps up to log_every graphs
    case(
        "graph-retention-leak",
        "train.py",
        {"train.py": LOG_WINDOW.format(kept="loss")},
        {"train.py": LOG_WINDOW.format(kept="loss.item()")},
        9,
    ),
    # freezing some parameters by name is not freezing the model: its forward still records a graph
    case(
        "eval-without-no-grad",
        "extract.py",
        {"extract.py": PARTLY_FROZEN.format(freeze='if "bn" in name:\n            p.requires_grad = False')},
        {"extract.py": PARTLY_FROZEN.format(freeze="p.requires_grad = False")},
        8,
    ),
    # a backward elsewhere in the function does not make the validation forward's graph useful
    case(
        "eval-without-no-grad",
        "fit.py",
        {"fit.py": INLINE_VALIDATION.format(guard="if True:")},
        {"fit.py": INLINE_VALIDATION.format(guard="with torch.no_grad():")},
        15,
    ),
    # the no_grad is two calls up: the helper between is not a caller with grad on
    case(
        "eval-without-no-grad",
        "evaluation.py",
        {"evaluation.py": EVAL_FN, "main.py": CHAIN.format(decorator="")},
        {"evaluation.py": EVAL_FN, "main.py": CHAIN.format(decorator="@torch.no_grad()")},
        6,
    ),
    case(
        "eval-without-no-grad",
        "evaluation.py",
        {"evaluation.py": EVAL_FN, "main.py": CALLERS.format(final="return evaluate(model, val_loader)")},
        {
            "evaluation.py": EVAL_FN,
            "main.py": CALLERS.format(final="with torch.no_grad():\n        return evaluate(model, val_loader)"),
        },
        6,
        message="runs it with autograd on",
    ),
]


@pytest.mark.parametrize("rule, target, bug, control, line, extra", OFF_SWITCH_CASES)
def test_planted_off_switch_bug_is_found_and_its_look_alike_is_quiet(tmp_path, rule, target, bug, control, line, extra):
    test_planted_bug_is_found_and_its_look_alike_is_quiet(tmp_path, rule, target, bug, control, line, extra)


# ---- accumulation through an object of a project class ----------------------------------------------------------

METER = """
class AverageMeter:
    def __init__(self):
        self.sum, self.count = 0, 0

    def update(self, val, n=1):
        self.sum += val * n
        self.count += n
"""

METER_LOOP = """
from utils import AverageMeter

def train(model, loader, optimizer, criterion):
    losses = AverageMeter()
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        losses.update({kept}, x.size(0))
    return losses.sum / losses.count
"""

OBJECT_CASES = [
    case(
        "graph-retention-leak",
        "train.py",
        {"train.py": METER_LOOP.format(kept="loss"), "utils.py": METER},
        {"train.py": METER_LOOP.format(kept="loss.item()"), "utils.py": METER},
        11,
        message="losses.sum",
    ),
    case(
        "graph-retention-leak",
        "train.py",
        {"train.py": METER_LOOP.format(kept="loss"), "utils.py": METER},
        {
            "train.py": METER_LOOP.format(kept="loss"),
            "utils.py": METER.replace("self.sum += val * n", "self.sum += float(val) * n"),
        },
        11,
    ),
    case(
        "graph-retention-leak",
        "train.py",
        {"train.py": METER_LOOP.format(kept="loss"), "utils.py": METER},
        {
            "train.py": METER_LOOP.format(kept="loss"),
            "utils.py": METER.replace("self.sum += val * n", "val = val.data.sum()\n        self.sum += val * n"),
        },
        11,
    ),
]


@pytest.mark.parametrize("rule, target, bug, control, line, extra", OBJECT_CASES)
def test_planted_object_bug_is_found_and_its_look_alike_is_quiet(tmp_path, rule, target, bug, control, line, extra):
    test_planted_bug_is_found_and_its_look_alike_is_quiet(tmp_path, rule, target, bug, control, line, extra)


# ---- optimizers and tensors whose origin lies in a helper -------------------------------------------------------

BUILD = """
import torch

def build_optimizer(cfg, model):
    params = [{"params": model.backbone.parameters(), "lr": cfg.lr * 0.1}, {"params": model.head.parameters()}]
    return torch.optim.SGD(params, lr=cfg.lr, momentum=0.9)
"""
TRAIN_BUILT = """
from solver import build_optimizer

def train(cfg, model, loader, criterion):
    optimizer = build_optimizer(cfg, model)
    for x, y in loader:
        {clear}
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
"""
NEXT_ITER = """
import torch

def overfit_one_batch(model, loader, optimizer, criterion, device, steps=100):
    images, labels = next(iter(loader))
    {move}
    for _ in range(steps):
        optimizer.zero_grad()
        loss = criterion(model(images), labels)
        loss.backward()
        optimizer.step()
"""
GET_BATCH = """
import torch

def get_batch(data, block, batch_size):
    ix = torch.randint(len(data) - block, (batch_size,))
    x = torch.stack([data[i:i + block] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block] for i in ix])
    return x, y

def train(model, data, optimizer, device):
    for step in range(1000):
        x, y = get_batch(data, 64, 12)
        {move}
        optimizer.zero_grad()
        loss = model(x, y)
        loss.backward()
        optimizer.step()
"""
SCALER_CLASS = """
import torch

class Trainer:
    def __init__(self, model, lr):
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        self.scaler = torch.amp.GradScaler("cuda")

    def step(self, batch):
        {clear}
        with torch.autocast("cuda"):
            loss = self.model(*batch)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def fit(self, loader):
        for batch in loader:
            self.step(batch)
"""
GET_BATCH_MODULE = GET_BATCH.split("def train")[0]
TRAIN_WITH_GET_BATCH = "from data import get_batch\n\ndef train" + GET_BATCH.split("def train")[1]

ORIGIN_CASES = [
    case(
        "missing-zero-grad",
        "train.py",
        {"train.py": TRAIN_BUILT.format(clear="pass"), "solver.py": BUILD},
        {"train.py": TRAIN_BUILT.format(clear="optimizer.zero_grad()"), "solver.py": BUILD},
        10,
    ),
    case(
        "to-result-discarded",
        "t.py",
        {"t.py": NEXT_ITER.format(move="images.to(device)")},
        {"t.py": NEXT_ITER.format(move="images = images.to(device)")},
        6,
    ),
    case(
        "to-result-discarded",
        "t.py",
        {"t.py": GET_BATCH.format(move="x.to(device)")},
        {"t.py": GET_BATCH.format(move="x = x.to(device)")},
        13,
    ),
    case(
        "missing-zero-grad",
        "t.py",
        {"t.py": SCALER_CLASS.format(clear="pass")},
        {"t.py": SCALER_CLASS.format(clear="self.optimizer.zero_grad()")},
        20,
    ),
    case(
        "to-result-discarded",
        "train.py",
        {"train.py": TRAIN_WITH_GET_BATCH.format(move="x.to(device)"), "data.py": GET_BATCH_MODULE},
        {"train.py": TRAIN_WITH_GET_BATCH.format(move="x = x.to(device)"), "data.py": GET_BATCH_MODULE},
        6,
    ),
]


@pytest.mark.parametrize("rule, target, bug, control, line, extra", ORIGIN_CASES)
def test_planted_origin_bug_is_found_and_its_look_alike_is_quiet(tmp_path, rule, target, bug, control, line, extra):
    test_planted_bug_is_found_and_its_look_alike_is_quiet(tmp_path, rule, target, bug, control, line, extra)


# ---- clears, switches and evaluations seen through structure ----------------------------------------------------

CHAIN_GAN = """
import itertools
import torch

def train(G, D1, D2, loader, noise):
    opt_g = torch.optim.Adam(G.parameters())
    opt_d = torch.optim.Adam(itertools.chain(D1.parameters(), D2.parameters()))
    for real in loader:
        {clear}
        loss_d = D1(real).mean() + D2(real).mean() - D1(G(noise).detach()).mean()
        loss_d.backward()
        opt_d.step()
        G.zero_grad()
        loss_g = -D1(G(noise)).mean()
        loss_g.backward()
        opt_g.step()
"""
VALIDATE_FN = """
import torch

def validate(model, loader):
    model.eval()
    with torch.no_grad():
        for x, y in loader:
            print(model(x).argmax(1))
    {restore}

def fit(model, loader, val_loader, optimizer, epochs):
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        validate(model, val_loader)
"""
TRAINER_EVAL = """
import torch

class Trainer:
    def __init__(self, model, loader, val_loader, optimizer):
        self.model, self.loader, self.val_loader, self.optimizer = model, loader, val_loader, optimizer

    {decorator}
    def validate(self):
        self.model.eval()
        correct = 0
        for x, y in self.val_loader:
            correct += (self.model(x).argmax(1) == y).sum().item()
        return correct

    def fit(self, epochs):
        for epoch in range(epochs):
            self.model.train()
            for x, y in self.loader:
                self.optimizer.zero_grad()
                torch.nn.functional.cross_entropy(self.model(x), y).backward()
                self.optimizer.step()
            print(self.validate())
"""
SCRIPT_EVAL = """
import torch

model = torch.load("model.pt", weights_only=False)
model.eval()
{guard}
    out = model(torch.randn(1, 3, 224, 224))
    print(out.argmax())
"""

MORE_CASES = [
    case(
        "missing-zero-grad",
        "gan.py",
        {"gan.py": CHAIN_GAN.format(clear="")},
        {"gan.py": CHAIN_GAN.format(clear="D2.zero_grad(); D1.zero_grad()")},
        12,
    ),
    case(
        "train-mode-not-restored",
        "fit.py",
        {"fit.py": VALIDATE_FN.format(restore="")},
        {"fit.py": VALIDATE_FN.format(restore="model.train()")},
        17,
    ),
    case(
        "eval-without-no-grad",
        "trainer.py",
        {"trainer.py": TRAINER_EVAL.format(decorator="")},
        {"trainer.py": TRAINER_EVAL.format(decorator="@torch.no_grad()")},
        13,
    ),
    case(
        "eval-without-no-grad",
        "infer.py",
        {"infer.py": SCRIPT_EVAL.format(guard="if True:")},
        {"infer.py": SCRIPT_EVAL.format(guard="with torch.set_grad_enabled(False):")},
        7,
    ),
    case(
        "local-rank-argument",
        "train.py",
        {"train.py": LOCAL_RANK.format(extra="import torch")},
        {
            "train.py": LOCAL_RANK.format(extra="import torch").replace(
                '"--local_rank", ', '"--local_rank", "--local-rank", '
            )
        },
        5,
    ),
]


@pytest.mark.parametrize("rule, target, bug, control, line, extra", MORE_CASES)
def test_planted_structure_case_is_found_and_its_look_alike_is_quiet(tmp_path, rule, target, bug, control, line, extra):
    test_planted_bug_is_found_and_its_look_alike_is_quiet(tmp_path, rule, target, bug, control, line, extra)


# ---- the other rules, on realistic setups ------------------------------------------------------------------------

DDP_BRANCH = """
import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

def main(args, dataset, model, optimizer):
    train_sampler = DistributedSampler(dataset) if args.distributed else None
    loader = DataLoader(dataset, batch_size=32, shuffle=(train_sampler is None), sampler=train_sampler)
    for epoch in range(args.epochs):
        {set_epoch}
        for x, y in loader:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
"""
DETERMINISM = """
import torch

def setup(seed):
    torch.manual_seed(seed)
    torch.backends.cudnn.benchmark = {benchmark}
    torch.use_deterministic_algorithms(True)
"""
VGG_HEAD = """
import torch
import torchvision
from torch import nn

def build(num_classes):
    model = torchvision.models.vgg16(weights="DEFAULT")
    {first}
    {second}
    return model, optimizer
"""
RESUME_CUDA = """
import torch

def resume(model, path):
    optimizer = torch.optim.Adam(model.parameters())
    {before}
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    {after}
    return model, optimizer
"""
AMP_CLIP = """
import torch

def train(model, loader, optimizer, criterion):
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        optimizer.zero_grad()
        with torch.autocast("cuda"):
            loss = criterion(model(x), y)
        scaler.scale(loss).backward()
        {unscale}
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
"""
LOADERS = """
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

def build_loader(dataset, batch_size):
    sampler = DistributedSampler(dataset)
    return DataLoader(dataset, batch_size=batch_size, shuffle={shuffle}, sampler=sampler)
"""
HEAD_LINE = "model.classifier[6] = nn.Linear(4096, num_classes)"
OPT_LINE = "optimizer = torch.optim.SGD(model.parameters(), lr=0.01)"
SETUP_CASES = [
    case(
        "sampler-epoch-not-set",
        "main.py",
        {"main.py": DDP_BRANCH.format(set_epoch="pass")},
        {"main.py": DDP_BRANCH.format(set_epoch="if args.distributed:\n            train_sampler.set_epoch(epoch)")},
        7,
    ),
    case(
        "nondeterministic-settings",
        "setup.py",
        {"setup.py": DETERMINISM.format(benchmark="True")},
        {"setup.py": DETERMINISM.format(benchmark="False")},
        6,
    ),
    case(
        "stale-optimizer-params",
        "model.py",
        {"model.py": VGG_HEAD.format(first=OPT_LINE, second=HEAD_LINE)},
        {"model.py": VGG_HEAD.format(first=HEAD_LINE, second=OPT_LINE)},
        9,
    ),
    case(
        "optimizer-state-device",
        "resume.py",
        {"resume.py": RESUME_CUDA.format(before="", after="model.cuda()")},
        {"resume.py": RESUME_CUDA.format(before="model.cuda()", after="")},
        9,
    ),
    case(
        "clip-before-unscale",
        "train.py",
        {"train.py": AMP_CLIP.format(unscale="")},
        {"train.py": AMP_CLIP.format(unscale="scaler.unscale_(optimizer)")},
        12,
    ),
    case(
        "shuffle-with-sampler",
        "data.py",
        {"data.py": LOADERS.format(shuffle="True")},
        {"data.py": LOADERS.format(shuffle="False")},
        7,
    ),
]


@pytest.mark.parametrize("rule, target, bug, control, line, extra", SETUP_CASES)
def test_planted_setup_bug_is_found_and_its_look_alike_is_quiet(tmp_path, rule, target, bug, control, line, extra):
    test_planted_bug_is_found_and_its_look_alike_is_quiet(tmp_path, rule, target, bug, control, line, extra)


# ---- calls into installed libraries: read from site-packages, summarised like the project's ---------------------

NATIVE_SCALER = """
import torch

class NativeScaler:
    def __init__(self):
        self._scaler = torch.amp.GradScaler("cuda")

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None):
        self._scaler.scale(loss).backward()
        {clear}
        self._scaler.step(optimizer)
        self._scaler.update()
"""

SMART_LIB = """
import torch

def smart_inference_mode():
    def decorate(fn):
        return {grad_off}()(fn)
    return decorate
"""

LIB_TRAIN = """
from fakelib import NativeScaler

def train(model, loader, optimizer, criterion):
    loss_scaler = NativeScaler()
    for x, y in loader:
        {clear}
        loss = criterion(model(x), y)
        loss_scaler(loss, optimizer, parameters=model.parameters())
"""

LIB_EVAL = """
from fakelib.torch_utils import smart_inference_mode

@smart_inference_mode()
def evaluate(model, loader):
    model.eval()
    for x, y in loader:
        print(model(x).argmax(1))

evaluate(model, val_loader)
"""


def lint_with_library(tmp_path, monkeypatch, library: dict, code: str, rule: str):
    """Install `library` as the package `fakelib` in a site-packages folder on sys.path and lint `code`."""
    import sys

    site = tmp_path / "env" / "site-packages"
    for name, text in library.items():
        (site / "fakelib").mkdir(parents=True, exist_ok=True)
        (site / "fakelib" / name).write_text(textwrap.dedent(text), encoding="utf-8")
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])
    return lint_project(tmp_path / "proj", {"train.py": code}, "train.py", rule)


def test_a_library_scaler_that_steps_without_clearing_is_followed(tmp_path, monkeypatch):
    library = {"__init__.py": "from .cuda import NativeScaler\n", "cuda.py": NATIVE_SCALER.format(clear="")}
    [f] = lint_with_library(tmp_path, monkeypatch, library, LIB_TRAIN.format(clear="pass"), "missing-zero-grad")
    assert f.location.line == 9 and "(in `__call__`)" in f.message


@pytest.mark.parametrize(
    "library_clear, loop_clear", [("", "optimizer.zero_grad()"), ("optimizer.zero_grad()", "pass")]
)
def test_a_library_scaler_look_alikes_are_quiet(tmp_path, monkeypatch, library_clear, loop_clear):
    library = {"__init__.py": "from .cuda import NativeScaler\n", "cuda.py": NATIVE_SCALER.format(clear=library_clear)}
    assert (
        lint_with_library(tmp_path, monkeypatch, library, LIB_TRAIN.format(clear=loop_clear), "missing-zero-grad") == []
    )


@pytest.mark.parametrize("grad_off, expected", [("torch.inference_mode", []), ("contextlib.nullcontext", [8])])
def test_a_library_no_grad_decorator_is_followed(tmp_path, monkeypatch, grad_off, expected):
    library = {"__init__.py": "", "torch_utils.py": SMART_LIB.format(grad_off=grad_off)}
    found = lint_with_library(tmp_path, monkeypatch, library, LIB_EVAL, "eval-without-no-grad")
    assert [f.location.line for f in found] == expected


# ---- facts declared by rules, followed through helpers (the fact engine) -----------------------------------------

RESET = """
def reset(opt):
    opt.zero_grad()
"""

GAN_RESET = """
import torch
from utils import reset

def train(netG, netD, loader, criterion, noise):
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4)
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4)
    for real in loader:
        reset({cleared})
        lossD = criterion(netD(real), 1)
        lossD.backward()
        optimizerD.step()
        reset(optimizerG)
        lossG = criterion(netD(netG(noise)), 1)
        lossG.backward()
        optimizerG.step()
"""

MAYBE_CLEAR = """
def maybe_clear(optimizer, i, k):
    {guard}
        optimizer.zero_grad()
"""

STEP_EVERY = """
from utils import maybe_clear

def train(model, loader, optimizer, criterion, k=4):
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        {step}
        maybe_clear(optimizer, i, k)
"""

TRAINER_STEP = """
import torch

class Trainer:
    def __init__(self, gen, disc):
        self.opt_g = torch.optim.Adam(gen.parameters())
        self.opt_d = torch.optim.Adam(disc.parameters())

    def clear(self):
        self.{cleared}.zero_grad()

    def fit(self, loader, loss_fn):
        for x in loader:
            self.clear()
            loss_fn(x).backward()
            self.opt_d.step()
"""

RUN_BATCH = """
def run_batch(net, x):
    return net(x)

def predict_all(net, loader):
    outs = []
    for x in loader:
        outs.append(run_batch(net, x))
    return outs
"""

VALIDATE = """
from utils import predict_all

def validate(model, loader):
    model.eval()
    outs = predict_all(model, loader)
    model.train()
    return outs

for epoch in range(3):
    validate(model, val_loader)
"""

PREDICT = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return self.fc(self.drop(x))

    {decorator}
    def predict(self, x):
        return self(x).argmax(1)

model = Net()
model.eval()
labels = model.predict(torch.randn(8, 4))
"""

RESUME_HELPER = """
import torch

def resume(path, model, optimizer):
    ckpt = torch.load(path)
    model.load_state_dict(ckpt["model"])
    {load}
    return ckpt["epoch"]
"""

RESUME_THEN_MOVE = """
import torch
from torch import nn
from utils import resume

model = nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
{first}
{second}
"""

TO_DEVICE = """
def to_device(model, device):
    {body}
"""

LOAD_THEN_HELPER_MOVE = """
import torch
from torch import nn
from utils import to_device

model = nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
optimizer.load_state_dict(torch.load("last.pt")["optimizer"])
model = to_device(model, "cuda")
"""

PREPARE = """
def prepare(module):
    {body}
    return module
"""

EXTRACT = """
from utils import prepare

def extract(model, loader):
    prepare(model)
    model.eval()
    for x in loader:
        print(model(x).shape)

extract(model, loader)
"""

EPOCHS = """
from torch.utils.data import DataLoader, DistributedSampler
from {where} import train_one_epoch

def main(dataset, model, epochs):
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, sampler=sampler)
    for epoch in range(epochs):
        train_one_epoch(loader, model, epoch)
"""

ONE_EPOCH = """
def train_one_epoch(loader, model, epoch):
    loader.sampler.set_epoch(epoch)
    for x in loader:
        model(x).sum().backward()
"""

ENGINE_CASES = [
    # the epoch loop hands the loader to a function nobody can read: reported, and the message says so
    case(
        "sampler-epoch-not-set",
        "train.py",
        {"train.py": EPOCHS.format(where="somelib.engine")},
        {"train.py": EPOCHS.format(where="engine"), "engine.py": ONE_EPOCH},
        6,
        message="`train_one_epoch(loader, model, epoch)` (line 9) receives `loader` but is not defined in the project",
    ),
    # a model frozen whole by a helper in another file records no graph: quiet; a helper that does not freeze it
    case(
        "eval-without-no-grad",
        "extract.py",
        {"extract.py": EXTRACT, "utils.py": PREPARE.format(body="module.cpu()")},
        {
            "extract.py": EXTRACT,
            "utils.py": PREPARE.format(body="for p in module.parameters():\n        p.requires_grad = False"),
        },
        8,
    ),
    # whose gradients a helper clears: `reset(optimizerG)` does not clear the discriminator's optimizer
    case(
        "missing-zero-grad",
        "gan.py",
        {"gan.py": GAN_RESET.format(cleared="optimizerG"), "utils.py": RESET},
        {"gan.py": GAN_RESET.format(cleared="optimizerD"), "utils.py": RESET},
        12,
    ),
    # a method that clears the other optimizer of its own instance (`self.clear()` -> `self.opt_g`)
    case(
        "missing-zero-grad",
        "trainer.py",
        {"trainer.py": TRAINER_STEP.format(cleared="opt_g")},
        {"trainer.py": TRAINER_STEP.format(cleared="opt_d")},
        16,
    ),
    # a helper that clears only every k-th call, while the loop steps every iteration
    case(
        "missing-zero-grad",
        "train.py",
        {
            "train.py": STEP_EVERY.format(step="optimizer.step()"),
            "utils.py": MAYBE_CLEAR.format(guard="if (i + 1) % k == 0:"),
        },
        {"train.py": STEP_EVERY.format(step="optimizer.step()"), "utils.py": MAYBE_CLEAR.format(guard="if k:")},
        8,
        message="runs only when `(i + 1) % k == 0` in `maybe_clear`",
    ),
    # ... and its accumulation look-alike: the step is every k-th too
    case(
        "missing-zero-grad",
        "train.py",
        {
            "train.py": STEP_EVERY.format(step="optimizer.step()"),
            "utils.py": MAYBE_CLEAR.format(guard="if (i + 1) % k == 0:"),
        },
        {
            "train.py": STEP_EVERY.format(step="if (i + 1) % k == 0:\n            optimizer.step()"),
            "utils.py": MAYBE_CLEAR.format(guard="if (i + 1) % k == 0:"),
        },
        8,
    ),
    # an evaluation forward two helpers away, in another file
    case(
        "eval-without-no-grad",
        "val.py",
        {"val.py": VALIDATE, "utils.py": RUN_BATCH},
        {
            "val.py": VALIDATE,
            "utils.py": "import torch\n" + RUN_BATCH.replace("def run_batch", "@torch.no_grad()\ndef run_batch"),
        },
        6,
    ),
    # a forward through a custom method of the model (`model.predict(x)` calling `self(x)`)
    case(
        "eval-without-no-grad",
        "infer.py",
        {"infer.py": PREDICT.format(decorator="")},
        {"infer.py": PREDICT.format(decorator="@torch.no_grad()")},
        20,
    ),
    # optimizer state loaded by a helper in another file, the model moved afterwards
    case(
        "optimizer-state-device",
        "train.py",
        {
            "train.py": RESUME_THEN_MOVE.format(
                first='start = resume("last.pt", model, optimizer)', second='model.to("cuda")'
            ),
            "utils.py": RESUME_HELPER.format(load='optimizer.load_state_dict(ckpt["optimizer"])'),
        },
        {
            "train.py": RESUME_THEN_MOVE.format(
                first='model.to("cuda")', second='start = resume("last.pt", model, optimizer)'
            ),
            "utils.py": RESUME_HELPER.format(load='optimizer.load_state_dict(ckpt["optimizer"])'),
        },
        8,
        message="(it loads `optimizer`'s state)",
    ),
    # ... and its look-alike: the helper loads only the model's weights
    case(
        "optimizer-state-device",
        "train.py",
        {
            "train.py": RESUME_THEN_MOVE.format(
                first='start = resume("last.pt", model, optimizer)', second='model.to("cuda")'
            ),
            "utils.py": RESUME_HELPER.format(load='optimizer.load_state_dict(ckpt["optimizer"])'),
        },
        {
            "train.py": RESUME_THEN_MOVE.format(
                first='start = resume("last.pt", model, optimizer)', second='model.to("cuda")'
            ),
            "utils.py": RESUME_HELPER.format(load="optimizer.zero_grad()"),
        },
        8,
    ),
    # state loaded here, the model moved by a helper in another file
    case(
        "optimizer-state-device",
        "train.py",
        {"train.py": LOAD_THEN_HELPER_MOVE, "utils.py": TO_DEVICE.format(body="return model.to(device)")},
        {
            "train.py": LOAD_THEN_HELPER_MOVE,
            "utils.py": TO_DEVICE.format(body='print(f"{model} on {device}")\n    return model'),
        },
        8,
        message="(it moves `model`)",
    ),
]


@pytest.mark.parametrize("rule, target, bug, control, line, extra", ENGINE_CASES)
def test_planted_fact_engine_bug_is_found_and_its_look_alike_is_quiet(
    tmp_path, rule, target, bug, control, line, extra
):
    test_planted_bug_is_found_and_its_look_alike_is_quiet(tmp_path, rule, target, bug, control, line, extra)
