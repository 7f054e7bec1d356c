"""Source detectors of softmax-before-cross-entropy (TD320) and sigmoid-before-bce-with-logits (TD321): the
activation written into the loss call, bound to a name, ending an nn.Sequential, or returned by a project
model's forward in another file; quiet on log_softmax, soft targets, distillation, attention and inference-only
activations."""

import pytest

SOFTMAX, SIGMOID = "softmax-before-cross-entropy", "sigmoid-before-bce-with-logits"
pytestmark = pytest.mark.rule(SOFTMAX, SIGMOID)

HEAD = """
import torch
import torch.nn.functional as F
from torch import nn
"""

MODELS = """
import torch
from torch import nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        out = self.fc(x)
        return F.softmax(out, dim=1)


class Gated(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 1)

    def forward(self, x):
        return torch.sigmoid(self.fc(x))


class Polite(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        logits = self.fc(x)
        if self.training:
            return logits
        return logits.softmax(dim=1)
"""


@pytest.mark.parametrize(
    "line",
    [
        "loss = F.cross_entropy(F.softmax(model(x), dim=1), y)",
        "loss = nn.CrossEntropyLoss()(model(x).softmax(1), y)",
        "loss = F.nll_loss(torch.softmax(model(x), 1), y)",
        "loss = criterion(nn.Softmax(dim=1)(model(x)), y)",
        "probs = F.softmax(model(x), dim=1); loss = criterion(probs, y)",
    ],
)
def test_softmax_in_the_loop_fires(lint, fired, line):
    code = (
        HEAD
        + f"""
model = nn.Linear(8, 4)
criterion = nn.CrossEntropyLoss()
for x, y in loader:
    {line}
    loss.backward()
"""
    )
    [f] = fired(lint(code), SOFTMAX)
    assert f.code == "TD320"


def test_fix_pastes_the_logits_in(lint, fired):
    code = (
        HEAD
        + "model = nn.Linear(8, 4)\nfor x, y in loader:\n    loss = F.cross_entropy(F.softmax(model(x), dim=1), y)\n"
    )
    [f] = fired(lint(code), SOFTMAX)
    assert f.fix.code == "loss = F.cross_entropy(model(x), y)"
    code = HEAD + "model = nn.Linear(8, 4)\nfor x, y in loader:\n    loss = F.nll_loss(F.softmax(model(x), dim=1), y)\n"
    [f] = fired(lint(code), SOFTMAX)
    assert f.fix.code == "loss = F.nll_loss(F.log_softmax(model(x), dim=1), y)"
    fixed = code.replace("F.nll_loss(F.softmax", "F.nll_loss(F.log_softmax")
    assert fired(lint(fixed), SOFTMAX) == []


def test_model_forward_in_another_file_and_sequential_fire(lint, fired):
    train = (
        HEAD
        + """
from models import Net, Gated

class Trainer:
    def __init__(self):
        self.model = Net().to("cpu")
        self.criterion = nn.CrossEntropyLoss()
        self.gate = Gated()

    def step(self, x, y):
        out = self.model(x)
        loss = self.criterion(out, y)
        bce = F.binary_cross_entropy_with_logits(self.gate(x), y.float())
        return loss + bce
"""
    )
    found = lint(train, others={"models.py": MODELS})
    [f] = fired(found, SOFTMAX)
    assert "models.py:" in f.message and f.location.line == 16
    [g] = fired(found, SIGMOID)
    assert g.location.line == 17
    seq = (
        HEAD
        + """
model = nn.Sequential(nn.Linear(8, 4), nn.Softmax(dim=1))
head = nn.Sequential(nn.Linear(8, 1), nn.Sigmoid())
for x, y in loader:
    loss = nn.CrossEntropyLoss()(model(x), y) + nn.BCEWithLogitsLoss()(head(x), y)
"""
    )
    assert len(fired(lint(seq), SOFTMAX)) == 1 and len(fired(lint(seq), SIGMOID)) == 1


