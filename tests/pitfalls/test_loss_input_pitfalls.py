"""softmax-before-cross-entropy (TD320), sigmoid-before-bce-with-logits (TD321), loss-shape-broadcast (TD322):
the Bad examples learn visibly worse than the Good ones and are flagged; the must-NOT cases stay quiet."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from pitfall_training import train
from torch import nn

import torchdoctor
from torchdoctor import registry

SOFTMAX = registry.get("softmax-before-cross-entropy")
SIGMOID = registry.get("sigmoid-before-bce-with-logits")
BROADCAST = registry.get("loss-shape-broadcast")


def _ce(ns):
    with torch.no_grad():
        out = ns["model"](ns["x_all"])
    return F.cross_entropy(out, ns["y_all"]).item()


def _bce(ns):
    with torch.no_grad():
        out = ns["model"](ns["x_all"])
    return F.binary_cross_entropy_with_logits(out, ns["y_all"]).item()


def _mse(ns):
    with torch.no_grad():
        out = ns["model"](ns["x_all"]).squeeze(-1)
    return F.mse_loss(out, ns["y_all"]).item()


@pytest.mark.parametrize(
    ("pitfall", "score", "factor"),
    [(SOFTMAX, _ce, 1.5), (SIGMOID, _bce, 2), (BROADCAST, _mse, 10)],
    ids=lambda v: getattr(v, "name", ""),
)
def test_bad_example_learns_worse_and_is_flagged(pitfall, score, factor):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own broadcast UserWarning
        bad_found, bad = train(pitfall, pitfall.bad, 10, score)
        good_found, good = train(pitfall, pitfall.good, 10, score)
    assert bad > factor * good, (bad, good)  # the example's model really ends worse
    assert [f.code for f in bad_found] == [pitfall.code] and good_found == []
    assert bad_found[0].location.file == "<example>" and bad_found[0].location.line == 4  # the loss line


def _losses(pitfall, body, model=None):
    """Run `body(model)` a few times under watch (every=1) with only `pitfall` enabled; its findings."""
    model = model or nn.Linear(6, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torchdoctor.watch(
            model, opt, checks=[pitfall.name], every=1, on_finding=lambda f: None, report=False
        ) as s:
            for _ in range(3):
                opt.zero_grad()
                body(model).backward()
                opt.step()
    return s.findings


X, Y = torch.randn(8, 6), torch.randint(0, 4, (8,))


def test_softmax_fires_on_softmax_layers_nll_loss_and_bare_probabilities():
    seq = nn.Sequential(nn.Linear(6, 4), nn.Softmax(dim=1))
    cases = [
        (lambda m: nn.CrossEntropyLoss()(m(X), Y), seq),  # nn.Softmax at the end
        (lambda m: F.nll_loss(F.softmax(m(X), dim=1), Y), None),  # nll_loss wants log-probs
        (lambda m: m(X).sum() * 0 + F.cross_entropy(torch.softmax(m(X).detach(), 1), Y), None),  # values only
        (lambda m: F.cross_entropy(F.softmax(m(X).view(2, 4, 4), dim=1).reshape(2, 4, 4), Y.view(2, 4)), None),
    ]
    for body, model in cases:
        [f] = _losses(SOFTMAX, body, model)
        assert f.code == "TD320"
    [f] = _losses(SOFTMAX, cases[1][0])
    assert "nll_loss" in f.message and "log_softmax" in f.fix.code


def test_softmax_quiet_on_log_probabilities_soft_targets_distillation_and_attention():
    teacher = nn.Linear(6, 4)
    attention = nn.MultiheadAttention(4, 2, batch_first=True)

    def attend(m):
        h = m(X).unsqueeze(0)
        return F.cross_entropy(attention(h, h, h)[0].squeeze(0), Y)

    cases = [
        lambda m: F.nll_loss(F.log_softmax(m(X), dim=1), Y),
        lambda m: F.cross_entropy(F.log_softmax(m(X), dim=1), Y),
        lambda m: F.nll_loss(torch.log(F.softmax(m(X), dim=1)), Y),
        lambda m: F.cross_entropy(m(X), F.softmax(torch.randn(8, 4), dim=1)),  # probability targets
        lambda m: nn.CrossEntropyLoss(label_smoothing=0.1)(m(X), Y),
        lambda m: (
            F.kl_div(F.log_softmax(m(X), 1), F.softmax(teacher(X).detach(), 1), reduction="batchmean")
            + F.cross_entropy(m(X), Y)
        ),  # distillation
        attend,  # attention softmax
    ]
    for body in cases:
        assert _losses(SOFTMAX, body) == []


def test_sigmoid_fires_on_sigmoid_layers_and_quiet_on_bce_and_logits():
    target = torch.randint(0, 2, (8, 4)).float()
    seq = nn.Sequential(nn.Linear(6, 4), nn.Sigmoid())
    [f] = _losses(SIGMOID, lambda m: nn.BCEWithLogitsLoss()(m(X), target), seq)
    assert f.code == "TD321"
    [f] = _losses(SIGMOID, lambda m: F.binary_cross_entropy_with_logits(m(X).sigmoid().flatten(), target.flatten()))
    quiet = [
        lambda m: nn.BCELoss()(torch.sigmoid(m(X)), target),
        lambda m: nn.BCEWithLogitsLoss()(m(X), target),
        lambda m: nn.BCEWithLogitsLoss()(m(X).clamp(0, 1), target),  # logits that happen to lie in [0, 1]
    ]
    for body in quiet:
        assert _losses(SIGMOID, body) == []


# (input, target, fires): shapes from torch's broadcast UserWarning as reported in public issue threads
REAL_SHAPES = [
    ((32,), (32, 1), True),  # deepset-ai/FARM#229: a squeezed regression head
    ((2, 1, 256, 256), (2, 256, 256), True),  # jiwei0921/CoNet#3: depth target without its channel axis
    ((66, 3, 1), (66,), True),  # jiaqingxie/DeepProtein#1
    ((1, 18), (8, 18), True),  # weka511/hpa-scc#38: one prediction row against a batch of 8
    ((1, 128), (128,), False),  # yandexdataschool/nlp_course#110: the same values, harmless
    ((64, 80, 8, 3), (64, 1, 8, 3), False),  # hustvl/DiffusionDriveV2#29: 80 trajectory modes against one target
]


@pytest.mark.parametrize(("shape", "target", "fires"), REAL_SHAPES)
def test_broadcast_on_shapes_reported_in_public_issues(shape, target, fires):
    def body(m):
        pred = m(X).sum() * 0 + torch.zeros(shape)
        return F.mse_loss(pred, torch.zeros(target))

    assert [f.code for f in _losses(BROADCAST, body)] == (["TD322"] if fires else [])


def test_broadcast_fires_on_mismatched_regression_shapes_and_quiet_otherwise():
    y = torch.randn(8)
    fires = [
        lambda m: F.l1_loss(m(X)[:, :1], y),
        lambda m: nn.HuberLoss()(m(X)[:, 0], y.unsqueeze(1)),
        lambda m: nn.SmoothL1Loss()(m(X)[:, :1], y),
    ]
    for body in fires:
        [f] = _losses(BROADCAST, body)
        assert f.code == "TD322" and "[8, 8]" in f.message
    quiet = [
        lambda m: F.mse_loss(m(X)[:, 0], y),  # equal shapes
        lambda m: F.mse_loss(m(X), torch.zeros(())),  # a scalar target only expands
        lambda m: F.mse_loss(m(X), torch.zeros(4)),  # [C] against [N, C]: same mean
        lambda m: (F.mse_loss(m(X)[:, :1], y, reduction="none") * torch.eye(8)).sum(),  # explicit broadcasting
    ]
    for body in quiet:
        assert _losses(BROADCAST, body) == []


def test_the_loss_tap_holds_nothing_and_goes_away():
    import gc
    import weakref

    original = F.cross_entropy
    model = nn.Linear(6, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchdoctor.watch(model, opt, every=1, on_finding=lambda f: None, report=False):
        assert F.cross_entropy is not original
        probs = torch.softmax(model(X), dim=1)
        ref = weakref.ref(probs)
        F.cross_entropy(probs, Y).backward()
        opt.step()
        del probs
        gc.collect()
        assert ref() is None  # nothing of the call was kept
    assert F.cross_entropy is original


SCRIPT = """
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
net, head = nn.Linear(6, 4), nn.Linear(6, 1)
opt = torch.optim.SGD([*net.parameters(), *head.parameters()], lr=0.1)
xb, yb, zb = torch.randn(8, 6), torch.randint(0, 4, (8,)), torch.randn(8)
crit = nn.CrossEntropyLoss()
for _ in range(2):
    opt.zero_grad()
    out = net(xb)
    a = crit(out.softmax(dim=1), yb)  # café
    b = F.nll_loss(torch.softmax(out, 1), yb)
    c = F.binary_cross_entropy_with_logits(torch.sigmoid(head(xb)).squeeze(1), zb.sigmoid())
    d = nn.MSELoss()(head(xb), zb)
    (a + b + c + d).backward()
    opt.step()
"""


def test_runtime_fixes_rewrite_the_users_own_line(tmp_path):
    import runpy

    script = tmp_path / "train.py"
    script.write_text(SCRIPT, encoding="utf-8")
    model = nn.Linear(1, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torchdoctor.watch(
            model, every=1, on_finding=lambda f: None, report=False, checks=[SOFTMAX.name, SIGMOID.name, BROADCAST.name]
        ) as s:
            runpy.run_path(str(script))
    fixes = {f.location.line: f.fix.code for f in s.findings}
    assert fixes == {
        14: "a = crit(out, yb)  # café",
        15: "b = F.nll_loss(torch.log_softmax(out, 1), yb)",
        16: "c = F.binary_cross_entropy_with_logits(head(xb).squeeze(1), zb.sigmoid())",
        17: "d = nn.MSELoss()(head(xb).squeeze(-1), zb)",
    }
