"""Planted bugs that cross a function or a file, each beside a look-alike that must stay quiet.

Every case writes a small project (with a pyproject.toml marking its root) and lints ONE file of it, as an
editor or pre-commit would: the program model reads the rest of the project from disk.
"""

import sys
import textwrap

import pytest
from conftest import ENGINE_CHECKS, asked_rules

from torchdoctor.lint.runner import lint_paths

CHECKS = ENGINE_CHECKS


@pytest.fixture(autouse=True)
def _only_the_rules_asked(request, monkeypatch):
    """`lint_one` runs the rules the test names (@pytest.mark.rule), or every rule for engine tests that lint
    through lint_paths themselves."""
    if request.node.get_closest_marker("rule") is not None:
        monkeypatch.setattr(sys.modules[__name__], "CHECKS", asked_rules(request))


def lint_one(tmp_path, files, target):
    """Write `files` under a project root and lint only `target`: the names of the findings there."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n", encoding="utf-8")
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    result = lint_paths([str(tmp_path / target)], CHECKS, cwd=str(tmp_path), jobs=1)
    return sorted((f.name, f.location.line) for f in result.findings if f.severity.name != "INFO")


EVALUATE = """
import torch

def evaluate(model, loader):
    model.eval()
    correct = 0
    for x, y in loader:
        correct += (model(x).argmax(1) == y).sum().item()
    return correct
"""


@pytest.mark.rule("eval-without-no-grad")
@pytest.mark.parametrize(
    "caller, expected",
    [
        ("from evaluation import evaluate\nacc = evaluate(model, val_loader)\n", [("eval-without-no-grad", 8)]),
        ("from evaluation import evaluate\nwith torch.no_grad():\n    acc = evaluate(model, val_loader)\n", []),
        ("import evaluation as ev\nacc = ev.evaluate(model, val_loader)\n", [("eval-without-no-grad", 8)]),
        (
            "from .evaluation import evaluate\n@torch.no_grad()\ndef run():\n    return evaluate(model, val_loader)\n",
            [],
        ),
        ("x = 1\n", []),  # never called: whoever calls it may disable grad
    ],
)
def test_an_eval_function_is_judged_by_its_callers_in_other_files(tmp_path, caller, expected):
    files = {"pkg/__init__.py": "", "pkg/evaluation.py": EVALUATE, "pkg/train.py": "import torch\n" + caller}
    assert lint_one(tmp_path, files, "pkg/evaluation.py") == expected


@pytest.mark.rule("eval-without-no-grad")
def test_a_common_name_in_another_file_does_not_silence_the_bug(tmp_path):
    # pytorch/examples' language_translation: a `validate` elsewhere (under no_grad) is another function
    train = EVALUATE.replace("evaluate", "validate") + "\nacc = validate(model, val_loader)\n"
    other = "import torch\ndef validate(m, l):\n    return 0\nwith torch.no_grad():\n    validate(1, 2)\n"
    assert lint_one(tmp_path, {"train.py": train, "other.py": other}, "train.py") == [("eval-without-no-grad", 8)]


WRAPPER = """
import torch

def smart_inference_mode(torch_1_9=True):
    def decorate(fn):
        return (torch.inference_mode if torch_1_9 else torch.no_grad)()(fn)
    return decorate
"""
NOT_A_WRAPPER = """
import functools

def timed():
    def decorate(fn):
        return functools.wraps(fn)(fn)
    return decorate
"""


@pytest.mark.rule("eval-without-no-grad")
@pytest.mark.parametrize("utils, expected", [(WRAPPER, []), (NOT_A_WRAPPER, [("eval-without-no-grad", 10)])])
def test_a_project_decorator_wrapping_no_grad_is_seen_from_a_single_file_run(tmp_path, utils, expected):
    name = "smart_inference_mode" if utils is WRAPPER else "timed"
    val = (
        f"import torch\nfrom utils.torch_utils import {name}\n\n@{name}()"
        + EVALUATE.replace("import torch\n", "")
        + "\nacc = evaluate(model, val_loader)\n"
    )
    files = {"utils/__init__.py": "", "utils/torch_utils.py": utils, "val.py": val}
    assert lint_one(tmp_path, files, "val.py") == expected


CLOSURE = """
import torch

def validate(val_loader, model):
    def run_validate(loader):
        for images, target in loader:
            output = model(images)
    model.eval()
    run_validate(val_loader)

