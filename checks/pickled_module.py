"""pickled-module: a whole nn.Module or optimizer was pickled (torch.save(model)) instead of its state_dict()."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.checkpoint import CheckpointInfo, show_path

from ._ckptutil import MODEL_SETUP

PICKLED_MODULE = Pitfall(
    code="TD203",
    name="pickled-module",
    severity="warning",
    summary="A whole nn.Module or optimizer object was pickled (torch.save(model)) instead of its state_dict().",
    why="""
        A whole `nn.Module` (or optimizer) object was saved with `torch.save(model)` instead of its
        `state_dict()`. torchdoctor recognises the module by its pickled `_parameters`/`_buffers`/`_modules`
        attributes and lists the weights it holds, without importing the class.

        A pickled module stores a reference to its class (`__main__.Net`, `models.resnet.ResNet`), not its code.
        Loading needs that class importable under exactly that name, so moving or renaming the file, loading
        from another script, or changing the class breaks it:

        ```text
        AttributeError: Can't get attribute 'Net' on <module '__main__' from 'eval.py'>
        ```

        It also needs `weights_only=False`, which lets the file run arbitrary code.
    """,
    fix="""
        Save `model.state_dict()` and rebuild the model from code before loading the weights. To rescue an
        existing file without running its pickle, `torchdoctor check-ckpt FILE --fix weights.pt` writes the
        module's weights as a plain state_dict.
    """,
    bad=Example(
        """
            torch.save(model, "model.pt")  # pickles the module object itself, class references and all
            # torch.load("model.pt", weights_only=False) needs the same classes importable under the same names
        """,
        setup=MODEL_SETUP,
    ),
    good=Example(
        """
            torch.save(model.state_dict(), "model.pt")
            model = make_model()  # the architecture comes from code
            model.load_state_dict(torch.load("model.pt"))
        """,
        setup=MODEL_SETUP,
    ),
)


@PICKLED_MODULE.checkpoint
def pickled_module(info: CheckpointInfo) -> Iterator[Finding]:
    """Each pickled nn.Module or optimizer object (TorchScript archives are modules by design)."""
    if info.format == "torchscript":
        return
    for obj in info.objects:
        cls = obj.qualname
        short = cls.rpartition(".")[2]
        where = show_path(obj.path)
        if obj.kind == "module":
            message = (
                f"{where} is a whole pickled `{cls}` module (torch.save(model)), not a state_dict. Loading "
                f"it needs `{cls}` importable under exactly that name (else \"Can't get attribute '{short}' "
                f"on <module '{cls.rpartition('.')[0]}'>\"), breaks when the code changes, and "
                "torch.load's weights_only default refuses it."
            )
            fix = (
                "Save the weights instead: torch.save(model.state_dict(), 'weights.pt'), and rebuild with "
                f"model = {short}(); model.load_state_dict(torch.load('weights.pt')). "
                f"`torchdoctor check-ckpt {info.path} --fix weights.pt` extracts them without running this pickle."
            )
        else:
            message = (
                f"{where} is a whole pickled `{cls}` optimizer object, not optimizer.state_dict(); it "
                "carries references to parameters and needs code to load."
            )
            fix = "Save optimizer.state_dict() and restore with optimizer.load_state_dict(...)."
        yield Finding(message, fix=Fix(title=fix), location=Location(file=info.path, key=where), key=cls)
