"""Engine queries over expressions (torchdoctor.lint.flow), against the plain ast walks they stand in for."""

import ast

from torchdoctor.lint.flow import first_method_call

NAMES = frozenset({"parameters", "named_parameters"})


def _by_ast_walk(expr: ast.expr) -> "ast.Call | None":
    for node in ast.walk(expr):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in NAMES:
            return node
    return None


def test_first_method_call_finds_what_ast_walk_finds_first():
    sources = [
        "torch.optim.SGD(model.parameters(), lr=0.1)",
        "Adam([{'params': a.parameters()}, {'params': b.named_parameters(), **extra}], lr=lr)",
        "SGD(chain(deep(x.y.parameters()), b.parameters()))",  # breadth first: b's, the shallower one
        "SGD(f(lambda: m.parameters())[0], momentum=g(n.parameters()))",
        "SGD(params, lr=lr)",
        "SGD([p for p in net.parameters() if p.requires_grad], lr=f'{x}')",
        "SGD({**d, 'k': q.parameters()}[k], lr=(1, 2)[0])",
        "SGD(model.parameters)",  # not a call
    ]
    for source in sources:
        expr = ast.parse(source, mode="eval").body
        expected = _by_ast_walk(expr)
        assert first_method_call(expr, NAMES) is expected, source
    third = ast.parse(sources[2], mode="eval").body
    assert ast.unparse(first_method_call(third, NAMES)) == "b.parameters()"
    assert first_method_call(ast.parse(sources[4], mode="eval").body, NAMES) is None
