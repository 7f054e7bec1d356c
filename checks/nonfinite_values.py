"""nonfinite-values: where NaN/Inf first appears: the step, the parameter, then the first module of the next forward."""

from __future__ import annotations

import functools
import math
import weakref
from typing import Any, Iterator, Optional

from torchdoctor.sdk import Example, Finding, Fix, Location, Pitfall
from torchdoctor.sdk.runtime import (
    ForwardEvent,
    MethodPatch,
    RuntimeCheck,
    StepEvent,
    ZeroGradEvent,
    frame_variables,
    is_library,
    unwrap_optimizer,
    user_frame,
)

_UNNORMALISED_PIXELS = """
import torch
from torch import nn

model = nn.Linear(4, 3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = [(torch.rand(8, 4) * 255, nn.functional.one_hot(torch.randint(0, 3, (8,)), 3).float()) for _ in range(4)]
"""

NONFINITE_VALUES = Pitfall(
    code="TD309",
    name="nonfinite-values",
    severity="error",
    summary="NaN/Inf first appears in the gradients or parameters: the step, the parameter and the module.",
    why="""
        One NaN in a gradient becomes NaN weights after `optimizer.step()`, and from then on every output and
        loss is NaN: the run is lost, and the logs often hide it (some loggers drop or average away NaN losses).
        The first step and place where it appears is what tells a too-high learning rate, an exploding layer,
        a `log(0)` in the loss and bad input data apart.
    """,
    fix="""
        Lower the learning rate or add warm-up, clip gradients, guard divisions and logarithms
        (`torch.log(x + eps)`), check the data for NaN/Inf, and in mixed precision use `GradScaler` (it skips
        steps with non-finite gradients). To find the exact op, run once under `torch.autograd.detect_anomaly()`.
    """,
    bad=Example(
        """
        for x, target in loader:
            optimizer.zero_grad()
            probs = torch.softmax(model(x), dim=1)
            loss = -(target * torch.log(probs)).sum()   # log(0) = -inf when a probability underflows
            loss.backward()
            optimizer.step()
        """,
        setup=_UNNORMALISED_PIXELS,
    ),
    good=Example(
        """
        for x, target in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), target)   # log-softmax inside, numerically safe
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            optimizer.step()
        """,
        setup=_UNNORMALISED_PIXELS,
    ),
    details={
        "runtime": """
            Before each optimizer step it observes (every step of the first 32, then the periodic ones: every
            `every` steps, every `10 * every` after step `100 * every`) `watch` sums the gradient of the
            optimizer's smallest parameter (a bias or normalisation weight) and synchronises once; it checks
            all gradients and all parameters (one fused `torch._foreach_norm` per
            device and dtype) at the periodic steps of the first 32, then every `10 * every` steps and from step
            `100 * every` on every `100 * every`. A NaN
            from the loss or the forward reaches every gradient, so the one that each observed step reads shows
            it at that step; one born in backward that misses it is found at the next full check, or at the next
            observed step once the update has carried it into the weights. When the steps before were not read, the
            message gives the last step whose gradients
            were read finite: the NaN began after it (reading every gradient at every step would cost about 5%
            of a small MLP's step on a CPU). A non-finite norm is confirmed tensor by tensor, so a norm that
            merely overflows is not reported. On the first hit it reports the step and the parameters with
            non-finite gradients (all of them: the loss or the forward was already NaN), then hooks every submodule for
            the next forward only
            and reports the first module whose output is non-finite, that the input batch already holds NaN/Inf,
            that the step already wrote NaN/Inf into the weights, or that the next forward is clean (the batch or
            the loss was the source). On a GPU the per-step flag of that gradient stays on the device (no
            host synchronisation, so the step never waits for the GPU); the flags of the steps in between are
            read together at the next full check, every `every` steps, and the finding names the step where
            NaN/Inf first appeared, which `step()` has by then written into the weights. Steps that `GradScaler`
            skips are watched through `GradScaler.step`: a skipped step costs one read of the gradients, to
            name the first parameter whose gradient is non-finite. Skips are how the scaler calibrates (it halves
            its scale at each), so a skip is evidence against the model only once the scale it ran at is 1 or
            less: the gradients were non-finite without any scaling. When such a skip comes after at least 10
            skipped steps of an optimizer, more than half of its steps, the finding gives the count, the first
            skipped step and that parameter; the overflow skips while the scale calibrates from any
            `init_scale`, and one skip per growth interval later, stay quiet. Without torch's `GradScaler`, 50
            `zero_grad()` calls in a row without a `step()` are reported as a stalled run. It reports once per
            session. [docs/gpu.md](../gpu.md)
            has the cost on a GPU.
        """,
    },
)