validate(val_loader, model)
"""


@pytest.mark.rule("eval-without-no-grad")
def test_a_nested_closure_running_the_model_fires_at_its_call(tmp_path):
    assert lint_one(tmp_path, {"main.py": CLOSURE}, "main.py") == [("eval-without-no-grad", 9)]
    quiet = CLOSURE.replace("        for images", "        with torch.no_grad():\n         for images")
    assert lint_one(tmp_path, {"main.py": quiet}, "main.py") == []


HELPER = """
import torch

def predict(net, x):
    return net(x).argmax(1)
"""


@pytest.mark.rule("eval-without-no-grad")
@pytest.mark.parametrize("decorator, expected", [("", [("eval-without-no-grad", 6)]), ("@torch.no_grad()\n", [])])
def test_a_model_passed_to_a_helper_in_another_file(tmp_path, decorator, expected):
    script = (
        "from helpers import predict\n\ndef show(model, x):\n    model.eval()\n    print('eval')\n"
        "    return predict(model, x)\n\nshow(model, x)\n"
    )
    files = {"helpers.py": HELPER.replace("def predict", decorator + "def predict"), "show.py": script}
    assert lint_one(tmp_path, files, "show.py") == expected


DDP = """
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
{imports}

class Trainer:
    def fit(self, dataset, epochs):
        sampler = DistributedSampler(dataset)
        loader = DataLoader(dataset, sampler=sampler)
        for epoch in range(epochs):
            {call}
            for batch in loader:
                self.step(batch)

    def begin(self, loader, epoch):
        {body}
