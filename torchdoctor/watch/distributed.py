"""`watch` under torch.distributed: a private gloo side group whose every operation has a timeout, the
per-step fingerprints (parameters, buffers, input batches) that the ``ddp_*`` checks compare across
ranks, and the report gathered to rank 0 when the session ends.

The job's own process groups are never used: collectives of ours on them could interleave with the
user's and deadlock. The side group is built on the default store under a prefix of its own, so c10d's
group numbering is untouched. Every message travels in chunks of one fixed size (16 KiB: a header and
data), and every rank learns from the first chunks how many follow, so ranks that reach different
exchange points (one stopping while another is still at a step) still exchange chunks of equal size:
they never trip gloo's size checks, which abort the process; they read each other's headers and stop
comparing. A rank that is late past the timeout, or gone, ends the
exchanges for the rest of the session; training goes on.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import struct
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
from torch import nn

from torchdoctor import registry
from torchdoctor.findings import Finding
from torchdoctor.findings import merge_ranks as merge_findings
from torchdoctor.watch.calls import dynamo_tracing
from torchdoctor.watch.fingerprint import batch_sums, digest
from torchdoctor.wrappers import wrapper_chain

if TYPE_CHECKING:
    from torchdoctor.watch.context import WatchContext
    from torchdoctor.watch.contract import RuntimeCheck, StepEvent

logger = logging.getLogger("torchdoctor")

TIMEOUT_ENV = "TORCHDOCTOR_WATCH_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0
AFTER_ERROR_TIMEOUT_S = 5.0  # at the end of a session whose body raised: the others may be stuck elsewhere
CHUNK_BYTES = 1 << 14
_HEADER = struct.Struct("<4sB3xIIIq")  # magic, kind, chunk index, chunks, payload length, step (or -1)
_MAGIC = b"TDw1"
PERIODIC, STOP = 1, 2
_sessions = itertools.count()
_exchanges: dict[int, "RankExchange"] = {}


def exchange_timeout() -> float:
    """Seconds a rank waits for the others (``TORCHDOCTOR_WATCH_TIMEOUT``, default 60)."""
    text = os.environ.get(TIMEOUT_ENV)
    if text is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value > 0 and math.isfinite(value)):
        logger.warning(
            "torchdoctor: %s=%r is not a positive number of seconds; using %g", TIMEOUT_ENV, text, DEFAULT_TIMEOUT_S
        )
        return DEFAULT_TIMEOUT_S
    return value


@dataclasses.dataclass
class Message:
    """What one rank sent in an exchange."""

    kind: int
    step: int
    payload: bytes


class SideGroup:
    """A gloo process group of torchdoctor's own; `exchange` all-gathers one payload per rank or gives up."""

    def __init__(self, rank: int, world_size: int, timeout: float) -> None:
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self.trouble: Optional[str] = None  # why the group cannot be used (any more)
        self._pg: Any = None
        self._prefix = f"torchdoctor/watch/{next(_sessions)}"  # the n-th session: the same name on every rank

    def _connect(self) -> Any:
        if self._pg is None and self.trouble is None:
            from torch.distributed.distributed_c10d import PrefixStore, ProcessGroupGloo, _get_default_store

            try:
                store = PrefixStore(self._prefix, _get_default_store())
                self._pg = ProcessGroupGloo(store, self.rank, self.world_size, timedelta(seconds=self.timeout))
            except Exception as exc:
                self.trouble = (
                    f"the other ranks did not join torchdoctor's side group within {self.timeout:g} s "
                    f"({_short(exc)}); is watch() called on every rank?"
                )
        return self._pg

    def exchange(
        self, kind: int, step: int, payload: bytes, timeout: Optional[float] = None
    ) -> Optional[list[Message]]:
        """Every rank's message (index = rank), or None when a rank is late past the timeout or gone."""
        pg = self._connect()
        if pg is None:
            return None
        room = CHUNK_BYTES - _HEADER.size
        chunks = max(1, -(-len(payload) // room))
        try:
            first = self._gather(pg, self._chunk(kind, 0, chunks, payload, step, room), timeout)
            headers = [_HEADER.unpack_from(c) for c in first]
            if any(h[0] != _MAGIC for h in headers):
                raise ValueError("a rank sent a chunk torchdoctor cannot read")
            parts = [[c[_HEADER.size :]] for c in first]
            for index in range(
                1, max(h[3] for h in headers)
            ):  # the same count on every rank: they saw the same headers
                for rank, c in enumerate(
                    self._gather(pg, self._chunk(kind, index, chunks, payload, step, room), timeout)
                ):
                    parts[rank].append(c[_HEADER.size :])
        except Exception as exc:  # timeout, a closed connection, or garbage: give up for good
            waited = min(timeout or self.timeout, self.timeout)
            self.trouble = f"another rank did not join the exchange within {waited:g} s, or is gone ({_short(exc)})"
            self.close()
            return None
        return [Message(h[1], h[5], b"".join(p)[: h[4]]) for h, p in zip(headers, parts)]

    def _chunk(self, kind: int, index: int, chunks: int, payload: bytes, step: int, room: int) -> torch.Tensor:
        data = payload[index * room : (index + 1) * room]
        buf = bytearray(CHUNK_BYTES)
        _HEADER.pack_into(buf, 0, _MAGIC, kind, index, chunks, len(payload), step)
        buf[_HEADER.size : _HEADER.size + len(data)] = data
        return torch.frombuffer(buf, dtype=torch.uint8)

    def _gather(self, pg: Any, chunk: torch.Tensor, timeout: Optional[float]) -> list[bytes]:
        from torch.distributed.distributed_c10d import AllgatherOptions

        out = [torch.empty(CHUNK_BYTES, dtype=torch.uint8) for _ in range(self.world_size)]
        opts = AllgatherOptions()
        opts.timeout = timedelta(seconds=min(timeout or self.timeout, self.timeout))
        pg.allgather([out], [chunk], opts).wait()
        return [bytes(t.numpy()) for t in out]

    def close(self) -> None:
        """Release the group's connections and threads (the other ranks' next exchange then fails at once)."""
        pg, self._pg = self._pg, None
        if pg is not None and self.trouble is None:
            self.trouble = "closed"
        shutdown = getattr(pg, "shutdown", None)
        if shutdown is not None:
            try:
                shutdown()
            except Exception:  # already broken: nothing more to release
                pass


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if text.startswith("[") and "] " in text:  # gloo prefixes its source position
        text = text.split("] ", 1)[1]
    return text.split(". This is typically", 1)[0][:200]  # gloo's advice about remote crashes


# -- fingerprints ------------------------------------------------------------------------------------


def ddp_over_world(module: nn.Module, world_size: int) -> Optional[nn.parallel.DistributedDataParallel]:
    """The DistributedDataParallel in `module`'s wrapper chain when it spans every rank (else None: a DDP
    over a subgroup, as in hybrid parallelism, legitimately differs from the ranks outside it)."""
    for wrapper in wrapper_chain(module):
        if isinstance(wrapper, nn.parallel.DistributedDataParallel):
            group = getattr(wrapper, "process_group", None)
            size = group.size() if group is not None else world_size
            return wrapper if size == world_size else None
    return None


def tensor_stats(tensors: list[torch.Tensor]) -> Optional[torch.Tensor]:
    """(sum, sum of squares) of each tensor as one [n, 2] tensor on the first one's device, without a
    host sync; None for no tensors. Reductions run in float32 (float64 for integer and bool buffers), as
    casting every element to float64 costs four times as much on a CPU; the sum of squares is a dot
    product, which needs no temporary tensor."""
    if not tensors:
        return None
    device = tensors[0].device
    sums, squares = [], []
    for t in tensors:
        t = t.detach()
        if t.is_complex():
            t = torch.view_as_real(t)
        if not t.is_floating_point():
            t = t.to(torch.float64)  # integer and bool buffers (counters, masks) are small
        elif t.element_size() < 4:
            t = t.float()  # a half-precision result would differ by an ulp between GPU models
        flat = t.reshape(-1)
        if flat.device != device:
            flat = flat.to(device)
        sums.append(flat.sum())
        squares.append(torch.dot(flat, flat))
    return torch.stack([torch.stack(sums), torch.stack(squares)], 1)  # promoted to float64 if any buffer is


def fingerprint_rows(stats: Optional[torch.Tensor], sizes: list[int]) -> list[list[float]]:
    """`tensor_stats` on the host (the one sync), each row with its tensor's size: [sum, sum of squares, numel]."""
    if stats is None:
        return []
    return [[s, q, float(n)] for (s, q), n in zip(stats.double().tolist(), sizes)]


def stats_differ(a: "list[float] | tuple[float, ...]", b: "list[float] | tuple[float, ...]") -> bool:
    """Whether two tensors' (sum, sum of squares, size) show different contents, beyond the 1e-5 that
    another summation order (other hardware) can explain; |sum| <= sqrt(size * sum of squares) sets the
    scale of the sum."""
    (sa, qa, na), (sb, qb, nb) = a, b
    if na != nb:
        return True
    if all(math.isnan(x) for x in (sa, sb)) or (sa == sb and qa == qb):
        return False  # NaNs alike (nonfinite-values reports those) or identical
    squares = max(abs(qa), abs(qb))
    if not math.isfinite(squares):
        return not (sa == sb or (math.isnan(sa) and math.isnan(sb)))
    return abs(sa - sb) > 1e-5 * math.sqrt(max(na, 1) * squares) + 1e-12 or abs(qa - qb) > 1e-5 * squares + 1e-12


@dataclasses.dataclass
class Round:
    """One PERIODIC exchange every rank took part in at the same step: each rank's payload, by rank."""

    step: int
    payloads: list[dict[str, Any]]


class RankExchange:
    """One session's cross-rank state: what to fingerprint, the forward hooks that take batch and buffer
    fingerprints at due steps, the side group, and what the ranks sent."""

    def __init__(self, ctx: "WatchContext") -> None:
        self.ctx = ctx
        self.timeout = exchange_timeout()
        self.group = SideGroup(ctx.rank, ctx.world_size, self.timeout)
        self.parts: set[str] = set()
        self.owners: dict[str, "RuntimeCheck"] = {}  # part -> the check blamed when fingerprinting it fails
        self.models = [(wm, ddp) for wm in ctx.models if (ddp := ddp_over_world(wm.module, ctx.world_size)) is not None]
        self.notes: list[str] = []
        self.providers: dict[str, Callable[[], Any]] = {}  # part -> what a check sends in every exchange
        self.closed = False  # no more exchanges this session
        self.departed: dict[int, dict[str, Any]] = {}  # ranks that ended their session early: their report
        self._round_step: Optional[int] = None
        self._round: Optional[Round] = None
        self._hooks: list[Any] = []  # the armed forward hooks
        self._outer = {id(ddp): ddp for _, ddp in self.models}
        self._inner = {id(ddp.module): ddp for _, ddp in self.models}
        self._data: dict[str, Any] = {}  # {"step": due step, "sums": batch_sums of its first training batch}
        self._buffers: Optional[tuple[int, Optional[torch.Tensor], list[int]]] = None  # (due step, stats, sizes)

    # -- set-up ------------------------------------------------------------------------------------

    def want(self, part: str, owner: "RuntimeCheck") -> bool:
        """Fingerprint `part` ("params", "buffers", "data") for `owner` in every exchange; False when there
        is no DDP model over all ranks to compare."""
        if not self.models:
            return False
        self.parts.add(part)
        self.owners[part] = owner
        if part in ("buffers", "data"):
            self.arm()  # step 0 is due
        return True

    def provide(self, part: str, owner: "RuntimeCheck", payload: Callable[[], Any]) -> bool:
        """Send `payload()` (JSON-able numbers, no tensors) as `part` in every exchange, for `owner`; False when
        there is no DDP model over all ranks."""
        if not self.want(part, owner):
            return False
        self.providers[part] = payload
        return True

    def arm(self) -> None:
        """Install the forward hooks that take the due step's fingerprints (they cost a call per module
        call, so they are only there from the step before a due step until its exchange)."""
        if self._hooks or not self.parts & {"buffers", "data"}:
            return
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        from torchdoctor.watch.handles import WarningFilter

        hooks = self.ctx.hooks
        self._hooks.append(hooks.add(register_module_forward_pre_hook(self._inner_pre_forward)))
        try:
            self._hooks.append(hooks.add(register_module_forward_hook(self._outer_forward, with_kwargs=True)))
        except TypeError:  # torch < 2.2: positional inputs only
            self._hooks.append(
                hooks.add(register_module_forward_hook(lambda m, args, out: self._outer_forward(m, args, {}, out)))
            )
        self._hooks.append(hooks.add(WarningFilter(r"Using `torch.compile\(module\)` when there are global hooks")))

    def disarm(self) -> None:
        while self._hooks:
            self.ctx.hooks.remove(self._hooks.pop())

    def on_step_post(self, event: "StepEvent") -> None:
        """Arm the hooks when the next step of the first optimizer is due."""
        if not self.closed and event.optimizer is self.ctx.optimizers[0] and self.ctx.periodic(event.step + 1):
            self.arm()

    def names(self, what: str) -> tuple[list[str], list[torch.Tensor]]:
        """Names and tensors of the DDP models' parameters or buffers (DDP's ignored ones left out)."""
        names, tensors = [], []
        for wm, ddp in self.models:
            prefix = f"{wm.label}." if len(self.models) > 1 else ""
            ignored = set(getattr(ddp, "parameters_to_ignore", ()) or ())
            items = wm.inner.named_parameters() if what == "params" else wm.inner.named_buffers()
            for name, t in items:
                if name not in ignored:
                    names.append(prefix + name)
                    tensors.append(t)
        return names, tensors

    # -- forward hooks (never raise into the user's forward) ----------------------------------------

    def _due(self, module: nn.Module) -> bool:
        return module.training and torch.is_grad_enabled() and self.ctx.periodic(self.ctx.step)

    def _inner_pre_forward(self, module: nn.Module, args: Any) -> None:
        """Buffers as the inner module starts: after DDP broadcast rank 0's, before BatchNorm updates them."""
        if dynamo_tracing() or id(module) not in self._inner or "buffers" not in self.parts:
            return  # (inlined into a compiled forward, a hook must add nothing to the graph)
        try:
            step = self.ctx.step
            if self._due(module) and (self._buffers is None or self._buffers[0] != step):
                buffers = self.names("buffers")[1]
                self._buffers = (step, tensor_stats(buffers), [b.numel() for b in buffers])
        except Exception as exc:
            self._buffers = None
            self.ctx.fault(self.owners["buffers"], exc)

    def _outer_forward(self, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        """The first training batch of a due step, as fed to DDP."""
        if dynamo_tracing() or id(module) not in self._outer or "data" not in self.parts:
            return
        try:
            step = self.ctx.step
            if self._due(module) and self._data.get("step") != step:
                self._data = {"step": step, "sums": batch_sums((args, kwargs))}
        except Exception as exc:
            self._data = {}
            self.ctx.fault(self.owners["data"], exc)

    # -- exchanges ---------------------------------------------------------------------------------

    def round(self, event: "StepEvent") -> Optional[Round]:
        """The PERIODIC exchange of this step (made once, by the first check that asks), or None when the
        ranks cannot be compared at this step."""
        if self.closed or not self.models or (self.ctx.optimizers and event.optimizer is not self.ctx.optimizers[0]):
            return None
        if self._round_step == event.step:
            return self._round
        self._round_step, self._round = event.step, None
        self.disarm()
        payload = json.dumps(self._payload(event.step)).encode()
        messages = self.group.exchange(PERIODIC, event.step, payload)
        if messages is None:
            self._close(f"rank {self.ctx.rank} gave up comparing ranks at step {event.step}: {self.group.trouble}")
            return None
        stopped = [r for r, m in enumerate(messages) if m.kind == STOP]
        if stopped:
            for r in stopped:
                self.departed[r] = _load(messages[r].payload)
            self._close(
                f"rank(s) {_ranks(stopped)} ended their watch session while rank {self.ctx.rank} was at step "
                f"{event.step}; the ranks are no longer compared",
                quiet=True,
            )
            return None
        if any(m.kind != PERIODIC or m.step != event.step for m in messages):
            return None  # the ranks are at different steps: nothing comparable this time
        self._round = Round(event.step, [_load(m.payload) for m in messages])
        return self._round

    def _payload(self, step: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if "params" in self.parts:
            params = self.names("params")[1]
            out["params"] = fingerprint_rows(tensor_stats(params), [p.numel() for p in params])
        if "buffers" in self.parts and self._buffers is not None and self._buffers[0] == step:
            out["buffers"] = fingerprint_rows(self._buffers[1], self._buffers[2])
        if "data" in self.parts and self._data.get("step") == step:
            out["data"] = digest(self._data["sums"])
        self._buffers, self._data = None, {}  # keep no tensor between steps
        for part, payload in list(self.providers.items()):
            try:
                out[part] = payload()
            except Exception as exc:  # that check's part is sent no more; the exchange goes on
                del self.providers[part]
                self.ctx.fault(self.owners[part], exc)
        return out

    def _close(self, note: str, quiet: bool = False) -> None:
        self.closed = True
        self.disarm()
        self.notes.append(note)
        self.group.close()
        (logger.info if quiet else logger.warning)("torchdoctor: %s", note)

    def finish(self, findings: list[Finding], failed: bool) -> tuple[Optional[list[Finding]], dict[str, Any]]:
        """At the end of the session: send this rank's findings to rank 0 (which merges every rank's into
        one report) and release the side group. Returns (merged findings on rank 0 else None, facts)."""
        rank, world = self.ctx.rank, self.ctx.world_size
        received: dict[int, list[Finding]] = {rank: list(findings)}
        received.update({r: _findings(p) for r, p in self.departed.items()})
        if not self.closed:
            payload = json.dumps({"step": self.ctx.step, "findings": [f.to_dict() for f in findings]}).encode()
            messages = self.group.exchange(STOP, -1, payload, AFTER_ERROR_TIMEOUT_S if failed else None)
            if messages is None:
                self.notes.append(f"rank {rank} could not collect the other ranks' findings: {self.group.trouble}")
            else:
                busy = [r for r, m in enumerate(messages) if m.kind != STOP]
                received.update({r: _findings(_load(m.payload)) for r, m in enumerate(messages) if m.kind == STOP})
                if busy:
                    self.notes.append(
                        f"rank(s) {_ranks(busy)} were still training when rank {rank} ended its "
                        "session; their findings are not in this report"
                    )
            self.group.close()
        missing = sorted(set(range(world)) - set(received))
        facts = {"world_size": world, "reported": sorted(received), "missing": missing, "notes": list(self.notes)}
        if rank != 0:
            return None, facts
        if missing:
            logger.warning(
                "torchdoctor: the report covers rank(s) %s only; rank(s) %s did not send their findings",
                _ranks(sorted(received)),
                _ranks(missing),
            )
        return merge_ranks(received), facts


def _load(payload: bytes) -> dict[str, Any]:
    value = json.loads(payload.decode()) if payload else {}
    return value if isinstance(value, dict) else {}


def _findings(payload: dict[str, Any]) -> list[Finding]:
    return [Finding.from_dict(d) for d in payload.get("findings", [])]


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def merge_ranks(received: dict[int, list[Finding]]) -> list[Finding]:
    """Every rank's findings merged on rank 0 (see `torchdoctor.findings.merge_ranks`)."""
    return merge_findings(received, cross_rank={c.name for c in registry.all_checks(registry.Scope.DISTRIBUTED)})


def exchange_for(ctx: "WatchContext") -> RankExchange:
    """The session's `RankExchange` (made by the first check that asks)."""
    ex = _exchanges.get(id(ctx))
    if ex is None or ex.ctx is not ctx:
        ex = _exchanges[id(ctx)] = RankExchange(ctx)
    return ex


def close_exchange(ctx: "WatchContext") -> None:
    """Release the session's side group without gathering the ranks' findings (`torchdoctor run` does that
    through the launcher's store, which outlives the program's process group); never raises."""
    ex = _exchanges.pop(id(ctx), None)
    if ex is not None and ex.ctx is ctx:  # its hooks went with the session's
        ex.group.close()


def gather_report(
    ctx: "WatchContext", findings: list[Finding], failed: bool = False
) -> tuple[Optional[list[Finding]], dict[str, Any]]:
    """Called by the session at its end on every rank (a point they all reach in the same order): rank 0
    gets every rank's findings merged; never raises."""
    ex = _exchanges.pop(id(ctx), None)
    try:
        if ex is None or ex.ctx is not ctx:
            ex = RankExchange(ctx)
        return ex.finish(findings, failed)
    except Exception as exc:  # the report must not break the user's program
        if ex is not None:
            ex.group.close()
        return None, {"world_size": ctx.world_size, "notes": [f"gathering the ranks' findings failed: {_short(exc)}"]}
