"""storage-bloat: a tensor was saved as a view of a much larger storage, so the file is far larger."""

from __future__ import annotations

from typing import Iterator

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall, byte_size
from torchdoctor.sdk.checkpoint import CheckpointInfo, show_path

from ._ckptutil import MAX_LISTED

BLOAT_MIN_WASTE = 1 << 20  # bytes
BLOAT_MIN_RATIO = 2.0

STORAGE_BLOAT = Pitfall(
    code="TD207",
    name="storage-bloat",
    severity="warning",
    summary="A tensor was saved as a view of a much larger storage, so the file is far larger than its tensors.",
    why="""
        A tensor was saved as a view (a slice, `narrow`, `chunk`, indexing) of a much larger tensor. `torch.save`
        writes the whole underlying storage, so the file carries bytes no tensor uses. torchdoctor compares each
        storage's size with the byte ranges its tensors actually cover (at least 1 MiB wasted and half the
        storage unused).

        A 4 GB file can hold a 40 KB tensor: saving `embeddings[:10]`, one head of a fused QKV weight, or a slice
        of a replay buffer drags the full storage along. Downloads, disk use and load times all pay for it.
    """,
    fix="""
        `.clone()` views before saving so each tensor owns a storage of its own size, or write a compact copy
        with `torchdoctor check-ckpt FILE --fix compact.pt`.
    """,
    bad=Example(
        """
            embedding = nn.Embedding(50_000, 16)  # 3.2 MB of weights
            special = embedding.weight[:4].detach()  # a view: 4 rows of that storage
            torch.save({"special_tokens": special}, "tokens.pt")  # writes all 3.2 MB
        """,
        setup="import torch\nfrom torch import nn\n",
    ),
    good=Example(
        """
            embedding = nn.Embedding(50_000, 16)
            special = embedding.weight[:4].detach().clone()  # owns a storage of its own size
            torch.save({"special_tokens": special}, "tokens.pt")  # 256 bytes of tensor data
        """,
        setup="import torch\nfrom torch import nn\n",
    ),
)


def _covered(spans: list[tuple[int, int]]) -> int:
    """How many bytes the (start, end) spans cover together, overlaps counted once."""
    total, end = 0, -1
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _fix(info: CheckpointInfo, paths: list[tuple[str, ...]]) -> Fix:
    """Clone the listed views in a copy of the file: load it, clone each, save it again (or --fix)."""

    def access(path: tuple[str, ...]) -> str:
        return "ckpt" + "".join(f"[{int(p)}]" if p.isdigit() else f"[{p!r}]" for p in path)

    clones = "\n".join(f"{access(p)} = {access(p)}.clone()" for p in paths)
    return Fix(
        title="Clone views before saving (`torch.save(view.clone(), ...)`) so each tensor owns a storage of its own "
        "size; to shrink this file:",
        code=f"ckpt = torch.load({info.path!r}, map_location='cpu')\n{clones}\ntorch.save(ckpt, {info.path!r})\n"
        f"# or write a compact copy: torchdoctor check-ckpt {info.path} --fix compact.pt",
    )


@STORAGE_BLOAT.checkpoint
def storage_bloat(info: CheckpointInfo) -> Iterator[Finding]:
    """Storages much larger than the bytes their tensors use."""
    table = info.table
    bloated = []
    for refs in table.storage_users(BLOAT_MIN_WASTE).values():  # smaller storages cannot waste enough to report
        size = table.storage_nbytes(refs[0])
        if len(refs) == 1:
            start, end = table.meta(refs[0]).byte_span()
            used = end - max(start, -1) if end > -1 else 0  # _covered of one span, without the sort
        else:
            used = _covered([table.meta(i).byte_span() for i in refs])
        waste = size - used
        if waste >= BLOAT_MIN_WASTE and size >= BLOAT_MIN_RATIO * max(used, 1):
            bloated.append((waste, size, used, refs[0]))
    if not bloated:
        return
    bloated.sort(key=lambda b: -b[0])
    total = sum(b[0] for b in bloated)
    rows = "; ".join(
        f"{show_path(table.path(i))} {list(table.meta(i).shape)} uses {byte_size(used)} of a {byte_size(size)} storage"
        for _, size, used, i in bloated[:MAX_LISTED]
    )
    yield Finding(
        f"{len(bloated)} tensor(s) were saved as views of larger tensors, and torch.save writes the whole "
        f"underlying storage: {byte_size(total)} of the file's {byte_size(info.archive.file_size)} hold data no tensor "
        f"uses. {rows}.",
        fix=_fix(info, [table.path(b[3]) for b in bloated[:MAX_LISTED]]),
        location=Location(file=info.path, key=show_path(table.path(bloated[0][3]))),
    )
