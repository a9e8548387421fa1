"""One response on an absolute schedule: timers, the per-request plan and the stream that writes it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from .settings import ChunkLog
from .timers import Timers
from .wire import CHUNK_END, SSE_DONE, SSE_MALFORMED, chunk_frame, monotonic_ns, raw_frame

if TYPE_CHECKING:
    from .engine import EngineRequest


class StreamConnection(Protocol):
    """The connection a stream writes to (the server's ``Connection``)."""

    transport: asyncio.Transport
    chunked: bool
    stream: Stream | None

    def response_done(self) -> None: ...

    def drop(self, rst: bool) -> None: ...


class StreamServer(Protocol):
    """The server state a stream reads and counts into (the ``GroundTruthServer``)."""

    loop: asyncio.AbstractEventLoop
    log: ChunkLog
    timers: Timers
    active: set[Stream]
    waiting: int
    running: int
    prompt_tokens_total: int
    generation_tokens_done: int
    requests_total: int
    pause_window: tuple[int, int]
    """Monotonic ns ``[start, end)`` in which no chunk is written: each waits for ``end`` (a server-wide pause)."""

    def engine_submit(self, req: EngineRequest) -> None: ...

    def engine_cancel(self, req: EngineRequest) -> None: ...


# ------------------------------------------------------------------------------------------- streams


@dataclass(slots=True)
class Plan:
    """How the stream-shaping faults that matched one request change its stream."""

    stalls: dict[int, int | None] = field(default_factory=dict)
    malformed: set[int] = field(default_factory=set)
    error_at: int | None = None
    error_event: bytes = b""
    cut_after: int | None = None
    cut_rst: bool = False
    group: int = 1
    same_http_chunk: bool = False
    ping_interval_ns: int | None = None
    ping_event: bytes = b": ping\n\n"


class Stream:
    """One completion being generated: a chain of writes on absolute targets.

    Target k is ``body received + ttft + k * gap`` (or the request's script), never "previous write
    + gap", so a late wake-up delays one chunk and not every chunk after it. The chunk bytes are
    rendered once per request; the fault-free path writes a prebuilt bytes object per chunk.
    """

    __slots__ = (
        "base_ns",
        "body",
        "conn",
        "delay_s",
        "ended",
        "engine_req",
        "first_ns",
        "frame",
        "gap_ns",
        "k",
        "last",
        "last_event",
        "lead",
        "log",
        "loop",
        "mid",
        "mid_event",
        "n",
        "pending_events",
        "pending_idx",
        "pending_targets",
        "ping_handle",
        "plan",
        "prompt_tokens",
        "request_row",
        "running",
        "script",
        "seq",
        "server",
        "shift_ns",
        "streaming",
        "tail",
        "target",
        "transport",
        "ttft_ns",
    )

    def __init__(
        self,
        server: StreamServer,
        conn: StreamConnection,
        seq: int,
        n: int,
        prompt_tokens: int,
        base_ns: int,
        ttft_ns: int,
        gap_ns: int,
        script: list[int] | None,
        plan: Plan | None,
        request_row: list[int],
        streaming: bool,
    ) -> None:
        self.server = server
        self.conn = conn
        self.transport = conn.transport
        self.loop = server.loop
        self.log = server.log
        self.seq = seq
        self.n = n
        self.k = 0
        self.prompt_tokens = prompt_tokens
        self.base_ns = base_ns
        self.ttft_ns = ttft_ns
        self.gap_ns = gap_ns
        self.script = script
        self.shift_ns = 0
        self.plan = plan
        self.request_row = request_row
        self.streaming = streaming
        self.ping_handle: asyncio.TimerHandle | None = None
        self.running = False
        self.ended = False
        self.first_ns = -1
        self.target = 0
        self.pending_events: list[bytes] = []
        self.pending_idx: list[int] = []
        self.pending_targets: list[int] = []
        self.frame: Callable[[bytes], bytes] = chunk_frame if conn.chunked else raw_frame
        self.mid_event = b""
        self.last_event = b""
        self.mid = b""
        self.last = b""
        self.tail = b""
        self.body = b""
        self.lead = b""
        """Written just before the first content chunk (a chat stream's role-only delta)."""
        self.engine_req: EngineRequest | None = None
        """Set when the simulated engine decides this stream's token times."""
        self.delay_s = 0.0
        """How long each write then holds the event loop (``Settings.write_delay_us``): 0 but in tests."""

    # -- schedule

    def target_ns(self, k: int) -> int | None:
        """Absolute target of chunk k, moved by any stall before it; None when stalled forever."""
        plan = self.plan
        if plan is not None and k in plan.stalls:
            stall = plan.stalls[k]
            if stall is None:
                return None
            self.shift_ns += stall
        script = self.script
        if script is None:
            offset = self.ttft_ns + k * self.gap_ns
        elif k < len(script):
            offset = script[k]
        else:
            offset = script[-1] + (k - len(script) + 1) * self.gap_ns
        target = self.base_ns + offset + self.shift_ns
        start, end = self.server.pause_window
        if start <= target < end:  # the server pauses: this chunk and every later one move by what is left
            self.shift_ns += end - target
            target = end
        return target

    def schedule(self, k: int) -> None:
        if self.engine_req is not None:
            return  # the engine's step ends fire this stream
        target = self.target_ns(k)
        if target is None:
            return
        self.target = target
        self.server.timers.push(target, self)

    def fire(self) -> None:
        if self.streaming:
            self.tick()
        else:
            self.tick_whole()
        if self.delay_s:
            time.sleep(self.delay_s)  # the whole loop waits: every later write runs late, as on a saturated core

    def start(self) -> None:
        self.server.waiting += 1
        self.server.active.add(self)
        if self.engine_req is not None:
            self.server.engine_submit(self.engine_req)
            return
        plan = self.plan
        if plan is not None and plan.ping_interval_ns:
            self.ping_handle = self.loop.call_at(
                (self.base_ns + plan.ping_interval_ns // 2) * 1e-9, self.ping, self.base_ns
            )
        self.schedule(0)

    # -- writes

    def tick(self) -> None:
        """Write content chunk k: the hot path, one transport write and five array appends."""
        if self.plan is not None:
            self.tick_planned()
            return
        k = self.k
        last = k == self.n - 1
        tr = self.transport
        if k == 0 and self.lead:
            tr.write(self.lead)
        t0 = monotonic_ns()
        tr.write(self.last if last else self.mid)
        t = monotonic_ns()
        log = self.log
        log.seq.append(self.seq)
        log.idx.append(k)
        log.t_ns.append(t)
        log.begin_ns.append(t0)
        log.target_ns.append(self.target)
        if tr.get_write_buffer_size():
            log.backpressured += 1
        self.k = k + 1
        if k == 0:
            self.first_token(t)
        if last:
            tr.write(self.tail)
            self.finish()
        else:
            self.schedule(k + 1)

    def tick_planned(self) -> None:
        plan = self.plan
        assert plan is not None
        k = self.k
        tr = self.transport
        if plan.cut_after == k:
            self.end()
            self.conn.drop(plan.cut_rst)
            return
        if plan.error_at == k:
            frame = self.frame
            tr.write(frame(plan.error_event) + frame(SSE_DONE) + (CHUNK_END if self.conn.chunked else b""))
            self.finish()
            return
        if k in plan.malformed:
            self.pending_events.append(SSE_MALFORMED)
        last = k == self.n - 1
        self.pending_events.append(self.last_event if last else self.mid_event)
        self.pending_idx.append(k)
        self.pending_targets.append(self.target)
        self.k = k + 1
        if len(self.pending_idx) < plan.group and not last:
            self.schedule(k + 1)
            return
        events = self.pending_events
        if plan.same_http_chunk:
            data = self.frame(b"".join(events))
        else:
            data = b"".join([self.frame(e) for e in events])
        t0 = monotonic_ns()
        tr.write(data)
        t = monotonic_ns()
        log = self.log
        for idx, target in zip(self.pending_idx, self.pending_targets, strict=True):
            log.seq.append(self.seq)
            log.idx.append(idx)
            log.t_ns.append(t)
            log.begin_ns.append(t0)
            log.target_ns.append(target)
        if tr.get_write_buffer_size():
            log.backpressured += 1
        if self.pending_idx[0] == 0:
            self.first_token(t)
        self.pending_events = []
        self.pending_idx = []
        self.pending_targets = []
        if last:
            tr.write(self.tail)
            self.finish()
        else:
            self.schedule(k + 1)

    def tick_whole(self) -> None:
        """Non-streaming: mark the first token at its target, write the whole body at the last one's."""
        if not self.running:
            self.first_token(-1)
            if self.n > 1:
                self.schedule(self.n - 1)
                return
        self.k = self.n
        self.transport.write(self.body)
        self.request_row[1] = monotonic_ns()
        self.finish()

    def ping(self, phase_ns: int) -> None:
        if self.ended:
            return
        plan = self.plan
        assert plan is not None and plan.ping_interval_ns is not None
        self.transport.write(self.frame(plan.ping_event))
        nxt = phase_ns + plan.ping_interval_ns
        self.ping_handle = self.loop.call_at((nxt + plan.ping_interval_ns // 2) * 1e-9, self.ping, nxt)

    # -- bookkeeping

    def first_token(self, t: int) -> None:
        self.first_ns = t
        if t >= 0:
            self.request_row[1] = t
        self.running = True
        server = self.server
        server.waiting -= 1
        server.running += 1
        server.prompt_tokens_total += self.prompt_tokens

    def end(self) -> None:
        """Leave the server's books; called exactly once whatever ended the stream."""
        if self.ended:
            return
        self.ended = True
        if self.ping_handle is not None:
            self.ping_handle.cancel()
            self.ping_handle = None
        server = self.server
        server.active.discard(self)
        if self.engine_req is not None and self.k < self.n:
            server.engine_cancel(self.engine_req)
        if self.running:
            server.running -= 1
        else:
            server.waiting -= 1
        server.generation_tokens_done += self.k
        self.conn.stream = None

    def finish(self) -> None:
        if self.k == self.n:
            self.server.requests_total += 1
        self.end()
        self.conn.response_done()

    @property
    def kv_tokens(self) -> int:
        return self.prompt_tokens + self.k if self.running else 0
