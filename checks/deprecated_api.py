"""deprecated-api: Variable, set_default_tensor_type, torch.cuda.amp, apex.amp, torch.distributed.launch and the
APIs TorchFix reports (torch.norm, functorch, sdp_kernel, assert_allclose, torchvision pretrained=, checkpoint
without use_reentrant)."""

from __future__ import annotations

import ast
from typing import Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Pitfall, Severity
from torchdoctor.sdk.source import SourceFile, has_word, literal

_SETUP = """
import torch

images = torch.randn(8, 3, 32, 32)
"""

DEPRECATED_API = Pitfall(
    code="TD506",
    name="deprecated-api",
    severity="info",
    summary="""
        Deprecated PyTorch APIs: Variable, set_default_tensor_type, torch.cuda.amp, apex.amp,
        torch.distributed.launch, torch.norm, functorch, sdp_kernel, assert_allclose, torchvision pretrained=,
        checkpoint without use_reentrant.
    """,
    why="""
        Deprecated APIs keep working until they are removed, but some already do nothing: `Variable(x,
        volatile=True)` has had no effect since 0.4, so an inference loop written that way builds a full autograd
        graph. apex.amp is unmaintained; its features are in `torch.amp`. `python -m torch.distributed.launch` is
        replaced by `torchrun`.
    """,
    fix="""
        Use tensors directly instead of `Variable`, `torch.no_grad()` instead of `volatile=True`,
        `torch.set_default_dtype`/`set_default_device`, `torch.amp.autocast("cuda")` and
        `torch.amp.GradScaler("cuda")`, and `torchrun`.
    """,
    bad=Example(
        """
        from torch.autograd import Variable

        x = Variable(images.cuda(), volatile=True)
        scaler = torch.cuda.amp.GradScaler()
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        with torch.no_grad():
            x = images.cuda()
        scaler = torch.amp.GradScaler("cuda")
        """,
        setup=_SETUP,
    ),
    details={
        "source": """
            Calls are matched by their qualified name after resolving imports (`from torch.autograd import
            Variable` counts, a local class named `Variable` does not). `torch.distributed.launch` is reported
            where a `subprocess`/`os` call runs `python -m torch.distributed.launch`; a message or docstring that
            merely mentions it is not. The notes TorchFix users expect are here too: `torch.norm` (use
            `torch.linalg.vector_norm`/`matrix_norm`), `functorch.vmap`/`grad`/... (`torch.func`),
            `torch.backends.cuda.sdp_kernel` (`torch.nn.attention.sdpa_kernel`), `torch.testing.assert_allclose`
            (`assert_close`), torchvision model builders given `pretrained=` (`weights=`), and
            `torch.utils.checkpoint.checkpoint`/`checkpoint_sequential` without `use_reentrant` (its default is
            changing; pass `use_reentrant=False`). `Variable(..., volatile=True)`, which silently does nothing, is a
            warning; the rest, apex.amp included (projects keep it as a deliberate option for old set-ups), are notes.
        """,
    },
)

# qualified name -> (what changed, what to use instead)
_CALLS = {
    "torch.autograd.Variable": (
        "Variable has been a no-op wrapper since PyTorch 0.4; it returns a plain tensor",
        "use the tensor itself (`x.requires_grad_()` where gradients are needed)",
    ),
    "torch.autograd.variable.Variable": (
        "Variable has been a no-op wrapper since PyTorch 0.4",
        "use the tensor itself",
    ),
    "torch.set_default_tensor_type": (
        "torch.set_default_tensor_type is deprecated since PyTorch 2.1",
        "torch.set_default_dtype(torch.float64) and/or torch.set_default_device('cuda')",
    ),
    "torch.cuda.amp.autocast": (
        "torch.cuda.amp.autocast is deprecated since PyTorch 2.4",
        'torch.amp.autocast("cuda", ...)',
    ),
    "torch.cuda.amp.GradScaler": (
        "torch.cuda.amp.GradScaler is deprecated since PyTorch 2.4",
        'torch.amp.GradScaler("cuda", ...)',
    ),
    "torch.norm": (
        "torch.norm is deprecated and may be removed",
        "torch.linalg.vector_norm (or torch.linalg.matrix_norm for matrices)",
    ),
    "torch.backends.cuda.sdp_kernel": (
        "torch.backends.cuda.sdp_kernel is deprecated since PyTorch 2.3",
        "torch.nn.attention.sdpa_kernel([SDPBackend.FLASH_ATTENTION, ...])",
    ),
    "torch.testing.assert_allclose": (
        "torch.testing.assert_allclose is deprecated since PyTorch 1.12",
        "torch.testing.assert_close",
    ),
    **{
        f"functorch.{name}": (
            f"functorch.{name} is deprecated: functorch moved into PyTorch as torch.func",
            f"torch.func.{name}",
        )
        for name in ("vmap", "grad", "grad_and_value", "jacrev", "jacfwd", "hessian", "jvp", "vjp", "functionalize")
    },
}
_CHECKPOINTS = ("torch.utils.checkpoint.checkpoint", "torch.utils.checkpoint.checkpoint_sequential")
# The method or function names of the calls above (a call's `attr` is the last segment of its qualified name).
_NAMES = frozenset(name.rsplit(".", 1)[-1] for name in (*_CALLS, *_CHECKPOINTS))
_LAUNCH = "torch.distributed.launch"
# Calls that run a command line: only their arguments can launch `python -m torch.distributed.launch`.
_PROCESS_STARTERS = ("subprocess.", "os.system", "os.popen", "os.exec", "os.spawn", "asyncio.create_subprocess")


