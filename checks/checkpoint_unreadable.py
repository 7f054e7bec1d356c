"""checkpoint-unreadable: part of the checkpoint could not be read (truncated, corrupt, hostile)."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.checkpoint import UNREADABLE, CheckpointInfo

from ._ckptutil import MODEL_SETUP

CHECKPOINT_UNREADABLE = Pitfall(
    code="TD210",
    name="checkpoint-unreadable",
    severity="error",
    summary="Part of the checkpoint could not be read (truncated, corrupt, or a hostile pickle stopped early).",
    why="""
        Part of the file could not be read: a pickle that ends early or breaks a limit (pickle bombs, absurd
        lengths, deep nesting), a storage record that is missing or shorter than its tensors declare, encrypted
        zip records, or a TorchScript/legacy part torchdoctor cannot follow — or the whole file: empty, cut
        before its zip directory, or not in any format `torch.load` reads. Each such file is reported and the
        other files of the run are still checked.

        A truncated download or an interrupted `torch.save` fails at load time with confusing errors
        ("PytorchStreamReader failed reading zip archive", "unexpected EOF"), sometimes only when a particular
        tensor is touched. A scanner that gives up on a malformed pickle and reports "no issues" is a known way
        to smuggle payloads past it; a parse failure is never a clean bill of health.
    """,
    fix="""
        Re-download or re-save the file and compare sizes or hashes with the source. Save to a temporary name and
        rename when `torch.save` has returned, so an interrupted save never replaces a good file. Do not load a
        file from an untrusted source that fails to parse.
    """,
    bad=Example(
        """
            torch.save(model.state_dict(), "ckpt.pt", _use_new_zipfile_serialization=False)
            # the job is killed while it copies the file to shared storage: the copy ends early
            with open("ckpt.pt", "rb") as src, open("copy.pt", "wb") as dst:
                dst.write(src.read()[:-64])
        """,
        setup=MODEL_SETUP,
    ),
    good=Example(
        """
            torch.save(model.state_dict(), "ckpt.pt.tmp")
            os.replace("ckpt.pt.tmp", "ckpt.pt")  # atomic: readers see the whole new file or the previous one
        """,
        setup=MODEL_SETUP + "import os\n",
    ),
)


@CHECKPOINT_UNREADABLE.checkpoint
def checkpoint_unreadable(info: CheckpointInfo) -> Iterator[Finding]:
    """Each part of the file the reader could not read (or the whole file)."""
    problems = info.problems
    if info.format == UNREADABLE:
        yield Finding(
            f"The file could not be read as a checkpoint: {problems[0]}. Nothing in it was checked, so "
            "it is not a clean bill of health.",
            fix=Fix(title="Re-download or re-save the file; if it comes from an untrusted source, do not load it."),
            location=Location(file=info.path),
            key=problems[0],
        )
        return
    for problem in problems[:10]:
        yield Finding(
            f"Part of the file could not be read: {problem}. The report covers only what was read, so it is not "
            "a clean bill of health.",
            fix=Fix(title="Re-download or re-save the file; if it comes from an untrusted source, do not load it."),
            location=Location(file=info.path),
            key=problem,
        )
    if len(problems) > 10:
        yield Finding(
            f"{len(problems) - 10} more unreadable part(s).",
            fix=Fix(title="As above."),
            location=Location(file=info.path),
        )