"""


@pytest.mark.rule("sampler-epoch-not-set")
@pytest.mark.parametrize(
    "imports, call, body, fires",
    [
        ("from .hooks import start_epoch", "start_epoch(loader, epoch)", "pass", False),  # relative import
        ("from .hooks import start_epoch", "start_epoch(loader, 0)", "pass", False),
        ("from . import hooks", "hooks.start_epoch(loader, epoch)", "pass", False),
        ("", "self.begin(loader, epoch)", "loader.sampler.set_epoch(epoch)", False),  # a method of the same class
        ("from .hooks import log_epoch", "log_epoch(loader, epoch)", "pass", True),  # the helper does not set it
        ("", "self.begin(loader, epoch)", "print(epoch)", True),
    ],
)
def test_set_epoch_is_looked_for_in_the_functions_the_epoch_loop_calls(tmp_path, imports, call, body, fires):
    hooks = (
        "def start_epoch(loader, epoch):\n    loader.sampler.set_epoch(epoch)\n\ndef log_epoch(loader, epoch):\n"
        "    print(epoch)\n"
    )
    files = {
        "pkg/__init__.py": "",
        "pkg/hooks.py": hooks,
        "pkg/train.py": DDP.format(imports=imports, call=call, body=body),
    }
    assert lint_one(tmp_path, files, "pkg/train.py") == ([("sampler-epoch-not-set", 8)] if fires else [])


TRAIN_ARGS = """
import argparse
from utils import init_distributed

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=0)
args, _ = parser.{parse}()
"""


@pytest.mark.rule("local-rank-argument")
@pytest.mark.parametrize(
    "parse, utils, fires",
    [
        (
            "parse_known_args",
            "import os\nLOCAL = int(os.environ.get('LOCAL_RANK', 0))\ndef init_distributed():\n    pass\n",
            False,
        ),
        (
            "parse_args",
            "import os\nLOCAL = int(os.environ.get('LOCAL_RANK', 0))\ndef init_distributed():\n    pass\n",
            True,
        ),
        ("parse_known_args", "def init_distributed():\n    pass  # LOCAL_RANK in a comment only\n", True),
    ],
)
def test_local_rank_argument_with_the_rank_read_in_an_imported_module(tmp_path, parse, utils, fires):
    files = {"utils.py": utils, "train.py": TRAIN_ARGS.format(parse=parse)}
    assert lint_one(tmp_path, files, "train.py") == ([("local-rank-argument", 6)] if fires else [])


@pytest.mark.rule("eval-without-no-grad")
def test_the_same_findings_whether_the_tree_or_each_file_alone_is_linted(tmp_path):
    files = {
        "pkg/__init__.py": "",
        "pkg/evaluation.py": EVALUATE,
        "utils/__init__.py": "",
        "utils/torch_utils.py": WRAPPER,
        "pkg/train.py": "from .evaluation import evaluate\nevaluate(m, l)\n",
        "val.py": "import torch\nfrom utils.torch_utils import smart_inference_mode\n\n@smart_inference_mode()"
        + EVALUATE.replace("import torch\n", "")
        + "\nevaluate(m, l)\n",
    }
    lint_one(tmp_path, files, "val.py")
    tree = lint_paths([str(tmp_path)], CHECKS, cwd=str(tmp_path), jobs=1).findings
    alone = [
        f for name in files for f in lint_paths([str(tmp_path / name)], CHECKS, cwd=str(tmp_path), jobs=1).findings
    ]
    key = lambda f: (f.location.file, f.location.line, f.name)  # noqa: E731
    assert sorted(map(key, tree)) == sorted(map(key, alone)) == [("pkg/evaluation.py", 8, "eval-without-no-grad")]


# --- order, branches and data flow inside one function ---------------------------------------------------


@pytest.mark.rule("missing-zero-grad")
def test_optimizers_that_may_share_parameters_are_cleared_by_either_zero_grad(tmp_path):
    shared = """
    class M(LightningModule):
        def training_step(self, batch, batch_idx):
            opt_a, opt_b = self.optimizers()
            self.manual_backward(self(batch).sum())
            opt_a.step()
            self.manual_backward(self(batch).sum())
            opt_b.step()
            opt_b.zero_grad()
    """
    assert lint_one(tmp_path, {"m.py": shared}, "m.py") == []
    gan = """
    opt_g = torch.optim.Adam(generator.parameters())
    opt_d = torch.optim.Adam(discriminator.parameters())
    for x in loader:
        opt_d.zero_grad()
        discriminator(x).mean().backward()
        opt_d.step()
        generator(x).mean().backward()
        opt_g.step()
    """
    assert lint_one(tmp_path, {"gan.py": gan}, "gan.py") == [("missing-zero-grad", 9)]


@pytest.mark.rule("stale-optimizer-params")
def test_a_model_rebound_in_the_other_branch_is_not_stale(tmp_path):
    code = """
    import torch
    if pretrained:
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    else:
        model = torch.nn.Linear(4, 3)
    optimizer.step()
    """
    assert lint_one(tmp_path, {"t.py": code}, "t.py") == []
    sequential = code.replace("    else:\n", "    if resume:\n")
    assert lint_one(tmp_path, {"t.py": sequential}, "t.py") == [("stale-optimizer-params", 7)]


@pytest.mark.rule("graph-retention-leak")
def test_an_input_batch_kept_is_not_a_graph_leak_but_the_loss_is(tmp_path):
    code = """
    class M(LightningModule):
        def training_step(self, batch, batch_idx):
            self.seen.append(batch)
            loss = self.step(batch)
            self.losses.append(loss)
            return loss
    """
    assert lint_one(tmp_path, {"m.py": code}, "m.py") == [("graph-retention-leak", 6)]


@pytest.mark.rule("nondeterministic-settings")
def test_determinism_switched_off_before_benchmark_is_quiet(tmp_path):
    code = """
    import torch
    torch.use_deterministic_algorithms(True)
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark = True
    """
    assert lint_one(tmp_path, {"t.py": code}, "t.py") == []
    on = code.replace("    torch.use_deterministic_algorithms(False)\n", "")
    assert lint_one(tmp_path, {"t.py": on}, "t.py") == [("nondeterministic-settings", 4)]


@pytest.mark.rule("to-result-discarded")
def test_a_whole_enumerated_batch_may_move_in_place_but_its_tensors_do_not(tmp_path):
    code = """
    for step, batch in enumerate(train_dataloader):
        batch.to(device)
    for step, (x, y) in enumerate(train_loader):
        x.to(device)
    """
    assert lint_one(tmp_path, {"t.py": code}, "t.py") == [("to-result-discarded", 5)]


@pytest.mark.rule("prefix-strip-by-slicing")
@pytest.mark.parametrize(
    "code, fires",
    [
        ("sd = torch.load('m.pt')\nfor k, v in list(sd.items()):\n    sd[k[7:]] = sd.pop(k)\n", True),
        ("prefix = 'module.'\nnew = {k[len(prefix):]: v for k, v in state_dict.items()}\n", True),
        (
            "prefix = 'module.'\nnew = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}\n",
            False,
        ),
        ("prefix = 'module.'\nprefix = other\nnew = {k[len(prefix):]: v for k, v in state_dict.items()}\n", False),
    ],
)
def test_prefix_cut_through_a_copy_of_the_items_or_a_named_prefix(tmp_path, code, fires):
    found = lint_one(tmp_path, {"t.py": "import torch\n" + code}, "t.py")
    assert [name for name, _ in found] == (["prefix-strip-by-slicing"] if fires else [])


@pytest.mark.rule("shuffle-with-sampler")
@pytest.mark.parametrize(
    "args, fires",
    [
        ("ds, 32, True, sampler", True),
        ("ds, 32, True, batch_sampler=bs", True),
        ("ds, 32, False, sampler", False),
        ("ds, 32, True", False),
    ],
)
def test_shuffle_and_sampler_passed_by_position(tmp_path, args, fires):
    code = f"from torch.utils.data import DataLoader\nsampler = bs = object()\ntrain_data = DataLoader({args})\n"
    found = lint_one(tmp_path, {"t.py": code}, "t.py")
    assert found == ([("shuffle-with-sampler", 3)] if fires else [])


@pytest.mark.rule("graph-retention-leak")
@pytest.mark.parametrize(
    "line, fires",
    [
        ("total_loss = total_loss + loss", True),
        ("total_loss = loss + total_loss", True),
        ("total_loss = total_loss + loss.item()", False),
        ("total_loss = previous + loss", False),  # not an accumulation
    ],
)
def test_accumulating_a_loss_by_plain_assignment(tmp_path, line, fires):
    code = f"""
    total_loss = 0
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        {line}
    """
    assert lint_one(tmp_path, {"t.py": code}, "t.py") == ([("graph-retention-leak", 8)] if fires else [])


BUILD = """
import torch

