"""serialization-format: the file is not torch.save's default zip format."""

from __future__ import annotations

import os
from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.checkpoint import CheckpointInfo

from ._ckptutil import MODEL_SETUP

SERIALIZATION_FORMAT = Pitfall(
    code="TD209",
    name="serialization-format",
    severity="info",
    summary="The file is not torch.save's default zip format: legacy, TorchScript, safetensors or plain pickle.",
    why="""
        The file is not in `torch.save`'s default zip format: it is the pre-1.6 legacy format (stacked pickles),
        the torch <= 0.1 tar format, a TorchScript archive (`torch.jit.save`), a safetensors file, or a plain
        pickle. torchdoctor sniffs the format from the content, never from the extension, and says how it read
        it.

        Each format loads differently: legacy files cannot be memory-mapped (`mmap=True` fails), tar files and
        TorchScript archives are refused by `torch.load(weights_only=True)`, TorchScript needs `torch.jit.load`,
        and a plain pickle is not a torch checkpoint at all (`torch.load` says "Invalid magic number; corrupt
        file?") and only `pickle.load`, which runs any code it names, reads it.
    """,
    fix="""
        Load with the matching function, then re-save the weights in the default format (or as safetensors).
    """,
    bad=Example(
        """
            torch.save(model.state_dict(), "ckpt.pt", _use_new_zipfile_serialization=False)  # the pre-1.6 format
            # torch.load("ckpt.pt", mmap=True) -> mmap can only be used with files saved with ...
        """,
        setup=MODEL_SETUP,
    ),
    good=Example(
        """
            torch.save(model.state_dict(), "ckpt.pt")  # the zip format: weights_only and mmap both work
            state = torch.load("ckpt.pt", mmap=True)
        """,
        setup=MODEL_SETUP,
    ),
)


def _describe(info: CheckpointInfo) -> tuple[str, Fix]:
    """The message and fix for a file of a format other than zip."""
    d = info.archive.details
    fmt = info.format
    path = info.path
    stem, ext = os.path.splitext(path)
    if fmt == "legacy":
        return (
            f"Pre-1.6 legacy format (stacked pickles, protocol {d.get('legacy_protocol', 1001)}), read pickle by "
            "pickle with the raw storages after them. torch.load still reads it (weights_only works) but "
            'mmap=True fails ("mmap can only be used with files saved with ... '
            '_use_new_zipfile_serialization=True").',
            Fix(
                title="Re-save a copy in the zip format (then weights_only and mmap both work):",
                code=f"torch.save(torch.load({path!r}, map_location='cpu'), {stem + '_zip' + (ext or '.pt')!r})",
            ),
        )
    if fmt == "legacy-tar":
        return (
            'Legacy tar format of torch <= 0.1.x; torch.load(weights_only=True) refuses it ("Cannot use '
            'weights_only=True with files saved in the legacy .tar format"). Its pickles were scanned, '
            "tensors are not listed.",
            Fix(title="Load it once in a trusted environment and re-save: torch.save(obj.state_dict(), 'new.pt')"),
        )
    if fmt == "torchscript":
        return (
            f"TorchScript archive (torch.jit.save): {len(info.table)} tensor(s) listed from data.pkl and "
            f"constants.pkl; its {d.get('code_files', 0)} code file(s) were not inspected. torch.load refuses it "
            '("Cannot use weights_only=True with TorchScript archives passed to torch.load").',
            Fix(
                title="Load it with torch.jit.load, and save its weights as a state dict if you need them elsewhere:",
                code=f"scripted = torch.jit.load({path!r}, map_location='cpu')\n"
                f"torch.save(scripted.state_dict(), {stem + '_weights.pt'!r})",
            ),
        )
    if fmt == "zip-sequence":
        return (
            f"{d.get('zips', 0)} torch.save archives stored back to back, as torch.distributed.checkpoint writes "
            "a .distcp shard (its loader reads each item by offset; torch.load reads none of them). Each archive "
            "was read and scanned.",
            Fix(
                title="Load the checkpoint folder with torch.distributed.checkpoint.load(state_dict, "
                "checkpoint_id=folder), or convert it once: "
                "torch.distributed.checkpoint.format_utils.dcp_to_torch_save(folder, 'model.pt')"
            ),
        )
    if fmt == "joblib":
        return (
            f"joblib file ({d.get('compression', 'uncompressed')}): a pickle with numpy arrays stored raw after "
            "it; joblib.load runs whatever code the pickle names. Its pickles were decompressed and scanned.",
            Fix(
                title="If you trust it, load it with joblib.load once and re-save the arrays (numpy.save, safetensors)."
            ),
        )
    if fmt == "pt2":
        return (
            "torch.export archive (.pt2): the graph as JSON, raw weights described by JSON, and pickled "
            "constants or sample inputs; torch.export.load unpickles those with weights_only=False. Its pickles "
            "were scanned.",
            Fix(
                title=f"Load it with torch.export.load({path!r}) only if its pickles are clean; the weights are "
                "listed above."
            ),
        )
    if fmt == "safetensors":
        return (
            "safetensors file: a JSON header plus raw tensor bytes, no pickle, nothing can execute; read from "
            "the header only.",
            Fix(title=f"Load it with safetensors: `safetensors.torch.load_file({path!r})`."),
        )
    return (
        f"Plain pickle file (protocol {d.get('protocol', '?')}), not torch.save's format: torch.load "
        'fails on it ("Invalid magic number; corrupt file?" or "Weights only load failed") and pickle.load '
        "runs whatever code it names.",
        Fix(
            title="If you trust it, load it with pickle.load once and re-save tensors with torch.save(...) or "
            "safetensors."
        ),
    )


@SERIALIZATION_FORMAT.checkpoint
def serialization_format(info: CheckpointInfo) -> Iterator[Finding]:
    """Any format other than torch.save's zip: what it is, and what loading it takes."""
    if info.format == "zip":
        return
    message, fix = _describe(info)
    yield Finding(message, fix=fix, location=Location(file=info.path))
