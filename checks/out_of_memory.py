"""out-of-memory: the program died of an out-of-memory error; what held the memory, and what would free it."""

from __future__ import annotations

from typing import Any, Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall, byte_size
from torchdoctor.sdk.runtime import CrashEvent, RuntimeCheck

_SETUP = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))  # one output per row: shape (N, 1)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = torch.randn(2**21, 8), torch.randn(2**21)  # the whole table as one batch; y has shape (N,)
"""

OUT_OF_MEMORY = Pitfall(
    code="TD330",
    name="out-of-memory",
    severity="error",
    summary="The program ran out of memory: what held it (parameters, gradients, optimizer state, activations) "
    "and the fixes ranked by what they would save.",
    why="""
        "CUDA out of memory. Tried to allocate 2.00 GiB" says which allocation failed, not what filled the
        device. The memory of a training step goes to four places: the parameters, their gradients, the
        optimizer's state (Adam keeps two tensors per parameter) and the activations saved for backward,
        which grow with the batch size and the sequence length. Only the last one shrinks with the batch
        size; cutting the batch is useless when another process holds half of the GPU, or when the
        optimizer state alone does not fit. Memory reserved by PyTorch's caching allocator but not used by
        tensors (fragmentation) can also be the difference. On the CPU, one impossible allocation (terabytes)
        is nearly always a shape mistake, such as `(N, 1) - (N,)` broadcasting to `(N, N)`.

        `torch.cuda.empty_cache()` is not a fix: it returns cached blocks to the driver, which the next step
        needs again; it frees nothing that tensors use.
    """,
    fix="""
        Apply the fix that saves the most, as the finding ranks them: a smaller batch (or gradient
        accumulation), `torch.autocast("cuda", dtype=torch.bfloat16)`, activation checkpointing
        (`torch.utils.checkpoint`), `optimizer.zero_grad(set_to_none=True)` so that gradients are not held
        through the next forward, a leaner optimizer, `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`
        against fragmentation, or ending the other process that holds the GPU.
    """,
    bad=Example(
        """
        optimizer.zero_grad()
        pred = model(x)                      # (N, 1)
        loss = ((pred - y) ** 2).mean()      # (N, 1) - (N,) broadcasts to (N, N): terabytes
        loss.backward()
        optimizer.step()
        """,
        setup=_SETUP,
    ),
    good=Example(
        """
        optimizer.zero_grad()
        pred = model(x).squeeze(1)           # (N,)
        loss = ((pred - y) ** 2).mean()
        loss.backward()
        optimizer.step()
        """,
        setup=_SETUP,
    ),
    details={
        "runtime": """
            When the watched code (or, under `torchdoctor run`, the program) ends with `torch.OutOfMemoryError`
            or the CPU allocator's "can't allocate memory", the check measures, on the failing device, the
            bytes held by the watched models' parameters, their gradients and the optimizers' state (each
            storage once), the caching allocator's allocated and reserved memory (CUDA), the other processes
            NVML lists on that GPU and the largest tensors alive; the rest of what is allocated is
            activations and temporaries. The fixes are ranked by what each would save. Quiet for any other
            exception, and for an out-of-memory error caught by the program itself.
        """,
    },
)

_SAVINGS_LIMIT = 4


def _ranked(saves: list[tuple[int, str, str]]) -> tuple[str, str]:
    """The title (the fixes ranked by bytes saved) and the code of the best one."""
    saves = sorted([s for s in saves if s[0] > 0], key=lambda s: -s[0])[:_SAVINGS_LIMIT]
    if not saves:
        return (
            "Lower the batch size, or run the forward under torch.autocast:",
            "with torch.autocast('cuda', dtype=torch.bfloat16):\n    loss = criterion(model(x), y)",
        )
    title = (
        "Ranked by what they would save: "
        + "; ".join(f"{i + 1}) {what} (~{byte_size(n)})" for i, (n, what, _) in enumerate(saves))
        + ". The first:"
    )
    return title, saves[0][2]


@OUT_OF_MEMORY.runtime
class OutOfMemory(RuntimeCheck):
    """At a crash: an allocator's out-of-memory error, explained from the memory the session's tensors hold."""

    def on_crash(self, event: CrashEvent) -> Iterator[Finding]:
        from torchdoctor.sdk.runtime import evidence

        for exc in evidence.iter_exceptions(event.exception):
            device = evidence.oom_device(exc)
            if device is not None:
                yield self._explain(exc, device, evidence)
                return

    def _explain(self, exc: BaseException, device: Any, evidence: Any) -> Finding:
        message = str(exc)
        requested = evidence.requested_bytes(message)
        held = evidence.memory_breakdown(self.ctx, device)
        largest = evidence.largest_tensors(device)
        biggest = ", ".join(f"{list(shape)} {dtype} {byte_size(n)}" for shape, dtype, n in largest)
        ours = held.params + held.grads + held.optimizer_state
        optimizers = "/".join(dict.fromkeys(held.optimizer_kinds)) or "none watched"
        parts = [
            f"parameters {byte_size(held.params)}",
            f"gradients {byte_size(held.grads)}",
            f"optimizer state ({optimizers}) {byte_size(held.optimizer_state)}",
        ]
        import torch

        if not isinstance(exc, torch.OutOfMemoryError):  # the CPU allocator's error
            return self._cpu(device, requested, parts, biggest, largest)
        mem = evidence.cuda_memory(device)
        others = evidence.other_gpu_processes(device)
        rest = max(0, (mem.allocated or 0) - ours)
        parts.append(
            f"the rest (activations and temporaries) {byte_size(rest)}"
            if mem.allocated is not None
            else "the rest unknown (CUDA statistics unavailable)"
        )
        text = (
            f"{device} ran out of memory at step {self.ctx.step}"
            + (f" allocating {byte_size(requested)}" if requested else "")
            + (f" (device total {byte_size(mem.total)}, free {byte_size(mem.free)})" if mem.total else "")
            + ". Held by this process: "
            + ", ".join(parts)
            + "."
        )
        saves: list[tuple[int, str, str]] = [
            (
                rest // 2,
                "halve the batch size (or keep it and accumulate gradients over 2 steps)",
                "batch_size = batch_size // 2  # and optimizer.step() every 2 batches to keep the effective size",
            ),
            (
                rest // 2,
                "bf16 autocast for the forward",
                "with torch.autocast('cuda', dtype=torch.bfloat16):\n    loss = criterion(model(x), y)",
            ),
            (
                rest * 2 // 3,
                "activation checkpointing of the large blocks",
                "from torch.utils.checkpoint import checkpoint\nh = checkpoint(block, h, use_reentrant=False)",
            ),
        ]
        if held.grads:
            saves.append(
                (
                    held.grads,
                    "zero_grad(set_to_none=True) before the forward (the gradients are held through it now)",
                    "optimizer.zero_grad(set_to_none=True)  # before the forward",
                )
            )
        if held.optimizer_state > held.params // 2:
            saves.append(
                (
                    held.optimizer_state // 2,
                    "a leaner optimizer (SGD with momentum keeps one tensor per parameter, Adam two; or 8-bit Adam)",
                    "optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)",
                )
            )
        if mem.reserved is not None and mem.allocated is not None:
            slack = mem.reserved - mem.allocated
            text += f" Reserved by PyTorch but unused by tensors: {byte_size(slack)}"
            if requested and slack >= requested:
                text += (
                    " — more than the failed allocation: the cache is fragmented, and expandable segments "
                    "would let the allocator use it"
                )
                saves.append(
                    (
                        slack,
                        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (fragmentation)",
                        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python train.py",
                    )
                )
            text += "."
        if others:
            used = sum(u or 0 for _, u in others)
            text += (
                " Other processes on this GPU: "
                + ", ".join(f"pid {pid} ({byte_size(u)})" for pid, u in others[:4])
                + "."
            )
            saves.append(
                (
                    used,
                    "ending the other processes on this GPU",
                    "nvidia-smi  # then stop " + ", ".join(str(pid) for pid, _ in others[:4]),
                )
            )
        live = self.ctx.graphs.sentinels
        if live > 1:
            text += f" {live} autograd graphs of watched forwards were still alive, each holding its activations."
            saves.append(
                (
                    rest * (live - 1) // live,
                    f"releasing the {live - 1} older graphs (keep `loss.item()`, "
                    "not the loss; validate under torch.no_grad())",
                    "running_loss += loss.item()  # not `+= loss`, which keeps every step's graph",
                )
            )
        if biggest:
            text += f" Largest tensors alive: {biggest}."
        title, code = _ranked(saves)
        return Finding(text, fix=Fix(title=title, code=code), location=Location(device=str(device)))

    def _cpu(
        self, device: Any, requested: Optional[int], parts: list[str], biggest: str, largest: list[Any]
    ) -> Finding:
        import psutil

        ram = psutil.virtual_memory()
        text = (
            f"The CPU allocator could not allocate {byte_size(requested)} at step {self.ctx.step} "
            f"(RAM {byte_size(ram.total)}, available {byte_size(ram.available)}). Held by the watched "
            "models and optimizers: " + ", ".join(parts) + "."
        )
        if biggest:
            text += f" Largest tensors alive: {biggest}."
        if self.ctx.graphs.sentinels > 1:
            text += f" {self.ctx.graphs.sentinels} autograd graphs of watched forwards were still alive."
        if requested and requested > ram.total:
            text += (
                " One allocation larger than the machine's memory is nearly always a shape mistake: two "
                "operands that broadcast to a huge product, e.g. `(N, 1) - (N,)` giving `(N, N)`."
            )
            fix = Fix(
                title="Make the shapes match before the elementwise operation (check the shapes on the failing line):",
                code="pred = model(x).squeeze(1)  # (N, 1) -> (N,), the shape of y",
            )
        else:
            fix = Fix(
                title="Use smaller batches (or load the data lazily, batch by batch):",
                code="loader = DataLoader(dataset, batch_size=64)",
            )
        return Finding(text, fix=fix, location=Location(device=str(device)))