def make_optimizer(cfg, model):
    params = [p for p in model.parameters() if p.requires_grad]
    solver = torch.optim.SGD(params, lr=cfg.lr)
    return solver
"""


@pytest.mark.rule("missing-zero-grad")
@pytest.mark.parametrize("clear, expected", [("", [("missing-zero-grad", 8)]), ("        solver.zero_grad()\n", [])])
def test_an_optimizer_built_by_a_helper_in_another_file(tmp_path, clear, expected):
    train = (
        "from solver import make_optimizer\n\ndef train(cfg, model, loader):\n"
        "    solver = make_optimizer(cfg, model)\n    for x, y in loader:\n"
        + clear
        + "        loss = model(x, y)\n        loss.backward()\n        solver.step()\n"
    )
    assert lint_one(tmp_path, {"solver.py": BUILD, "train.py": train}, "train.py") == expected


STEP = """
def train_step(model, batch, optimizer):
    loss = model(*batch)
    loss.backward()
    optimizer.step()
    {clear}
    return loss.item()
"""


@pytest.mark.rule("missing-zero-grad")
@pytest.mark.parametrize("clear, expected", [("", [("missing-zero-grad", 6)]), ("optimizer.zero_grad()", [])])
def test_backward_and_step_inside_a_helper_in_another_file(tmp_path, clear, expected):
    train = (
        "import torch\nfrom engine import train_step\n\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for batch in loader:\n    train_step(model, batch, opt)\n"
    )
    assert lint_one(tmp_path, {"engine.py": STEP.format(clear=clear), "train.py": train}, "train.py") == expected


@pytest.mark.rule("missing-zero-grad")
@pytest.mark.parametrize("clear", ["", "optimizer.zero_grad()"])
def test_backward_and_step_in_a_helper_reached_through_a_module_or_a_method(tmp_path, clear):
    through_module = (
        "import torch\nimport engine\n\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for batch in loader:\n    engine.train_step(model, batch, opt)\n"
    )
    method = textwrap.indent(textwrap.dedent(STEP.format(clear=clear)).replace("(model,", "(self, model,"), "    ")
    through_method = (
        f"import torch\n\nclass Trainer:\n{method}\n    def fit(self, model, loader):\n"
        "        for batch in loader:\n            self.train_step(model, batch, self.opt)\n"
    )
    expected = [] if clear else [("missing-zero-grad", 6)]
    assert (
        lint_one(tmp_path, {"engine.py": STEP.format(clear=clear), "train.py": through_module}, "train.py") == expected
    )
    assert lint_one(tmp_path, {"trainer.py": through_method}, "trainer.py") == (
        [] if clear else [("missing-zero-grad", 14)]
    )


@pytest.mark.rule("missing-zero-grad")
def test_a_loss_scaler_object_running_backward_and_step(tmp_path):
    code = """
    import torch

    class NativeScaler:
        def __init__(self):
            self._scaler = torch.amp.GradScaler()

        def __call__(self, loss, optimizer):
            self._scaler.scale(loss).backward()
            self._scaler.step(optimizer)
            self._scaler.update()

    def train(model, loader, optimizer):
        loss_scaler = NativeScaler()
        for x, y in loader:
            loss = model(x, y)
            loss_scaler(loss, optimizer)
    """
    assert lint_one(tmp_path, {"t.py": code}, "t.py") == [("missing-zero-grad", 17)]
    cleared = code.replace(
        "            loss = model(x, y)", "            optimizer.zero_grad()\n            loss = model(x, y)"
    )
    assert lint_one(tmp_path, {"t.py": cleared}, "t.py") == []


@pytest.mark.rule("to-result-discarded")
@pytest.mark.parametrize(
    "source, fires",
    [
        ("train_data = DataLoader(ds, batch_size=8)\nfor x, y in train_data:\n    x.to(device)\n", True),
        ("batches = DataLoader(ds)\nfor i, (x, y) in enumerate(batches):\n    y.cuda()\n", True),
        ("train_data = make_batches(ds)\nfor x, y in train_data:\n    x.to(device)\n", False),  # unknown objects
    ],
)
def test_a_loader_not_named_loader(tmp_path, source, fires):
    code = "from torch.utils.data import DataLoader\n" + source
    assert lint_one(tmp_path, {"t.py": code}, "t.py") == ([("to-result-discarded", 4)] if fires else [])


def test_a_run_over_several_projects_frees_each_and_finds_what_single_file_runs_find(tmp_path):
    # Each project's trees are freed when the run moves on to the next project; a later file asking about a
    # freed module (the run comes back to project a) has it parsed again, with the same answers.
    train = (
        "import torch\nfrom engine import train_step\n\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for batch in loader:\n    train_step(model, batch, opt)\n"
    )
    evaluation = EVALUATE + "\nacc = evaluate(model, val_loader)\n"
    for project in ("a", "b"):
        (tmp_path / project).mkdir()
        (tmp_path / project / "pyproject.toml").write_text("[project]\nname = 'demo'\n", encoding="utf-8")
        for name, text in {"engine.py": STEP.format(clear=""), "train.py": train, "evaluation.py": evaluation}.items():
            (tmp_path / project / name).write_text(textwrap.dedent(text), encoding="utf-8")
    order = ["a/train.py", "b/train.py", "b/evaluation.py", "a/evaluation.py", "a/engine.py"]
    together = lint_paths([str(tmp_path / name) for name in order], CHECKS, cwd=str(tmp_path), jobs=1).findings
    alone = [
        f for name in order for f in lint_paths([str(tmp_path / name)], CHECKS, cwd=str(tmp_path), jobs=1).findings
    ]
    key = lambda f: (f.location.file, f.location.line, f.name)  # noqa: E731
    assert (
        sorted(map(key, together))
        == sorted(map(key, alone))
        == [
            ("a/evaluation.py", 8, "eval-without-no-grad"),
            ("a/train.py", 6, "missing-zero-grad"),
            ("b/evaluation.py", 8, "eval-without-no-grad"),
            ("b/train.py", 6, "missing-zero-grad"),
        ]
    )


def test_releasing_a_project_forgets_its_modules_and_keeps_the_others(tmp_path):
    from torchdoctor.lint.facts import Fact
    from torchdoctor.lint.program import Program

    for project in ("a", "ab"):  # `ab` shares a's name as a prefix, not its folder
        (tmp_path / project).mkdir()
        (tmp_path / project / "m.py").write_text("def f():\n    return 1\n", encoding="utf-8")
    program = Program()
    a, ab = (program.module(str(tmp_path / project / "m.py")) for project in ("a", "ab"))
    assert a is not None and ab is not None
    program.fact(a, a.functions["f"], Fact.any("returns-something", lambda fn: bool(fn.scope.returns)))
    program.release(str(tmp_path / "a"))
    assert program.parsed(a.path) is None and program.parsed(ab.path) is ab
    assert all(key[0] != a.path for key in program._facts)  # its facts are forgotten with it
    assert program.module(a.path) is not a  # parsed again on demand


@pytest.mark.rule("eval-without-no-grad", "missing-zero-grad")
def test_a_run_leaves_nothing_for_the_garbage_collector(tmp_path):
    # Summaries, modules and trees are freed by reference counting when the run ends (lint runs with the
    # collector off): a reference cycle would keep a whole project's syntax trees alive until a collection.
    import gc

    train = (
        "import torch\nfrom engine import train_step\nfrom evaluation import evaluate\n\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor batch in loader:\n"
        "    train_step(model, batch, opt)\nacc = evaluate(model, val_loader)\n"
    )
    files = {"engine.py": STEP.format(clear=""), "train.py": train, "evaluation.py": EVALUATE}
    gc.collect()
    assert lint_one(tmp_path, files, ".") == [("eval-without-no-grad", 8), ("missing-zero-grad", 7)]
    assert gc.collect() == 0


def test_the_project_root_is_found_as_ruff_finds_it(tmp_path):
    from torchdoctor.lint.program import find_root

    (tmp_path / ".git").mkdir()
    (tmp_path / "tools" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "inner").mkdir(parents=True)
    (tmp_path / "pkg" / "setup.py").write_text("", encoding="utf-8")
    assert find_root(str(tmp_path / "tools" / "sub")) == str(tmp_path)  # nearest marker upward: .git
    assert find_root(str(tmp_path / "pkg" / "inner")) == str(tmp_path / "pkg")  # setup.py is nearer


def test_a_progress_bar_only_for_long_runs_on_a_terminal(monkeypatch):
    from torchdoctor.lint import command

    monkeypatch.setattr(command.sys.stderr, "isatty", lambda: True, raising=False)
    with command._ProgressBar(True) as bar:
        bar.update(1, command.PROGRESS_MIN_FILES - 1)
        assert bar.bar is None  # a short run finishes before a bar helps
        bar.update(1, command.PROGRESS_MIN_FILES)
        assert bar.bar is not None
    monkeypatch.setattr(command.sys.stderr, "isatty", lambda: False, raising=False)
    with command._ProgressBar(True) as quiet:
        quiet.update(1, 10 * command.PROGRESS_MIN_FILES)
        assert quiet.bar is None  # piped output gets no bar


@pytest.mark.rule("eval-without-no-grad")
@pytest.mark.parametrize(
    "files, fires",
    [
        # through a package's re-export: the caller names the package, not the module defining `evaluate`
        ({"pkg/__init__.py": "from .evaluation import evaluate\n", "run.py": "from pkg import evaluate\n"}, True),
        ({"pkg/__init__.py": "from .evaluation import evaluate\n", "run.py": "from pkg import *\n"}, False),
        # through another module that imports it
        (
            {"pkg/__init__.py": "", "tools.py": "from pkg.evaluation import evaluate\n", "run.py": "import tools\n"},
            True,
        ),
        # an import this cannot read as a statement (on one line with `try:`): the file is searched all the same
        (
            {"pkg/__init__.py": "", "run.py": "try: from pkg.evaluation import evaluate\nexcept ImportError: pass\n"},
            True,
        ),
        # the same name, in a file that imports nothing of the project: another function
        ({"pkg/__init__.py": "", "run.py": "import torch\ndef evaluate(m, l):\n    return 0\n"}, False),
    ],
)
def test_callers_are_found_in_every_file_that_may_import_the_function(tmp_path, files, fires):
    # The callers search parses only the files that may import a project module (and the function's own):
    # whatever the path an import takes, a caller with grad on is found.
    call = "acc = evaluate(model, val_loader)\n" if "tools.py" not in files else "acc = tools.evaluate(model, loader)\n"
    files = {name: text + (call if name == "run.py" else "") for name, text in files.items()}
    files["pkg/evaluation.py"] = EVALUATE
    assert lint_one(tmp_path, files, "pkg/evaluation.py") == ([("eval-without-no-grad", 8)] if fires else [])


def test_the_callers_search_does_not_parse_files_that_import_nothing_of_the_project(tmp_path, monkeypatch):
    import torchdoctor.lint.program as program_model

    parsed = []
    real = program_model.parse_quietly
    monkeypatch.setattr(program_model, "parse_quietly", lambda data, path: parsed.append(path) or real(data, path))
    files = {f"script{i}.py": "import torch\nimport os\n" + EVALUATE + "\nacc = evaluate(m, l)\n" for i in range(3)}
    files["uses.py"] = "from script0 import evaluate\nacc = evaluate(m, l)\n"
    assert lint_one(tmp_path, files, "script1.py") == [("eval-without-no-grad", 10)]
    # script1 is parsed by the run itself, script0 to resolve uses.py's call; script2 is not read as Python
    assert sorted(p.rsplit("/", 1)[-1] for p in parsed) == ["script0.py", "uses.py"]