_FIX = Fix(
    title="Lower the learning rate, clip gradients (`torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)`), "
    "check the data for NaN/Inf, and guard logs/divisions (`torch.log(x + 1e-8)`); to find the op, run "
    "once under `torch.autograd.detect_anomaly()`."
)
SKIPPED_STEPS = 50  # GradScaler halves its scale per skipped step: 50 skips take any init_scale up to 2**50 below 1
MOSTLY_SKIPPED = 10  # GradScaler skips of one optimizer, more than half of its steps: a finding


class _ScalerSteps:
    """Per optimizer: its GradScaler steps, the skipped ones, and the first skip whose gradients held NaN."""

    def __init__(self) -> None:
        self.total = self.skipped = 0
        self.steps_before = 0
        self.first_skip: Optional[int] = None
        self.first_nonfinite: Optional[tuple[int, str]] = None  # (step, parameter)


def _all_finite(tensors: list[Any]) -> bool:
    """One fused 2-norm per (device, dtype) group and one host sync; NaN and Inf propagate into the norm.
    A non-finite norm is confirmed tensor by tensor, because the norm of large finite values can overflow."""
    import torch

    groups: dict[tuple[Any, Any], list[Any]] = {}
    for t in tensors:
        if not t.is_sparse and t.device.type != "meta":  # a meta tensor has no values to read
            groups.setdefault((t.device, t.dtype), []).append(t)
    for (_, dtype), ts in groups.items():
        norms = torch._foreach_norm(ts, 2, dtype=torch.float32) if dtype == torch.float16 else torch._foreach_norm(ts)
        if bool(torch.isfinite(torch.stack(norms)).all()):
            continue
        if not all(bool(torch.isfinite(t).all()) for t in ts):
            return False
    return True


def _finite_flags(named: list[tuple[str, Any]]) -> list[tuple[list[str], Any]]:
    """The names of each (device, dtype) group with a bool tensor of their finiteness, left on the device:
    queuing the kernels never waits for them (no host sync). The max-abs norm cannot overflow, NaN/Inf stay."""
    import torch

    groups: dict[tuple[Any, Any], list[tuple[str, Any]]] = {}
    for name, t in named:
        if t.device.type == "meta":
            continue
        groups.setdefault((t.device, t.dtype), []).append((name, t))
    flags = []
    for members in groups.values():
        norms = torch._foreach_norm([t for _, t in members], float("inf"))
        flags.append(([name for name, _ in members], torch.isfinite(torch.stack(norms))))
    return flags


def _first_nonfinite(named: list[tuple[str, Any]]) -> Optional[str]:
    import torch

    return next((name for name, t in named if not bool(torch.isfinite(t).all())), None)


def torch_isnan(t: Any) -> Any:
    import torch

    return torch.isnan(t)


def _first_tensor(output: Any, depth: int = 0) -> Any:
    """The first floating tensor in a forward's output (tensor, tuple/list, dict, ModelOutput), else None."""
    if _is_float(output):
        return output
    if depth > 1 or not isinstance(output, (tuple, list, dict)):
        return None
    for item in output.values() if isinstance(output, dict) else output:
        found = _first_tensor(item, depth + 1)
        if found is not None:
            return found
    return None


