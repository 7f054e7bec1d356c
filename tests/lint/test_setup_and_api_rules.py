"""local-rank-argument, nondeterministic-settings, unsafe-torch-load, prefix-strip-by-slicing, deprecated-api."""

import pytest

from torchdoctor.findings import Severity


@pytest.mark.rule("local-rank-argument")
def test_local_rank_only_fires(lint, fired):
    code = """
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    args = parser.parse_args()
    """
    [f] = fired(lint(code), "local-rank-argument")
    assert f.code == "TD406" and f.location.line == 4 and f.edits


@pytest.mark.rule("local-rank-argument")
@pytest.mark.parametrize(
    "code",
    [
        'parser.add_argument("--local_rank", "--local-rank", type=int)\n',
        'parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))\n',
        '# we used to take --local_rank\nlocal_rank = int(os.environ["LOCAL_RANK"])\n',
    ],
)
def test_local_rank_handled_is_quiet(lint, code):
    assert lint(code) == []


@pytest.mark.rule("nondeterministic-settings")
def test_benchmark_with_determinism_fires(lint, fired):
    code = """
    import torch
    torch.manual_seed(0)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = True
    """
    [f] = fired(lint(code), "nondeterministic-settings")
    assert f.code == "TD310" and f.severity == Severity.WARNING and f.location.line == 5


@pytest.mark.rule("nondeterministic-settings")
def test_benchmark_in_the_other_branch_is_quiet(lint):
    code = """
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
    else:
        torch.backends.cudnn.benchmark = True
    """
    assert lint(code) == []


@pytest.mark.rule("unsafe-torch-load")
@pytest.mark.parametrize(
    "source",
    [
        'path = hf_hub_download("org/model", "model.pt")\nckpt = torch.load(path, weights_only=False)\n',
        'ckpt = torch.load(urlopen("https://example.com/m.pt"), weights_only=False)\n',
    ],
)
def test_torch_load_weights_only_false_of_a_download_is_a_warning(lint, fired, source):
    [f] = fired(lint("import torch\n" + source), "unsafe-torch-load")
    assert f.code == "TD503" and f.severity == Severity.WARNING and "downloaded" in f.message


@pytest.mark.rule("unsafe-torch-load")
def test_torch_load_weights_only_false_of_a_local_file_is_a_note(lint, fired):
    code = 'import torch\ntorch.save(model, "x.pt")\nckpt = torch.load("x.pt", weights_only=False)\n'
    [f] = fired(lint(code), "unsafe-torch-load")
    assert f.severity == Severity.INFO  # deliberate: a test loading what it just wrote, a resume


@pytest.mark.rule("unsafe-torch-load")
def test_torch_load_without_weights_only_is_a_note_fixable_only_for_state_dicts(lint, fired):
    code = """
    import torch
    model.load_state_dict(torch.load("a.pt"))
    sd = torch.load("b.pt", map_location="cpu")
    model.load_state_dict(sd["model"])
    other = torch.load("c.pt")
    print(other.epoch)
    """
    found = fired(lint(code), "unsafe-torch-load")
    assert [f.severity for f in found] == [Severity.INFO] * 3
    assert [bool(f.edits) for f in found] == [True, True, False]


@pytest.mark.rule("unsafe-torch-load")
def test_torch_load_with_weights_only_true_is_quiet(lint):
    assert lint('import torch\nsd = torch.load("x.pt", weights_only=True)\n') == []


@pytest.mark.rule("prefix-strip-by-slicing")
def test_prefix_slicing_fires(lint, fired):
    code = """
    import torch
    from collections import OrderedDict
    ckpt = torch.load("dp.pt", weights_only=True)
    state = {k[7:]: v for k, v in ckpt.items()}
    fixed = OrderedDict()
    for k, v in ckpt["model"].items():
        name = k[len("module."):]
        fixed[name] = v
    """
    found = fired(lint(code), "prefix-strip-by-slicing")
    assert [f.location.line for f in found] == [5, 8] and "'module.'" in found[0].message
    assert found[0].edits and found[1].edits
    # the loop variable is read after the loop: rewriting the loop away would leave it unbound
    assert not fired(lint(code + "print(name)\n"), "prefix-strip-by-slicing")[1].edits


@pytest.mark.rule("prefix-strip-by-slicing")
@pytest.mark.parametrize(
    "code",
    [
        "state = {(k[7:] if k.startswith('module.') else k): v for k, v in sd.items()}\n",
        "state = {k.replace('module.', '', 1): v for k, v in sd.items()}\n",
        "names = [n[3:] for n in files]\n",
        "state = {k[8:]: v for k, v in sd.items()}\n",
    ],
)
def test_prefix_look_alikes_are_quiet(lint, code):
    assert lint(code) == []