def _mentions(text: str) -> bool:
    """Whether `text` names Variable, set_default_tensor_type, the word `amp` or torch.distributed.launch."""
    return (
        "Variable" in text
        or "set_default_tensor_type" in text
        or _LAUNCH in text
        or has_word(text, "amp")
        or "norm" in text
        or "functorch" in text
        or "sdp_kernel" in text
        or "assert_allclose" in text
        or "pretrained" in text
        or "checkpoint" in text
    )


@DEPRECATED_API.source
def deprecated_api(src: SourceFile) -> Iterator[Finding]:
    if src.tree is None or not _mentions(src.text):
        return
    launch_text = f"-m {_LAUNCH}" in src.text or f'"{_LAUNCH}"' in src.text or f"'{_LAUNCH}'" in src.text
    from_torch = _imported_from_torch(src.tree) if "functorch" in src.text else set()
    # A `pretrained=` keyword or an apex call needs the word in the text (from the call or from an import).
    by_prefix = launch_text or "pretrained" in src.text or "apex" in src.text
    for call in (
        c for scope in src.index.scopes if by_prefix or not _NAMES.isdisjoint(scope.call_attrs) for c in scope.calls
    ):
        if not by_prefix and call.attr not in _NAMES:
            continue
        known = _CALLS.get(call.qualname)
        if known is not None and call.qualname.startswith("functorch.") and call.attr in from_torch:
            continue  # `try: from torch.func import vmap / except ImportError: from functorch import vmap`
        if known is not None:
            volatile = call.kwarg("volatile")
            if volatile is not None and literal(volatile) is not False:
                yield Finding(
                    f"`{src.snippet(call.node)}`: volatile=True has had no effect since PyTorch 0.4, so this "
                    "inference records a full autograd graph.",
                    fix=Fix(title="Run inference under `with torch.no_grad():` and drop Variable(..., volatile=True)."),
                    location=src.location(call.node),
                    severity=Severity.WARNING,
                )
                continue
            yield Finding(
                f"`{src.snippet(call.node)}`: {known[0]}.",
                fix=Fix(title=f"Use {known[1]}."),
                location=src.location(call.node),
            )
        elif call.qualname in _CHECKPOINTS and call.kwarg("use_reentrant") is None and not call.has_star_kwargs:
            yield Finding(
                f"`{src.snippet(call.node)}` does not pass use_reentrant: PyTorch warns and is changing the default "
                "to False; the reentrant variant also ignores inputs without requires_grad and detached outputs.",
                fix=Fix(title="Pass use_reentrant=False (the recommended variant) explicitly."),
                location=src.location(call.node),
            )
        elif call.qualname.startswith("torchvision.models.") and call.kwarg("pretrained") is not None:
            yield Finding(
                f"`{src.snippet(call.node)}`: torchvision's `pretrained=` is deprecated since 0.13 and may be removed.",
                fix=Fix(
                    title="Pass `weights=` instead, e.g. `resnet50(weights=ResNet50_Weights.DEFAULT)` (or "
                    "`weights=None`)."
                ),
                location=src.location(call.node),
            )
        elif call.qualname.startswith("apex.amp."):
            yield Finding(
                f"`{src.snippet(call.node)}`: NVIDIA apex.amp is deprecated and unmaintained; its features are in "
                "PyTorch itself.",
                fix=Fix(
                    title='Use torch.amp: `with torch.autocast("cuda"):` for the forward and '
                    '`scaler = torch.amp.GradScaler("cuda")` around backward/step.'
                ),
                location=src.location(call.node),
            )
        elif launch_text and call.qualname.startswith(_PROCESS_STARTERS):
            command = _launch_command(call.node)
            if command is not None:
                yield Finding(
                    f"`{src.snippet(call.node)}` starts `python -m {_LAUNCH}`, which is deprecated in favour of "
                    "torchrun (and passes --local-rank, not --local_rank, since 2.0).",
                    fix=Fix(
                        title="Launch with `torchrun --nproc_per_node=N train.py` and read "
                        'int(os.environ["LOCAL_RANK"]).'
                    ),
                    location=src.location(command),
                )


def _imported_from_torch(tree: ast.Module) -> set[str]:
    """Names the module imports from torch or torch.func (a functorch import beside it is only a fallback)."""
    return {
        a.asname or a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in ("torch", "torch.func")
        for a in node.names
    }


def _launch_command(call: ast.Call) -> Optional[ast.AST]:
    """The string of a command line in the call's arguments that runs `-m torch.distributed.launch`."""
    for arg in call.args:
        for node in ast.walk(arg):
            if isinstance(node, (ast.List, ast.Tuple)):
                words = [literal(e) for e in node.elts]
                for i in range(1, len(words)):
                    if words[i] == _LAUNCH and words[i - 1] == "-m":
                        return node.elts[i]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and f"-m {_LAUNCH}" in node.value:
                return node
    return None
