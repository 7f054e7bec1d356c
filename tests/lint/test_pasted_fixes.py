"""Fixes that name the exact line and change: pasting the proposed code over the reported line silences the
finding (the examples contract in tests/test_pitfalls.py covers each pitfall's own Bad example; these are
other shapes of the same mistakes)."""

import textwrap

import pytest

LOOP = """
import torch
from torch import nn

model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
{init}
for x, y in [(torch.randn(2, 4), torch.randn(2, 1))] * 3:
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    {keep}
"""


def _paste(code: str, finding) -> str:
    """The file with the fix's code pasted over the reported line (at its indentation)."""
    lines = code.splitlines()
    line = lines[finding.location.line - 1]
    indent = line[: len(line) - len(line.lstrip())]
    lines[finding.location.line - 1 : finding.location.line] = [indent + c for c in finding.fix.code.splitlines()]
    return "\n".join(lines) + "\n"


@pytest.mark.rule("graph-retention-leak")
@pytest.mark.parametrize(
    "init, keep, pasted",
    [
        ("history = []", "history.append(loss)", "history.append(loss.detach())"),
        ("total = 0.0", "total += loss", "total += loss.item()"),
        ("total = 0.0", "total = total + 2 * loss", "total = total + 2 * loss.item()"),
    ],
)
def test_graph_retention_leak_fix_is_the_reported_line_detached(lint, fired, init, keep, pasted):
    code = textwrap.dedent(LOOP).format(init=init, keep=keep)
    [finding] = fired(lint(code), "graph-retention-leak")
    assert finding.fix.code == pasted
    fixed = _paste(code, finding)
    assert fired(lint(fixed), "graph-retention-leak") == []
    exec(compile(fixed, "train.py", "exec"), {})  # and it runs: no TypeError from `list += float`


@pytest.mark.rule("clip-before-unscale")
def test_clip_before_unscale_fix_names_the_scaler_and_optimizer(lint, fired):
    code = textwrap.dedent("""
        import torch
        from torch import nn

        def train(model, opt, amp, loader):
            for x, y in loader:
                opt.zero_grad()
                amp.scale(nn.functional.mse_loss(model(x), y)).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                amp.step(opt)
                amp.update()
    """)
    [finding] = fired(lint(code), "clip-before-unscale")
    assert finding.fix.code == "amp.unscale_(opt)" and "before line 9" in finding.fix.title
    lines = code.splitlines()
    lines.insert(8, "        amp.unscale_(opt)")
    assert fired(lint("\n".join(lines)), "clip-before-unscale") == []