@pytest.mark.rule("deprecated-api")
def test_deprecated_apis_fire_with_resolved_imports(lint, fired):
    code = """
    import torch
    from torch.autograd import Variable
    from apex import amp
    x = Variable(images)
    y = Variable(images, volatile=True)
    torch.set_default_tensor_type(torch.cuda.FloatTensor)
    scaler = torch.cuda.amp.GradScaler()
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    subprocess.run(["python", "-m", "torch.distributed.launch", "--nproc_per_node=2", "train.py"])
    """
    found = fired(lint(code), "deprecated-api")
    assert [f.location.line for f in found] == [5, 6, 7, 8, 9, 10]
    assert found[1].severity == Severity.WARNING and "volatile" in found[1].message
    assert found[4].severity == Severity.INFO and "apex" in found[4].message  # a deliberate option in most projects


@pytest.mark.rule("deprecated-api")
def test_local_class_named_variable_is_quiet(lint):
    code = (
        '"""Do not use torch.distributed.launch."""\nclass Variable:\n    pass\nv = Variable()\n'
        'warnings.warn("python -m torch.distributed.launch is deprecated, use torchrun")\n'
    )
    assert lint(code) == []


@pytest.mark.rule("deprecated-api")
@pytest.mark.parametrize(
    "bad, good",
    [
        ("n = torch.norm(x, dim=1)", "n = torch.linalg.vector_norm(x, dim=1)"),
        ("from functorch import vmap\nys = vmap(f)(xs)", "from torch.func import vmap\nys = vmap(f)(xs)"),
        ("import functorch\ng = functorch.grad(f)", "g = torch.func.grad(f)"),
        (
            "with torch.backends.cuda.sdp_kernel(enable_math=False):\n    pass",
            "with torch.nn.attention.sdpa_kernel([]):\n    pass",
        ),
        ("torch.testing.assert_allclose(a, b)", "torch.testing.assert_close(a, b)"),
        (
            "import torchvision\nm = torchvision.models.resnet50(pretrained=True)",
            "import torchvision\nm = torchvision.models.resnet50(weights=None)",
        ),
        (
            "from torchvision.models import resnet18\nm = resnet18(pretrained=False)",
            "from torchvision.models import resnet18\nm = resnet18(weights='DEFAULT')",
        ),
        (
            "from torch.utils.checkpoint import checkpoint\ny = checkpoint(block, x)",
            "from torch.utils.checkpoint import checkpoint\ny = checkpoint(block, x, use_reentrant=False)",
        ),
        (
            "import torch.utils.checkpoint as cp\ny = cp.checkpoint_sequential(blocks, 2, x)",
            "import torch.utils.checkpoint as cp\ny = cp.checkpoint_sequential(blocks, 2, x, use_reentrant=True)",
        ),
    ],
)
def test_torchfix_deprecations_are_notes_and_their_replacements_quiet(lint, fired, bad, good):
    [f] = fired(lint("import torch\n" + bad + "\n"), "deprecated-api")
    lines = bad.split("\n")
    call_line = max(i for i, line in enumerate(lines) if not line.startswith(" ")) + 2  # after `import torch`
    assert f.severity == Severity.INFO and f.location.line == call_line
    assert lint("import torch\n" + good + "\n") == []


@pytest.mark.rule("deprecated-api")
def test_a_tensor_norm_method_and_a_local_checkpoint_function_are_quiet(lint):
    code = (
        "import torch\nn = x.norm(dim=1)\ndef checkpoint(f, x):\n    return f(x)\ny = checkpoint(g, x)\n"
        "m = timm.create_model('resnet50', pretrained=True)\n"
    )
    assert lint(code) == []


@pytest.mark.rule("deprecated-api")
def test_functorch_as_a_fallback_import_is_quiet(lint):
    code = (
        "try:\n    from torch.func import vmap\nexcept ImportError:\n    from functorch import vmap\nys = vmap(f)(xs)\n"
    )
    assert lint(code) == []


@pytest.mark.rule("deprecated-api", "eval-without-no-grad")
def test_variable_volatile_is_reported_once_by_deprecated_api(lint):
    code = """
    import torch
    from torch.autograd import Variable

    def validate(model, loader):
        model.eval()
        for images, target in loader:
            output = model(Variable(images, volatile=True))
            print(output.argmax(1))
    validate(model, val_loader)
    """
    assert [(f.name, f.location.line) for f in lint(code)] == [("deprecated-api", 8)]
    # the same forward without the volatile flag is eval-without-no-grad's
    plain = code.replace("Variable(images, volatile=True)", "Variable(images)")
    assert sorted(f.name for f in lint(plain)) == ["deprecated-api", "eval-without-no-grad"]
