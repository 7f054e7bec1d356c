"""tensor-cores-idle: float32 matmuls on a GPU with tensor cores, TF32 off and no autocast."""

from __future__ import annotations

from typing import Any, Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import ForwardEvent, RuntimeCheck, StepEvent

FORWARDS = 3  # training forwards seen, all without autocast, before a verdict
MATMUL_LAYERS = (
    "Linear",
    "Bilinear",
    "MultiheadAttention",
    "LSTM",
    "GRU",
    "RNN",
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
    "Transformer",
)

_NEEDS_GPU = "it takes an NVIDIA GPU with tensor cores (Ampere or newer); the examples run on the CPU."

TENSOR_CORES_IDLE = Pitfall(
    code="TD345",
    name="tensor-cores-idle",
    severity="info",
    summary="float32 matrix multiplications on a GPU with tensor cores, with TF32 off and no autocast: the "
    "tensor cores stay idle.",
    why="""
        Since Ampere (A100, RTX 30xx) NVIDIA GPUs multiply float32 matrices on their tensor cores in TF32, several
        times faster than on the ordinary float32 units, and in float16/bfloat16 faster still. PyTorch keeps TF32
        off for matrix multiplications by default (`torch.get_float32_matmul_precision() == "highest"`; only
        cuDNN convolutions use it), so a plain float32 model with `nn.Linear`, attention or RNN layers leaves
        the tensor cores idle unless the loop runs under `torch.autocast`. Most training does not need the last
        bits of float32 precision in its matmuls.
    """,
    fix="""
        Allow TF32 for float32 matmuls once at start-up: `torch.set_float32_matmul_precision("high")`; or,
        faster, train under mixed precision: `with torch.autocast("cuda", dtype=torch.bfloat16):` around the
        forward and the loss (with a `GradScaler` for float16).
    """,
    bad=Example(
        """
        model = Net().to("cuda")
        optimizer = torch.optim.AdamW(model.parameters())
        for x, y in loader:
            optimizer.zero_grad()
            criterion(model(x.to("cuda")), y.to("cuda")).backward()
            optimizer.step()
        """,
        unseen={"runtime": _NEEDS_GPU},
    ),
    good=Example(
        """
        torch.set_float32_matmul_precision("high")
        model = Net().to("cuda")
        optimizer = torch.optim.AdamW(model.parameters())
        for x, y in loader:
            optimizer.zero_grad()
            criterion(model(x.to("cuda")), y.to("cuda")).backward()
            optimizer.step()
        """,
        unseen={"runtime": _NEEDS_GPU},
    ),
    details={
        "runtime": """
            When a watched model holds float32 parameters on a CUDA GPU of compute capability 8.0 or newer and
            has matmul layers (`Linear`, attention, RNN, transformer layers), `watch` looks at its training
            forwards: after three of them, all run without autocast while
            `torch.get_float32_matmul_precision()` is `"highest"` (`torch.backends.cuda.matmul.allow_tf32` off),
            it reports once. Quiet: TF32 allowed, autocast on, half-precision models, GPUs before Ampere, and
            models without matmul layers (convolutions use TF32 by default).
        """,
    },
)


def device_of(model: Any) -> Optional[tuple[str, tuple[int, int]]]:
    """(device type, compute capability) of a model's first float32 parameter on a CUDA GPU, else None."""
    import torch

    param = next((p for p in model.parameters() if p.dtype == torch.float32), None)
    if param is None or not param.is_cuda:
        return None
    return "cuda", torch.cuda.get_device_capability(param.device)


@TENSOR_CORES_IDLE.runtime
class TensorCoresIdle(RuntimeCheck):
    """Training forwards of a float32 matmul model on an Ampere+ GPU, without autocast and without TF32."""

    def on_start(self) -> None:
        # label -> device type, or None where this check does not apply; models adopted later (`torchdoctor run`)
        # are looked at on their first forward
        self.devices: dict[str, Optional[str]] = {}
        for wm in self.ctx.models:
            self._classify(wm)
        self.plain: dict[str, int] = {}  # label -> training forwards without autocast; -1 once one had it
        self.reported = False

    def _classify(self, wm: Any) -> Optional[str]:
        found = device_of(wm.inner)
        layers = {type(m).__name__ for m in wm.inner.modules()}
        applies = found is not None and found[1] >= (8, 0) and bool(layers & set(MATMUL_LAYERS))
        self.devices[wm.label] = device = found[0] if found is not None and applies else None
        return device

    def on_forward(self, event: ForwardEvent) -> None:
        label = event.model.label
        device = self.devices[label] if label in self.devices else self._classify(event.model)
        if device is None or not event.grad_enabled or self.plain.get(event.model.label) == -1:
            return
        import torch

        autocast = torch.is_autocast_enabled(device)
        self.plain[event.model.label] = -1 if autocast else self.plain.get(event.model.label, 0) + 1

    def on_step_post(self, event: StepEvent) -> Optional[list[Finding]]:
        if self.reported or not any(self.devices.values()):
            return None  # the every-step path off a GPU with tensor cores: no generator made
        return list(self._judge())

    def _judge(self) -> Iterator[Finding]:
        import torch

        if torch.get_float32_matmul_precision() != "highest" or torch.backends.cuda.matmul.allow_tf32:
            return
        for label, count in self.plain.items():
            if count >= FORWARDS:
                self.reported = True
                yield Finding(
                    f"{label} trains in float32 on a GPU with tensor cores, but TF32 is off for matmuls "
                    f'(float32 matmul precision "highest") and its {count} training forwards so far ran '
                    "without autocast: its Linear/attention matmuls run on the slower float32 units.",
                    fix=Fix(
                        title="Allow TF32 for float32 matmuls once, before training:",
                        code='torch.set_float32_matmul_precision("high")',
                    ),
                    location=Location(module=label),
                )
                return
