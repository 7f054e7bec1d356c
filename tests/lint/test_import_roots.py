"""Reading a file's import roots from its bytes: every import a statement names, and "anything" (None) whenever
a line holds an import this does not read whole (the callers search then parses the file)."""

import pytest

from torchdoctor.lint.import_roots import RELATIVE, from_text


@pytest.mark.parametrize(
    "text, roots",
    [
        ("import os\nimport a.b as c, d\n", {"os", "a", "d"}),
        ("from torch.nn import (\n    Linear,\n    ReLU,\n)\n", {"torch"}),
        ("from . import x\nfrom ..pkg.mod import y\n", {RELATIVE}),
        ("if TYPE_CHECKING:\n    from utils.io import load  # typing only\n", {"utils"}),
        ("import os\r\nfrom data import loader\r\n", {"os", "data"}),
        ("# import secret\nx = 1\n", set()),
        ("from importlib import import_module\nmod = import_module('x')\n", {"importlib"}),
        ("", set()),
    ],
)
def test_import_roots_of_the_statements_read_whole(text, roots):
    assert from_text(text.encode()) == roots


@pytest.mark.parametrize(
    "text",
    [
        "try: import apex\nexcept ImportError: apex = None\n",
        "x = 1; import utils\n",
        "import a, \\\n    utils\n",
        "print('cannot import utils')\n",
        '"""\n>>> import utils\n"""\n',
        "from  import x\n",
    ],
)
def test_an_import_not_read_whole_may_import_anything(text):
    assert from_text(text.encode()) is None
