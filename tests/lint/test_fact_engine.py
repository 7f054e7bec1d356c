"""The fact engine: facts declared here (by the test, as a rule would) are computed per function, followed through
calls only when asked, rebound to the caller's names, with path conditions; unknown calls add nothing."""

import ast
import textwrap

from torchdoctor.lint.facts import Effect, Fact, Function
from torchdoctor.lint.program import Program


def _touches(fn: Function) -> frozenset[Effect]:
    """A fact no rule has: the receivers of `.touch()`, under `% k` conditions."""
    return frozenset(
        Effect(call.receiver or "?", fn.condition(call.node, _periodic))
        for call in fn.scope.calls
        if call.attr == "touch"
    )


def _periodic(test: ast.expr) -> bool:
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in ast.walk(test))


TOUCHES = Fact.effects("touches", _touches, guard=_periodic)
PRINTS = Fact.any("prints", lambda fn: "print" in fn.scope.call_attrs)


def program_of(tmp_path, files):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n", encoding="utf-8")
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text), encoding="utf-8")
    program = Program()
    return program, {name: program.module(str(tmp_path / name)) for name in files}


HELPERS = """
def touch_it(thing):
    thing.touch()

def touch_own():
    mine = make()
    mine.touch()

def touch_global():
    REGISTRY.touch()

def sometimes(thing, i, k):
    if (i + 1) % k == 0:
        thing.touch()
    if thing is not None:  # not a condition the fact keeps
        thing.touch()

class Box:
    def clear(self):
        self.inner.touch()

def say():
    print("hi")
"""

MAIN = """
import somelib
from helpers import touch_it, touch_own, touch_global, sometimes, Box, say

def outer(a, b, i):
    box = Box()
    touch_it(a)
    touch_own()
    touch_global()
    somelib.touch_everything(b)
    box.clear()
    for step in range(10):
        if step % 4 == 0:
            sometimes(b, i, 2)

def quiet(a):
    return a

def chain(a):
    middle(a)

def middle(a):
    say()
"""


def test_effects_are_rebound_to_the_callers_names_with_their_conditions(tmp_path):
    program, modules = program_of(tmp_path, {"helpers.py": HELPERS, "main.py": MAIN})
    main = modules["main.py"]
    effects = program.fact(main, main.functions["outer"], TOUCHES)
    assert {(e.receiver, e.condition) for e in effects} == {
        ("a", ""),  # a parameter becomes the argument passed
        ("REGISTRY", ""),  # a free name is kept
        ("box.inner", ""),  # `self.inner` of `box.clear()`
        ("b", "step % 4 == 0 and (i + 1) % k == 0"),  # the call's condition, then the callee's
        ("b", "step % 4 == 0"),
    }  # `mine` (the callee's own object) is dropped; `somelib.touch_everything(b)` is unknown: nothing
    assert {e.via for e in effects if e.receiver == "a"} == {("touch_it",)}


def test_a_fact_is_followed_only_as_far_as_it_is_asked_and_cached_per_function(tmp_path):
    program, modules = program_of(tmp_path, {"helpers.py": HELPERS, "main.py": MAIN})
    main, helpers = modules["main.py"], modules["helpers.py"]
    assert program.fact(main, main.functions["chain"], PRINTS)  # two calls deep, into another file
    asked = {(path, fact.name) for path, _, fact in program._facts}
    assert asked == {(main.path, "prints"), (helpers.path, "prints")}
    assert not program.fact(main, main.functions["quiet"], PRINTS)
    assert (main.path, id(main.functions["outer"].node), TOUCHES) not in program._facts  # never asked
    calls = []
    counting = Fact.any("counted", lambda fn: calls.append(fn.name) or False)
    for _ in range(2):
        program.fact(main, main.functions["chain"], counting)
    assert sorted(calls) == ["chain", "middle", "say"]  # each function's predicate ran once


def test_recursion_and_depth_are_bounded(tmp_path):
    program, modules = program_of(
        tmp_path,
        {
            "m.py": """
            def ping(x):
                pong(x)

            def pong(x):
                ping(x)
                x.touch()

            def d1(x):
                d2(x)

            def d2(x):
                d3(x)

            def d3(x):
                d4(x)

            def d4(x):
                d5(x)

            def d5(x):
                x.touch()
            """
        },
    )
    m = modules["m.py"]
    assert {e.receiver for e in program.fact(m, m.functions["ping"], TOUCHES)} == {"x"}
    assert program.fact(m, m.functions["d1"], TOUCHES) == frozenset()  # four calls deep: past the bound (three)
    fresh = Program()  # d2 was first reached one call deep above, and keeps that answer for the run
    m = fresh.module(m.path)
    assert {e.receiver for e in fresh.fact(m, m.functions["d2"], TOUCHES)} == {"x"}


def test_a_predicate_that_fails_leaves_no_answer_behind(tmp_path):
    program, modules = program_of(tmp_path, {"m.py": "def f(x):\n    x.touch()\n"})
    m = modules["m.py"]
    calls = []

    def flaky(fn):
        calls.append(fn.name)
        if len(calls) == 1:
            raise ValueError("a bug in a rule")
        return True

    fact = Fact.any("flaky", flaky)
    try:
        program.fact(m, m.functions["f"], fact)
    except ValueError:
        pass
    assert program.fact(m, m.functions["f"], fact) is True  # asked again, not the placeholder of the failed try
    assert program._working == []
