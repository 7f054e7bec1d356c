"""cuda-device-assert: a device-side assert (or CPU's index error), most often a label or token id out of range."""

from __future__ import annotations

from typing import Any, Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import CrashEvent, ForwardEvent, Restore, RuntimeCheck

_SETUP = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 10))  # 10 classes: labels 0..9
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = [(torch.randn(4, 8), torch.tensor([1, 10, 3, 10])) for _ in range(2)]  # labels 1..10, as the files number them
"""

CUDA_DEVICE_ASSERT = Pitfall(
    code="TD333",
    name="cuda-device-assert",
    severity="error",
    summary="A CUDA device-side assert (on the CPU: an index out of bounds): most often a class label or a "
    "token id that is not smaller than the classifier's output size or the vocabulary.",
    why="""
        `RuntimeError: CUDA error: device-side assert triggered` comes from a kernel that checked an index,
        and CUDA reports it later, at whatever line next synchronises, so the traceback points at the wrong
        place; after it the CUDA context is unusable. By far the most common cause is a label `>= num_classes`
        given to `cross_entropy`/`nll_loss` (labels numbered from 1, a class added to the data but not to
        the head, -1 for "unknown"), or a token id `>= num_embeddings` given to an embedding (a tokenizer
        larger than the model's vocabulary). On the CPU the same mistake raises "Target 10 is out of bounds"
        or "index out of range in self".
    """,
    fix="""
        Make the labels fit the head (`y = y - 1` for labels numbered from 1; the head's size equal to the
        number of classes; `ignore_index` for "unknown") or the vocabulary fit the tokenizer
        (`model.resize_token_embeddings(len(tokenizer))`). Check once, on the CPU:
        `assert 0 <= y.min() and y.max() < num_classes`. To locate a device-side assert, run with
        `CUDA_LAUNCH_BLOCKING=1`, or the same batch on the CPU.
    """,
    bad=Example(
        """
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        for x, y in loader:
            y = y - 1  # labels 1..10 -> classes 0..9
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        """,
        setup=_SETUP,
    ),
    details={
        "runtime": """
            When the watched code (or the program, under `torchdoctor run`) ends with a device-side assert
            or with the CPU's "out of bounds" / "index out of range" index error, the check compares the
            integer values that reached the failing loss or embedding with its size: on the CPU from the
            failing frame's own `target`/`input` tensors; after a CUDA assert, when the tensors can no longer
            be read, from the smallest and largest integer values seen in the DataLoader's batches (recorded
            on the CPU, per batch position, only on machines with CUDA) against the last output size of each
            watched model and its embeddings' sizes. Quiet for any other exception.
        """,
    },
)


def _int_tensors(batch: Any, where: str = "batch", depth: int = 0) -> Iterator[tuple[str, Any]]:
    """(position, tensor) of the integer CPU tensors in a batch (tuple, list or dict, two levels deep)."""
    import torch

    if isinstance(batch, torch.Tensor):
        if batch.dtype in (torch.int64, torch.int32) and batch.device.type == "cpu" and 0 < batch.numel() <= 1 << 22:
            yield where, batch
    elif depth < 2 and isinstance(batch, (tuple, list)):
        for i, item in enumerate(batch[:8]):
            yield from _int_tensors(item, f"{where}[{i}]", depth + 1)
    elif depth < 2 and isinstance(batch, dict):
        for key, item in list(batch.items())[:16]:
            yield from _int_tensors(item, f"{where}[{key!r}]", depth + 1)


@CUDA_DEVICE_ASSERT.runtime
class CudaDeviceAssert(RuntimeCheck):
    """At a crash: an index out of range, explained from the values that reached it and the sizes they index."""

    record_batches: Optional[bool] = None  # None: only where CUDA is available (where the tensors become unreadable)

    def on_start(self) -> None:
        import torch

        self.outputs: dict[str, int] = {}  # model label -> last dim of its last forward's output
        self.seen: dict[str, tuple[int, int]] = {}  # batch position -> (min, max) of its integer values
        record = self.record_batches if self.record_batches is not None else torch.cuda.is_available()
        if record:
            self._record_batches()

    def _record_batches(self) -> None:
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        original = _BaseDataLoaderIter.__next__
        seen = self.seen

        def recording_next(it: Any) -> Any:
            batch = original(it)
            try:
                for where, t in _int_tensors(batch):
                    low, high = (int(v) for v in t.aminmax())
                    old = seen.get(where)
                    seen[where] = (low, high) if old is None else (min(old[0], low), max(old[1], high))
            except Exception:
                pass  # evidence only: never in the way of the batch
            return batch

        _BaseDataLoaderIter.__next__ = recording_next  # type: ignore[method-assign,assignment]
        self.ctx.hooks.add(Restore(_BaseDataLoaderIter, "__next__", recording_next, original))

    def on_forward(self, event: ForwardEvent) -> None:
        shape = getattr(event.output, "shape", None)
        if shape is None:
            logits = getattr(event.output, "logits", None)
            shape = getattr(logits, "shape", None)
        if shape is not None and len(shape) >= 2:
            self.outputs[event.model.label] = int(shape[-1])

    def on_crash(self, event: CrashEvent) -> Iterator[Finding]:
        from torchdoctor.sdk.runtime import evidence

        chain = list(evidence.iter_exceptions(event.exception))
        cuda = any("device-side assert triggered" in str(e) for e in chain)
        cpu = next(
            (
                e
                for e in chain
                if isinstance(e, IndexError) and ("out of bounds" in str(e) or "index out of range" in str(e))
            ),
            None,
        )
        if cuda:
            yield self._from_batches()
        elif cpu is not None:
            finding = self._from_frame(cpu, evidence)
            if finding is not None:
                yield finding

    def _from_frame(self, exc: BaseException, evidence: Any) -> Optional[Finding]:
        """CPU: the failing loss's target and input, or the failing embedding's ids and weight."""
        import torch

        for frame in reversed(evidence.frames(exc)):
            f = frame.f_locals
            target, inp, weight = f.get("target"), f.get("input"), f.get("weight")
            if (
                isinstance(target, torch.Tensor)
                and isinstance(inp, torch.Tensor)
                and not target.is_floating_point()
                and inp.dim() >= 1
            ):
                classes = int(inp.shape[1] if inp.dim() > 1 else inp.shape[0])
                low, high = int(target.min()), int(target.max())
                return self._labels(low, high, classes, "the targets of the failing loss", frame.f_code.co_name)
            if (
                frame.f_code.co_name == "embedding"
                and isinstance(inp, torch.Tensor)
                and isinstance(weight, torch.Tensor)
            ):
                return self._ids(int(inp.min()), int(inp.max()), int(weight.shape[0]), "the ids given to the embedding")
        return None

    def _labels(self, low: int, high: int, classes: int, what: str, where: str) -> Finding:
        off_by_one = low >= 1 and high == classes
        text = (
            f"{what.capitalize()} ({where}) range from {low} to {high}, but the output has {classes} classes "
            f"(valid labels 0..{classes - 1}) at step {self.ctx.step}"
            + (": the labels look numbered from 1." if off_by_one else ".")
        )
        fix = (
            Fix(title="Shift labels numbered from 1 to start at 0:", code="y = y - 1")
            if off_by_one
            else Fix(
                title=f"Give the head one output per class (num_classes = {high + 1} for these labels), or map the "
                f"labels into 0..{classes - 1}:",
                code="assert 0 <= y.min() and y.max() < num_classes",
            )
        )
        return Finding(text, fix=fix)

    def _ids(self, low: int, high: int, size: int, what: str) -> Finding:
        return Finding(
            f"{what.capitalize()} range from {low} to {high}, but it has {size} rows (valid ids "
            f"0..{size - 1}) at step {self.ctx.step}: the tokenizer (or the data) has a larger "
            "vocabulary than the model.",
            fix=Fix(
                title="Size the embedding for the tokenizer (a Hugging Face model: "
                "model.resize_token_embeddings(len(tokenizer))):",
                code="embedding = nn.Embedding(len(tokenizer), dim)",
            ),
        )

    def _from_batches(self) -> Finding:
        """CUDA: the tensors are unreadable now; compare what the batches held with the models' sizes."""
        from torch import nn

        embeddings = {
            wm.label: min(m.num_embeddings for m in wm.inner.modules() if isinstance(m, nn.Embedding))
            for wm in self.ctx.models
            if any(isinstance(m, nn.Embedding) for m in wm.inner.modules())
        }
        clues = []
        for where, (low, high) in self.seen.items():
            for label, classes in self.outputs.items():
                if high >= classes and high < 4 * classes + 8:  # a label just past the head, not token ids
                    clues.append(
                        f"{where} held values up to {high} but {label} outputs {classes} classes "
                        f"(valid labels 0..{classes - 1})"
                    )
            for label, size in embeddings.items():
                if high >= size:
                    clues.append(f"{where} held ids up to {high} but {label}'s smallest embedding has {size} rows")
            if low < 0 and low != -100:
                clues.append(f"{where} held negative values (down to {low}): -1 is not ignored unless ignore_index=-1")
        sizes = ", ".join(f"{label} outputs {n}" for label, n in self.outputs.items())
        text = (
            f"A CUDA device-side assert at step {self.ctx.step} (the traceback may point past the kernel that "
            "failed). "
            + (
                "; ".join(clues) + "."
                if clues
                else "The usual cause is a label >= the number of classes or a token id >= the "
                "vocabulary" + (f" ({sizes})" if sizes else "") + "."
            )
        )
        return Finding(
            text,
            fix=Fix(
                title="Locate it: run once with synchronous kernels (`CUDA_LAUNCH_BLOCKING=1 python "
                "train.py`), which report the failing line exactly, and check the labels on the "
                "CPU, where the batch is made:",
                code="assert 0 <= y.min() and y.max() < num_classes",
            ),
            location=Location(device="cuda"),
        )