def test_quiet_on_log_probabilities_targets_distillation_attention_and_inference_softmax(lint):
    code = (
        HEAD
        + """
from models import Polite

model = nn.Linear(8, 4)
teacher = nn.Linear(8, 4)
polite = Polite()
criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
for x, y in loader:
    a = F.nll_loss(F.log_softmax(model(x), dim=1), y)
    b = F.cross_entropy(F.log_softmax(model(x), dim=1), y)
    c = F.nll_loss(torch.log(F.softmax(model(x), dim=1)), y)
    d = F.cross_entropy(model(x), F.softmax(teacher(x), dim=1))                 # probability targets
    e = F.kl_div(F.log_softmax(model(x), 1), F.softmax(teacher(x), 1), reduction="batchmean")
    weights = torch.softmax(x @ x.T, dim=-1)                                  # attention
    f = criterion((weights @ model(x)), y)
    g = criterion(polite(x), y)                                               # softmax only at inference
    h = nn.BCELoss()(torch.sigmoid(model(x)), y.float())                     # sigmoid -> BCELoss is right
    probs = model(x).softmax(1)
    i = criterion(model(x), y)
    (a + b + c + d + e + f + g + h + i).backward()
"""
    )
    found = lint(code, others={"models.py": MODELS})
    assert [f for f in found if f.name in (SOFTMAX, SIGMOID)] == []


def test_closure_and_sliced_probabilities_fire(lint, fired):
    code = (
        HEAD
        + """
def experiment(n):
    criterion = nn.CrossEntropyLoss()

    def f_train(x, y):
        prob = F.softmax(net(x), dim=1)
        src_prob = prob[:n]
        return criterion(src_prob, y)
    return f_train
"""
    )
    [f] = fired(lint(code), SOFTMAX)
    assert "`src_prob`" in f.message


def test_loss_given_as_a_default_argument_and_rows_iterated_fire(lint, fired):
    # the shape of mlelarge/graph_neural_net's triplet_loss before its "remove the softmax" fix (PR #37)
    code = (
        HEAD
        + """
class TripletLoss(nn.Module):
    def __init__(self, loss=nn.CrossEntropyLoss(reduction='sum')):
        super().__init__()
        self.loss = loss

    def forward(self, raw_scores, target):
        total = 0
        outputs = torch.softmax(raw_scores, -1)
        for out in outputs:
            total = total + self.loss(out, target)
        for out, label in zip(outputs, target):
            total = total + self.loss(out, label)
        return total
"""
    )
    [f] = fired(lint(code), SOFTMAX)  # the zip loop unpacks pairs: not judged
    assert f.location.line == 15 and "`out`" in f.message
    fixed = code.replace("outputs = torch.softmax(raw_scores, -1)", "outputs = raw_scores")
    assert fired(lint(fixed), SOFTMAX) == []


def test_criterion_rebound_to_another_loss_is_not_judged(lint, fired):
    code = (
        HEAD
        + """
model = nn.Linear(8, 4)
criterion = nn.CrossEntropyLoss()
if soft:
    criterion = nn.KLDivLoss()
for x, y in loader:
    loss = criterion(F.softmax(model(x), 1), y)
"""
    )
    assert fired(lint(code), SOFTMAX) == []


def test_loss_through_an_aliased_class_and_an_attribute_fire(lint, fired):
    # how a loss call is spelt decides nothing: an aliased class, an attribute of an object
    code = (
        HEAD
        + """
from torch.nn import CrossEntropyLoss as CE, BCEWithLogitsLoss as BCE

model = nn.Linear(8, 4)
crit = CE()
trainer.bce = BCE()
for x, y in loader:
    a = crit(F.softmax(model(x), 1), y)
    b = trainer.bce(torch.sigmoid(model(x)), y)
    c = nn.CrossEntropyLoss()(F.softmax(model(x), 1), y)
    d = helper.crit(F.softmax(model(x), 1), y)
"""
    )
    found = lint(code)
    assert sorted(f.location.line for f in fired(found, SOFTMAX)) == [12, 14]
    assert [f.location.line for f in fired(found, SIGMOID)] == [13]
    # the same calls through names no binding sets to a loss class: only the inline construction is a loss
    quiet = lint(code.replace("crit = CE()", "crit = make()").replace("trainer.bce = BCE()", "trainer.bce = b"))
    assert [f.location.line for f in quiet if f.name in (SOFTMAX, SIGMOID)] == [14]


@pytest.mark.parametrize("default, fires", [("nn.CrossEntropyLoss()", True), ("nn.MSELoss()", False)])
def test_a_loss_given_as_a_parameter_default_is_a_loss_call(lint, fired, default, fires):
    # `self.criterion = criterion` where the parameter defaults to `nn.CrossEntropyLoss()`: calls through
    # `self.criterion` are loss calls (the function building the trainer calls no loss class itself).
    code = (
        HEAD
        + f"""
class Trainer:
    def __init__(self, model, criterion={default}):
        self.model = model
        self.criterion = criterion

    def step(self, x, y):
        return self.criterion(F.softmax(self.model(x), dim=1), y)
"""
    )
    assert len(fired(lint(code), SOFTMAX)) == (1 if fires else 0)
