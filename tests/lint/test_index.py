"""The module index: what one pass over a module's `ast` records, and the questions it answers."""

import ast
import textwrap

from torchdoctor.lint.index import build_index

SOURCE = textwrap.dedent(
    """
    def train(model, opt, loader):
        for x, y in loader:
            opt.zero_grad()
            loss = model(x).sum()
            loss.backward()
            opt.step()
            opt.zero_grad().real  # (no real call: a second zero_grad on another line)
            sched.step()
    """
)


def _train():
    return build_index(ast.parse(SOURCE)).functions["train"][0]


def test_calls_named_answers_as_a_pass_over_every_call_would():
    scope = _train()
    for names in [("step",), ("zero_grad",), ("backward",), ("zero_grad", "step"), ("step", "nothing"), ("nothing",)]:
        expected = [c for c in scope.calls if c.attr in names]
        assert list(scope.calls_named(*names)) == expected
    assert [c.pos[0] for c in scope.calls_named("zero_grad", "step")] == [4, 7, 8, 9]
    assert [c.receiver for c in scope.calls_named("step")] == ["opt", "sched"]
    assert scope.calls_named() == ()


def test_a_whole_expression_statement_is_a_discarded_call():
    scope = _train()
    discarded = {c.attr: c.discarded for c in scope.calls if c.pos[0] in (4, 5, 9)}
    assert discarded == {"zero_grad": True, "model": False, "sum": False, "step": True}