def _traceback_frames(exc: BaseException) -> list[Any]:
    """The user's frames of an exception's traceback, innermost first (library frames left out)."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        if not is_library(tb.tb_frame):
            frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames[::-1] or [user_frame(0)]


def _nonfinite_locals(frame: Any) -> tuple[list[str], list[str]]:
    """Names of a frame's variables that hold NaN/Inf: (computed with autograd: a one-element tensor, the
    loss, with NaN or Inf, a larger one with NaN, since attention scores are masked with -inf on purpose;
    data without a graph that holds NaN). Tensors of more than 2**26 elements are not read."""
    import torch

    graph: list[str] = []
    data: list[str] = []
    variables = frame_variables(frame)
    for name, value in variables:
        if not _is_float(value) or value.is_sparse or value.numel() > 2**26:
            continue
        try:
            if value.grad_fn is not None and value.numel() == 1:
                if not bool(torch.isfinite(value).all()):
                    graph.append(name)
            elif bool(torch.isnan(value).any()):
                (graph if value.grad_fn is not None else data).append(name)
        except (RuntimeError, TypeError):  # a tensor subclass or a device tensor that cannot be read: skip
            continue
    sizes = dict((name, value.numel()) for name, value in variables if name in graph)
    del variables
    return sorted(graph, key=lambda n: (sizes[n] != 1, n)), data


def _is_float(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor) and value.is_floating_point() and value.device.type != "meta"


@NONFINITE_VALUES.runtime
class NonfiniteValues(RuntimeCheck):
    """Before each observed step, one sum over the smallest gradient (a NaN/Inf loss or forward reaches every
    gradient); over all gradients and all parameters at the PERIODIC steps: reading every gradient each step
    would cost ~5% of a small MLP's step. On the CPU the sum is read at once; on a GPU its flag stays on the
    device and the flags of the steps in between are read together at the next full check, so a step
    without one never waits for the GPU.
    After a hit, hooks on every submodule find the first module with a non-finite output on the next forward.
    `GradScaler` skips a step whose gradients hold NaN/Inf, so a loss that stays NaN shows up only as
    `zero_grad()` calls with no step between them: `SKIPPED_STEPS` in a row are reported."""

    needs_optimizer = True
    needs_forward = False  # it judges gradients; forwards only help to locate

    def on_start(self) -> None:
        self.found = False
        self.step = 0
        self.first_module: Optional[str] = None
        self.bad_input = False
        self.probe: Any = None
        self.input_checked = False
        self.pending: list[tuple[str, int, list[tuple[list[str], Any]]]] = []  # (optimizer, step, finite_flags)
        self.scaled: dict[int, _ScalerSteps] = {}  # per watched optimizer (by id of the torch optimizer)
        self.probes: dict[int, weakref.ref] = {}  # per optimizer: the parameter whose gradient every step reads
        self.read: dict[int, int] = {}  # per optimizer: the last step whose gradients it read (the probe at least)
        self.read_all: dict[int, int] = {}  # ... and all of them
        self.before: tuple[Optional[int], Optional[int]] = (None, None)  # those two before the current step
        self.weights_read: tuple[int, int] = (0, -1)  # (optimizer id, step) whose weights the full check found finite
        self.last_output: Optional[weakref.ref] = None  # the last watched forward's first tensor, weakly
        import torch

        self.tensor_type = torch.Tensor
        self.first_tensor = _first_tensor
        self._watch_grad_scaler()

    def _watch_grad_scaler(self) -> None:
        """Listen to every ``GradScaler.step(optimizer)`` (the class: the scaler is not passed to watch)."""
        import torch

        scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler is not None:  # also with no optimizer yet: they are adopted as they step (`torchdoctor run`)
            self.ctx.hooks.add(
                MethodPatch(scaler, "step", before=self._scaler_step_before, after=self._scaler_step_after)
            )

    def _scaled_optimizer(self, args: tuple, kwargs: dict) -> Any:
        optimizer = args[1] if len(args) > 1 else kwargs.get("optimizer")
        inner = unwrap_optimizer(optimizer)[0]
        return next((wo for wo in self.ctx.optimizers if wo.optimizer is inner), None)

    def _scaler_step_before(self, cls: Any, args: tuple, kwargs: dict) -> None:
        wo = self._scaled_optimizer(args, kwargs)
        if wo is not None:
            self.scaled.setdefault(id(wo.optimizer), _ScalerSteps()).steps_before = wo.steps

    def _scaler_step_after(self, cls: Any, args: tuple, kwargs: dict) -> None:
        """Runs in the user's scaler.step(): counts only, and at most one finding through ctx.emit."""
        try:
            wo = self._scaled_optimizer(args, kwargs)
            st = self.scaled.get(id(wo.optimizer)) if wo is not None else None
            if wo is None or st is None:  # not watched, or adopted inside this very step (`torchdoctor run`)
                return
            st.total += 1
            if wo.steps != st.steps_before:
                return
            st.skipped += 1  # the optimizer's step did not run: GradScaler found Inf/NaN
            st.first_skip = wo.steps if st.first_skip is None else st.first_skip
            if st.first_nonfinite is None:
                grads = [
                    (self.ctx.param_name(p) or f"{wo.label} parameter {i}", p.grad)
                    for i, p in enumerate(wo.params())
                    if p.grad is not None and not p.grad.is_sparse and _is_float(p.grad)
                ]
                name = _first_nonfinite(grads)
                st.first_nonfinite = (wo.steps, name) if name else None
            if self.found or st.skipped < MOSTLY_SKIPPED or 2 * st.skipped <= st.total:
                return
            scale = args[0].get_scale()  # the scale of this step (update() halves it next); step() synced already
            if scale <= 1.0:  # non-finite without any scaling: no calibration skip
                for finding in self._mostly_skipped(wo, st, scale):
                    self.ctx.emit(self, finding)
        except Exception as exc:  # never break the user's scaler.step()
            self.ctx.fault(self, exc)

    def _mostly_skipped(self, wo: Any, st: _ScalerSteps, scale: float) -> Iterator[Finding]:
        step, name = st.first_nonfinite if st.first_nonfinite is not None else (st.first_skip or 0, None)
        where = f", first at step {step} in `{name}`" if name else ""
        self.step = step
        yield from self._hit(
            f"GradScaler skipped {st.skipped} of {st.total} {wo.label}.step() calls (the first at step "
            f"{st.first_skip}) and still skips at scale {scale:g}: the gradients are NaN/Inf without any scaling"
            f"{where}. A NaN/Inf loss or forward, or activations beyond the float16 range, which no scale fixes; "
            "the model is barely training.",
            name,
            step,
        )

    def on_zero_grad(self, event: ZeroGradEvent) -> Optional[Iterator[Finding]]:
        calls = event.optimizer.zero_grads  # since its last step, counted by the session at every call
        if calls - 1 != SKIPPED_STEPS or self.found:
            return None
        self.step = event.optimizer.steps
        return self._hit(
            f"{event.optimizer.label}.step() was skipped {SKIPPED_STEPS} times in a row (zero_grad() ran, "
            "step() did not): GradScaler skips every step whose gradients hold NaN/Inf, and after this many "
            f"halvings its scale has shrunk by 2**{SKIPPED_STEPS}, below 1, so this is a NaN/Inf loss or "
            "forward, not an fp16 overflow; training has stalled.",
            None,
            event.optimizer.steps,
        )

    def on_step_pre(self, event: StepEvent) -> Optional[Iterator[Finding]]:
        if self.found:
            return None
        key = id(event.optimizer)
        probe = self.probes.get(key)
        param = probe() if probe is not None else None
        self.before = (self.read.get(key), self.read_all.get(key))  # for the message: what was read when
        self.read[key] = event.step
        if self.ctx.setup_due(event.step) or param is None:  # all of them: now and then (it reads every weight)
            self.read_all[key] = event.step
            return self._check_step(event, full=True)
        grad = param.grad  # the every-step path: one sum over the smallest gradient (a NaN loss reaches it)
        if grad is None or grad.is_sparse:
            return None
        kind = grad.device.type  # read once: each read builds a torch.device
        if kind == "meta":
            return None
        if kind != "cpu":  # left on the device: read at the next full check, never waited for
            name = self.ctx.param_name(param) or f"{event.optimizer.label} parameter"
            self.pending.append((event.optimizer.label, event.step, _finite_flags([(name, grad)])))
            return None
        if math.isfinite(grad.sum().item()):
            return None
        return self._check_step(event, full=False)

    def _check_step(self, event: StepEvent, full: bool) -> Iterator[Finding]:
        """Every gradient (and, at a full check, the pending device flags first), naming those that are
        not finite; at a full check it also picks the gradient that the steps in between read."""
        if full:
            yield from self._read_pending()
            if self.found:
                return
        params = event.optimizer.params()
        grads = [p.grad for p in params if p.grad is not None]
        floating = [p for p in params if p.grad is not None and not p.grad.is_sparse and p.grad.is_floating_point()]
        if floating:
            self.probes[id(event.optimizer)] = weakref.ref(min(floating, key=lambda p: p.numel()))
        if full and self.ctx.setup_due(event.step):  # PERIODIC follows: read the weights in the same pass
            weights = [p for p in params if p.is_floating_point()]
            if _all_finite(grads + weights):
                self.weights_read = (id(event.optimizer), event.step)
                return
        if not grads or _all_finite(grads):
            return
        probe = self.probes.get(id(event.optimizer))
        probe_id = id(probe()) if probe is not None else None
        named = [
            (self.ctx.param_name(p) or f"{event.optimizer.label} parameter {i}", p.grad, id(p) == probe_id)
            for i, p in enumerate(params)
            if p.grad is not None and not p.grad.is_sparse
        ]
        bad = [(n, is_probe) for n, g, is_probe in named if not bool(g.isfinite().all())]
        scope = (
            f"all {len(named)} parameters have non-finite gradients, so the loss or the forward was already NaN/Inf"
            if len(bad) == len(named)
            else f"{len(bad)} of {len(named)} parameters have non-finite gradients "
            f"(first `{bad[0][0]}`, last `{bad[-1][0]}`)"
        )
        when = f"at step {event.step}"
        probed, all_read = self.before
        last = probed if any(is_probe for _, is_probe in bad) else all_read
        if last is not None and last < event.step - 1:  # steps in between were not read
            when += (
                f" (watch last read {'this gradient' if last == probed else 'all gradients'} at step {last}, finite: "
                "it began at one of the steps since)"
            )
        self.step = event.step
        yield from self._hit(
            f"NaN/Inf first appeared in the gradients {when}: {scope}; "
            f"{event.optimizer.label}.step() is about to write them into the weights.",
            bad[0][0],
            event.step,
        )

    def _read_pending(self) -> Iterator[Finding]:
        """Read the device flags of the steps since the last full check (one host sync) and report the first
        step whose small gradients were not finite."""
        import torch

        pending, self.pending = self.pending, []
        flags = [flag for _, _, groups in pending for _, flag in groups]
        if not flags:
            return
        values = torch.cat([f.to(flags[0].device) for f in flags]).tolist()
        for label, step, groups in pending:
            names = [n for ns, _ in groups for n in ns]
            seen, values = values[: len(names)], values[len(names) :]
            bad = [n for n, ok in zip(names, seen) if not ok]
            if bad:
                self.step = step
                yield from self._hit(
                    f"NaN/Inf first appeared in the gradients at step {step}: {len(bad)} of {len(names)} small "
                    f"parameters (biases, norm weights) have non-finite gradients (first `{bad[0]}`, last "
                    f"`{bad[-1]}`); on a GPU these flags are read at the periodic steps, so "
                    f"{label}.step() has already written them into the weights.",
                    bad[0],
                    step,
                )
                return

    def on_stop(self) -> Iterator[Finding]:
        if not self.found:
            yield from self._read_pending()
        if not self.found:
            yield from self._stopped_on_nonfinite()

    def _stopped_on_nonfinite(self) -> Iterator[Finding]:
        """The step never came: the watched code raised (or called sys.exit) with a NaN/Inf loss or output in
        its variables, or left the loop on one. The user's frames are read once, at the end of the session."""
        exc = self.ctx.exception
        if exc is not None and self.ctx.crash_explained_by:
            return  # a crash explanation already says what ended the run (one cause, one finding)
        frames = _traceback_frames(exc) if exc is not None else [user_frame(0)]
        output = self.last_output() if self.last_output is not None else None
        out_bad = _is_float(output) and bool(torch_isnan(output).any())
        for frame in frames:
            bad, data = _nonfinite_locals(frame)
            if not bad and not (out_bad and frame is frames[-1]):
                continue
            self.found = True
            label = self.ctx.last_forward.label if self.ctx.last_forward is not None else None
            stopped = (
                f"the run stopped ({type(exc).__name__}) before any optimizer step could see it"
                if exc is not None
                else "the loop ended before an optimizer step saw it"
            )
            names = ", ".join(f"`{n}`" for n in bad[:4]) if bad else "the model's output"
            if data:
                origin = (
                    f"the batch already holds NaN ({', '.join(f'`{n}`' for n in data[:3])}): the data is the source"
                )
            elif out_bad and label:
                origin = f"{label}'s last output already held NaN, so the forward or its input is the source"
            elif label and output is not None:
                origin = f"{label}'s last output was finite, so the loss computation made it"
            else:
                origin = ""
            yield Finding(
                f"NaN/Inf reached {names} in `{frame.f_code.co_name}` and {stopped}"
                + (f"; {origin}" if origin else "")
                + ".",
                fix=_FIX,
                location=Location(file=frame.f_code.co_filename, line=frame.f_lineno, module=label, step=self.ctx.step),
            )
            return

    def on_periodic(self, event: StepEvent) -> Iterator[Finding]:
        if self.found or not self.ctx.setup_due(event.step):
            return
        if self.weights_read == (id(event.optimizer), event.step):  # read with the gradients
            return
        params = [p for p in event.optimizer.params() if p.is_floating_point()]
        if not params or _all_finite(params):
            return
        name = _first_nonfinite([(self.ctx.param_name(p) or "?", p) for p in params]) or "?"
        self.step = event.step
        yield from self._hit(
            f"parameter `{name}` holds NaN/Inf at step {event.step} (seen before the step; "
            "the gradients of this step are finite).",
            name,
            event.step,
        )

    def _hit(self, message: str, name: Optional[str], step: int) -> Iterator[Finding]:
        self.found = True
        self._arm_probe()
        yield Finding(message, fix=_FIX, location=Location(param=name, step=step))

    def on_forward(self, event: ForwardEvent) -> Optional[Iterator[Finding]]:
        out = event.output
        if type(out) is not self.tensor_type:  # a tuple, a dict, a ModelOutput: its first tensor
            out = self.first_tensor(out)
        try:
            self.last_output = weakref.ref(out) if out is not None else None  # read only if the run stops on NaN
        except TypeError:
            self.last_output = None
        return None if self.probe is None else self._localise(event)

    def _localise(self, event: ForwardEvent) -> Iterator[Finding]:
        for handle in self.probe:
            self.ctx.hooks.remove(handle)
        self.probe = None
        if self.bad_input:
            where = f"the input batch of {event.model.label} already contains NaN/Inf: the data is the source"
        elif self.first_module and not _all_finite(
            [p for p in event.model.inner.parameters() if p.is_floating_point()]
        ):
            where = (
                f"step {self.step} already wrote NaN/Inf into the weights, so every forward is now non-finite "
                f"from `{self.first_module}` on; the origin is in that step's batch, forward or loss: replay it "
                "under torch.autograd.detect_anomaly()"
            )
        elif self.first_module:
            where = f"on the next forward the first module with a NaN/Inf output was `{self.first_module}`"
        else:
            where = (
                "the next forward produced finite outputs everywhere: the NaN/Inf came from that step's "
                "batch or from the loss (e.g. log(0), 0/0)"
            )
        yield Finding(
            f"NaN/Inf localisation: {where}.",
            fix=_FIX,
            location=Location(module=self.first_module or event.model.label, step=self.ctx.step),
        )

    def _arm_probe(self) -> None:
        """One forward with a finiteness check on every module output and on the root inputs."""
        from torchdoctor.sdk.runtime import dynamo_tracing

        self.tracing = dynamo_tracing
        handles = []
        self.input_checked = False
        for wm in self.ctx.models:
            # the root's input, or the first direct child's where the model is never called as a whole
            for module in (wm.inner, *wm.inner.children()):
                handles.append(self.ctx.hooks.add(module.register_forward_pre_hook(self._check_input)))
            for name, module in wm.inner.named_modules():
                if name:
                    handles.append(
                        self.ctx.hooks.add(
                            module.register_forward_hook(
                                functools.partial(self._check_output, f"{name} ({type(module).__name__})")
                            )
                        )
                    )
        self.probe = handles

    def _check_input(self, module: Any, args: Any) -> None:
        import torch

        if self.input_checked or self.tracing():  # only the first input of the forward is the batch
            return
        self.input_checked = True
        try:
            tensors = [a for a in args if _is_float(a)]
            if tensors and not all(bool(torch.isfinite(t).all()) for t in tensors):
                self.bad_input = True
        except Exception as exc:  # never break the user's forward
            self.ctx.fault(self, exc)

    def _check_output(self, name: str, module: Any, args: Any, output: Any) -> None:
        import torch

        if self.first_module is not None or self.bad_input or self.tracing():  # inlined into a compiled forward
            return
        outs = output if isinstance(output, (tuple, list)) else [output]
        try:
            if any(_is_float(o) and not bool(torch.isfinite(o).all()) for o in outs):
                self.first_module = name
        except Exception as exc:  # never break the user's forward
            self.first_module = "?"
            self.ctx.fault(self, exc)
