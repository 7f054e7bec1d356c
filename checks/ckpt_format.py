"""Checkpoint format checks: how the file was serialised, and parts of it that could not be read."""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from torchdoctor.findings import Finding, Location
from torchdoctor.registry import Scope, check

if TYPE_CHECKING:
    from torchdoctor.ckpt.info import CheckpointInfo


def _describe(info: CheckpointInfo) -> tuple[str, str]:
    d = info.archive.details
    fmt = info.format
    if fmt == "legacy":
        return (f"Pre-1.6 legacy format (stacked pickles, protocol {d.get('legacy_protocol', 1001)}), read pickle by "
                "pickle with the raw storages after them. torch.load still reads it (weights_only works) but "
                "mmap=True fails (\"mmap can only be used with files saved with ... "
                "_use_new_zipfile_serialization=True\").",
                "Re-save in the zip format: torch.save(torch.load(path, map_location='cpu'), 'new.pt')")
    if fmt == "legacy-tar":
        return ("Legacy tar format of torch <= 0.1.x; torch.load(weights_only=True) refuses it (\"Cannot use "
                "weights_only=True with files saved in the legacy .tar format\"). Its pickles were scanned, "
                "tensors are not listed.",
                "Load it once in a trusted environment and re-save: torch.save(obj.state_dict(), 'new.pt')")
    if fmt == "torchscript":
        return (f"TorchScript archive (torch.jit.save): {len(info.tensors)} tensor(s) listed from data.pkl and "
                f"constants.pkl; its {d.get('code_files', 0)} code file(s) were not inspected. torch.load refuses it "
                "(\"Cannot use weights_only=True with TorchScript archives passed to torch.load\").",
                "Load it with torch.jit.load(path, map_location='cpu'); to get weights: "
                "torch.jit.load(path).state_dict()")
    if fmt == "safetensors":
        return ("safetensors file: a JSON header plus raw tensor bytes, no pickle, nothing can execute; read from "
                "the header only.",
                "Load with safetensors.torch.load_file(path) (torch.load also dispatches .safetensors files).")
    return (f"Plain pickle file (protocol {d.get('protocol', '?')}), not torch.save's format: torch.load "
            "fails on it (\"Invalid magic number; corrupt file?\" or \"Weights only load failed\") and pickle.load "
            "runs whatever code it names.",
            "If you trust it, load it with pickle.load once and re-save tensors with torch.save(...) or "
            "safetensors.")


@check(code="TD209", name="serialization-format", scope=Scope.CHECKPOINT, severity="info",
       summary="The file is not torch.save's default zip format: legacy, TorchScript, safetensors or plain pickle.")
def serialization_format(info: CheckpointInfo) -> Iterator[Finding]:
    if info.format == "zip":
        return
    message, fix = _describe(info)
    yield Finding(message, fix=fix, location=Location(file=info.path))


@check(code="TD210", name="checkpoint-unreadable", scope=Scope.CHECKPOINT, severity="error",
       summary="Part of the checkpoint could not be read (truncated, corrupt, or a hostile pickle stopped early).")
def checkpoint_unreadable(info: CheckpointInfo) -> Iterator[Finding]:
    problems = info.problems
    for problem in problems[:10]:
        yield Finding(
            f"Part of the file could not be read: {problem}. The report covers only what was read, so it is not "
            "a clean bill of health.",
            fix="Re-download or re-save the file; if it comes from an untrusted source, do not load it.",
            location=Location(file=info.path),
        )
    if len(problems) > 10:
        yield Finding(f"{len(problems) - 10} more unreadable part(s).", fix="As above.",
                      location=Location(file=info.path))
