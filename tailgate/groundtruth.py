"""A ground-truth OpenAI-compatible streaming server with a per-chunk write log.

A load generator's gaps and TTFTs can only be trusted as far as its own timing error is known. This
server emits ``/v1/completions`` streams in vLLM's wire format on an exact, absolute schedule and logs
the instant each content chunk was handed to the kernel, so a client's receive times can be compared
with the server's write times chunk by chunk. The same precision makes it a fake server for tests:
faults (HTTP errors, dropped connections, stalls of a chosen length, malformed events, coalesced
writes) are injected per request through a control endpoint.

Stdlib only (asyncio protocols and a small HTTP/1.1 parser) so that it starts in a fresh interpreter,
runs beside the load generator in a separate process, and adds no framework overhead to what it
measures.

Clock: every time here is ``time.monotonic_ns()``. On Linux, ``time.perf_counter()`` and
``time.monotonic()`` both read ``CLOCK_MONOTONIC``, so a client on the same host may subtract its
``perf_counter_ns()`` or ``monotonic_ns()`` receive times from the write times logged here directly.

Run it as ``python -m tailgate.groundtruth --port 0 --port-file PATH --chunk-log PATH`` or from a test
through :func:`start_server_process`.

Endpoints
    ``POST /v1/completions``: streams ``max_tokens`` content chunks (one token each, text ``" w"``), the
    first at ``ttft_ms`` after the request body was read, then one every ``gap_ms``, each on an absolute
    target; then the usage chunk (with ``stream_options.include_usage``), ``data: [DONE]`` and the
    terminating HTTP chunk. Prompt tokens are the prompt's whitespace-separated words. Without
    ``stream`` the whole JSON body goes out at the last token's target.
    ``GET /health``, ``/v1/models``, ``/version``, ``/metrics`` (vLLM's metric names, real counts).
    ``GET /_chunklog``: ``{"chunks": [[seq, index, written_ns]], "chunk_targets": [...],
    "chunk_write_begin": [...], "requests": [[seq, body_received_ns, first_write_ns]], ...}``; the
    same document is written to ``--chunk-log`` on SIGTERM/SIGINT. Serving it blocks the loop for as
    long as it takes to render, so fetch it between measurements.
    ``GET /_control`` shows the settings and, under ``last_authorization``, the last ``Authorization``
    header each client-facing path received (so a test can see what credentials reached the server);
    ``POST /_control`` changes the settings (see :meth:`GroundTruthServer.apply_control`).

Request numbers (``seq``, also the response id ``cmpl-<seq>``) count ``/v1/completions`` requests
from 0; other endpoints do not advance them.

Faults (``{"faults": [{"match": ..., "kind": ..., ...params}]}``; ``match`` is ``{"seq": n | [n, ...]}``,
``{"every": n, "offset": r}`` (seq % n == r), ``{"prompt_tokens": n}`` (at least n), ``{"all": true}``,
or several of these together; ``"times": n`` stops a fault after n requests):

- ``http_429`` / ``http_500`` / ``http_503``: vLLM's JSON error body; ``retry_after`` (429, default 1),
  ``message``, ``type``, ``delay_ms``.
- ``close_before_headers``: read the request, close with no response; ``rst`` resets instead,
  ``delay_ms``.
- ``headers_never``: read the request, never answer; the socket stays open until the client closes.
- ``cut_mid_stream``: after ``after_chunks`` content chunks, at the next chunk's target, close with no
  ``[DONE]`` and no terminating chunk; ``rst`` resets instead of a clean close.
- ``malformed_json``: ``data: {not json`` just before content chunk ``at_chunk``.
- ``stall``: content chunk ``at_chunk`` and all after it move ``stall_ms`` later (null, or at least
  ``FOREVER_MS``: never).
- ``error_event``: at chunk ``at_chunk``, ``data: {"error": {...}}`` then ``[DONE]`` instead of the rest,
  as vLLM does when its engine fails mid-stream; ``message``, ``type``, ``code``.
- ``keepalive_comments``: ``: ping`` SSE comments every ``interval_ms`` (default: the gap), offset by
  half an interval so they fall between content chunks; ``comment`` sets the text.
- ``multi_event_writes``: ``events_per_write`` consecutive content chunks go out in one write at the
  last one's target; ``same_http_chunk`` puts them in one HTTP chunk too. The log gives each the
  write's time.

The first matching fault of the first five kinds replaces the response; every matching fault of the
others shapes a streaming response.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import heapq
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = [
    "DEFAULT_MODEL",
    "FAULT_KINDS",
    "ControlError",
    "GroundTruthServer",
    "HttpError",
    "RequestHead",
    "ServerProcess",
    "Settings",
    "main",
    "parse_request_head",
    "start_server_process",
]

DEFAULT_MODEL = "ground-truth"
DEFAULT_TTFT_MS = 20.0
DEFAULT_GAP_MS = 10.0
DEFAULT_MAX_TOKENS = 16
"""What vLLM uses when a completions request names no ``max_tokens``."""
TOKEN_TEXT = " w"
"""Every token's text. Constant so that a stream's chunk bytes are rendered once per request."""
FOREVER_MS = 1e9
"""A ``stall_ms`` at or above this (about 11 days), or null, never resumes the stream."""
MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
KV_CAPACITY_TOKENS = 1_000_000
"""Denominator of ``vllm:kv_cache_usage_perc``: tokens held by running requests over this."""

TERMINAL_FAULTS = ("http_429", "http_500", "http_503", "close_before_headers", "headers_never")
"""Faults that replace the response: the first matching one wins."""
STREAM_FAULTS = (
    "cut_mid_stream",
    "malformed_json",
    "stall",
    "error_event",
    "keepalive_comments",
    "multi_event_writes",
)
"""Faults that shape a streaming response: every matching one applies."""
FAULT_KINDS = TERMINAL_FAULTS + STREAM_FAULTS

_HTTP_FAULT_STATUS = {"http_429": 429, "http_500": 500, "http_503": 503}
_HTTP_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Payload Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}
_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_SSE_DONE = b"data: [DONE]\n\n"
_SSE_MALFORMED = b"data: {not json\n\n"
_CHUNK_END = b"0\r\n\r\n"
_MATCH_KEYS = frozenset({"seq", "every", "offset", "prompt_tokens", "all"})
_CONTROL_KEYS = frozenset(
    {
        "ttft_ms",
        "gap_ms",
        "model",
        "accept_any_model",
        "preemptions_total",
        "healthy",
        "kv_capacity_tokens",
        "faults",
        "script",
        "reset_chunklog",
        "reset_seq",
    }
)

_monotonic_ns = time.monotonic_ns


# --------------------------------------------------------------------------------------------- HTTP


class HttpError(Exception):
    """A request the server refuses at the HTTP level; the connection is closed after the reply."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(slots=True)
class RequestHead:
    method: str
    target: str
    path: str
    query: str
    version: str
    headers: dict[str, str]
    content_length: int
    keep_alive: bool


def _check_request_line(line: str) -> tuple[str, str, str]:
    parts = line.split(" ")
    if len(parts) != 3:
        raise HttpError(400, "malformed request line")
    method, target, version = parts
    if not method or any(c not in _TOKEN_CHARS for c in method):
        raise HttpError(400, "malformed method")
    if not target.startswith("/") or any(ord(c) <= 0x20 or ord(c) >= 0x7F for c in target):
        raise HttpError(400, "malformed request target")
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        if version.startswith("HTTP/") and version[5:6].isdigit():
            raise HttpError(505, "unsupported HTTP version")
        raise HttpError(400, "malformed HTTP version")
    return method, target, version


def parse_request_head(head: bytes) -> RequestHead:
    """Parse a request line and headers (without the blank line that ends them).

    Strict where leniency would hide a client bug from the tests that use this server: anything
    that is not a well-formed HTTP/1.x request raises :class:`HttpError` (400, or 501 for request
    bodies in a transfer coding, which no OpenAI client sends).
    """
    text = head.decode("latin-1")
    lines = text.split("\r\n")
    method, target, version = _check_request_line(lines[0])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or any(c not in _TOKEN_CHARS for c in name):
            raise HttpError(400, "malformed header line")
        key = name.lower()
        value = value.strip(" \t")
        if key in headers:
            if key == "content-length" and headers[key] != value:
                raise HttpError(400, "conflicting Content-Length headers")
            if key != "content-length":
                value = headers[key] + ", " + value
        headers[key] = value
    if "transfer-encoding" in headers:
        raise HttpError(501, "request bodies with a Transfer-Encoding are not supported")
    raw_length = headers.get("content-length", "0")
    if not raw_length.isdigit() or not raw_length.isascii():
        raise HttpError(400, "malformed Content-Length")
    content_length = int(raw_length)
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    keep_alive = "close" not in tokens if version == "HTTP/1.1" else "keep-alive" in tokens
    path, _, query = target.partition("?")
    return RequestHead(method, target, path, query, version, headers, content_length, keep_alive)


_date_cache: list[Any] = [0, b""]


def _http_date() -> bytes:
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[0] = now
        _date_cache[1] = formatdate(now, usegmt=True).encode("ascii")
    return _date_cache[1]


def _response_head(status: int, headers: Sequence[tuple[str, str]], keep_alive: bool) -> bytes:
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, "Unknown").encode("ascii"))]
    lines.append(b"date: " + _http_date() + b"\r\n")
    lines.append(b"server: groundtruth\r\n")
    for name, value in headers:
        lines.append(f"{name}: {value}\r\n".encode("latin-1"))
    if not keep_alive:
        lines.append(b"connection: close\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


def _full_response(
    status: int,
    body: bytes,
    content_type: str,
    keep_alive: bool,
    extra: Sequence[tuple[str, str]] = (),
) -> bytes:
    headers = [("content-type", content_type), ("content-length", str(len(body))), *extra]
    return _response_head(status, headers, keep_alive) + body


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def _error_body(status: int, message: str, error_type: str | None = None, param: str | None = None) -> bytes:
    """vLLM's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = error_type or _HTTP_ERROR_TYPES.get(status, "Error")
    return _json_bytes({"error": {"message": message, "type": kind, "param": param, "code": status}})


def _chunk_frame(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _raw_frame(payload: bytes) -> bytes:
    return payload


# ------------------------------------------------------------------------------------------- control


class ControlError(ValueError):
    """A control document that cannot be applied; nothing of it was applied."""


@dataclass(slots=True)
class _Fault:
    kind: str
    match: dict[str, Any]
    params: dict[str, Any]
    times: int | None
    hits: int = 0

    def matches(self, seq: int, prompt_tokens: int) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        m = self.match
        if "seq" in m:
            want = m["seq"]
            if (seq not in want) if isinstance(want, list) else seq != want:
                return False
        if "every" in m and seq % m["every"] != m.get("offset", 0):
            return False
        return not ("prompt_tokens" in m and prompt_tokens < m["prompt_tokens"])

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"match": self.match, "kind": self.kind, **self.params, "hits": self.hits}
        if self.times is not None:
            out["times"] = self.times
        return out


def _number(doc: Mapping[str, Any], key: str, default: float | None, minimum: float = 0.0) -> float | None:
    value = doc.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise ControlError(f"{key} must be a number >= {minimum}, got {value!r}")
    return float(value)


def _integer(doc: Mapping[str, Any], key: str, default: int, minimum: int = 0) -> int:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ControlError(f"{key} must be an integer >= {minimum}, got {value!r}")
    return value


def _compile_fault(doc: Any) -> _Fault:
    if not isinstance(doc, dict):
        raise ControlError(f"a fault must be an object, got {doc!r}")
    kind = doc.get("kind")
    if kind not in FAULT_KINDS:
        raise ControlError(f"unknown fault kind {kind!r}; known: {', '.join(FAULT_KINDS)}")
    match = doc.get("match", {"all": True})
    if not isinstance(match, dict) or not match or not set(match) <= _MATCH_KEYS:
        raise ControlError(f"match must be an object with keys among {sorted(_MATCH_KEYS)}, got {match!r}")
    seq = match.get("seq")
    if seq is not None and not (
        (isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0)
        or (isinstance(seq, list) and all(isinstance(s, int) and s >= 0 for s in seq))
    ):
        raise ControlError(f"match.seq must be a request number or a list of them, got {seq!r}")
    if "every" in match:
        _integer(match, "every", 1, minimum=1)
        _integer(match, "offset", 0)
    if "prompt_tokens" in match:
        _integer(match, "prompt_tokens", 0)
    if "all" in match and match["all"] is not True:
        raise ControlError("match.all must be true")
    params = {k: v for k, v in doc.items() if k not in ("kind", "match", "times")}
    times = doc.get("times")
    if times is not None:
        times = _integer(doc, "times", 0, minimum=1)
    _validate_fault_params(kind, params)
    return _Fault(kind, dict(match), params, times)


def _validate_fault_params(kind: str, p: dict[str, Any]) -> None:
    allowed: dict[str, set[str]] = {
        "http_429": {"message", "delay_ms", "retry_after", "type"},
        "http_500": {"message", "delay_ms", "type"},
        "http_503": {"message", "delay_ms", "type"},
        "close_before_headers": {"delay_ms", "rst"},
        "headers_never": set(),
        "cut_mid_stream": {"after_chunks", "rst"},
        "malformed_json": {"at_chunk"},
        "stall": {"at_chunk", "stall_ms"},
        "error_event": {"at_chunk", "message", "type", "code"},
        "keepalive_comments": {"interval_ms", "comment"},
        "multi_event_writes": {"events_per_write", "same_http_chunk"},
    }
    extra = set(p) - allowed[kind]
    if extra:
        raise ControlError(f"{kind} takes no {sorted(extra)}; it takes {sorted(allowed[kind])}")
    _number(p, "delay_ms", 0.0)
    for key in ("after_chunks", "at_chunk"):
        _integer(p, key, 0)
    _number(p, "stall_ms", 0.0)
    _number(p, "interval_ms", None, minimum=0.1)
    _integer(p, "events_per_write", 2, minimum=1)
    _integer(p, "code", 500)
    for key in ("message", "type", "comment"):
        if key in p and not isinstance(p[key], str):
            raise ControlError(f"{key} must be a string")
    if "comment" in p and ("\n" in p["comment"] or "\r" in p["comment"]):
        raise ControlError("comment must be one line")
    if "retry_after" in p and not isinstance(p["retry_after"], int | float | str):
        raise ControlError("retry_after must be a number or a string")


def _compile_script(doc: Any) -> dict[int, list[int]]:
    """Per-request schedules ``{"schedules": {"seq": [ttft_ms, gap1_ms, ...]}}`` as cumulative ns offsets."""
    if not isinstance(doc, dict) or not set(doc) <= {"schedules"}:
        raise ControlError('a script must be {"schedules": {"<seq>": [ttft_ms, gap_ms, ...]}}')
    schedules = doc.get("schedules", {})
    if not isinstance(schedules, dict):
        raise ControlError("script.schedules must be an object")
    out: dict[int, list[int]] = {}
    for key, gaps in schedules.items():
        try:
            seq = int(key)
        except (TypeError, ValueError):
            raise ControlError(f"schedule key {key!r} is not a request number") from None
        if (
            not isinstance(gaps, list)
            or not gaps
            or not all(isinstance(g, int | float) and not isinstance(g, bool) and g >= 0 for g in gaps)
        ):
            raise ControlError(f"schedule {key!r} must be a non-empty list of non-negative ms")
        offsets: list[int] = []
        acc = 0
        for g in gaps:
            acc += round(g * 1_000_000)
            offsets.append(acc)
        out[seq] = offsets
    return out


@dataclass(slots=True)
class Settings:
    """What new requests are served with. A change reaches requests that arrive after it."""

    ttft_ms: float = DEFAULT_TTFT_MS
    gap_ms: float = DEFAULT_GAP_MS
    model: str = DEFAULT_MODEL
    accept_any_model: bool = False
    """vLLM answers 404 for an unknown model name; this lets any name through."""
    preemptions_total: float = 0.0
    """The value ``/metrics`` reports for ``vllm:num_preemptions_total``; set it to test deltas and resets."""
    healthy: bool = True
    """False makes ``/health`` answer 503, as vLLM does when its engine died."""
    kv_capacity_tokens: int = KV_CAPACITY_TOKENS
    faults: list[_Fault] = field(default_factory=list)
    schedules: dict[int, list[int]] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {
            "ttft_ms": self.ttft_ms,
            "gap_ms": self.gap_ms,
            "model": self.model,
            "accept_any_model": self.accept_any_model,
            "preemptions_total": self.preemptions_total,
            "healthy": self.healthy,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "faults": [f.describe() for f in self.faults],
            "scripted_requests": sorted(self.schedules),
        }


# ------------------------------------------------------------------------------------------- logging


class ChunkLog:
    """Per-chunk write times in flat integer arrays.

    Appending five machine integers per chunk costs a fraction of a microsecond and allocates no
    Python objects, so logging every chunk does not perturb the timing it records. The response id
    of a row is ``cmpl-<seq>``. The dump keeps ``chunks`` as ``[seq, index, written ns]`` rows and puts
    the targets and the before-write stamps in lists parallel to it.
    """

    __slots__ = ("backpressured", "begin_ns", "idx", "requests", "seq", "t_ns", "target_ns")

    def __init__(self) -> None:
        self.seq = array("q")
        self.idx = array("q")
        self.t_ns = array("q")
        """Right after the write call returned: the time the comparison uses."""
        self.begin_ns = array("q")
        """Right before the write call: the bytes left between this and ``t_ns``. A reader on another
        core can receive them before ``t_ns`` (by the syscall's duration, or by much more if this
        process was preempted in between), never before ``begin_ns``."""
        self.target_ns = array("q")
        self.requests: dict[int, list[int]] = {}
        """seq -> [body received ns, first write ns or -1]."""
        self.backpressured = 0
        """Writes that left bytes in the transport's buffer: their logged time is a hand-off to
        asyncio, not to the kernel (the client was not reading fast enough)."""

    def __len__(self) -> int:
        return len(self.seq)

    def dump(self) -> dict[str, Any]:
        return {
            "clock": "CLOCK_MONOTONIC (time.monotonic_ns)",
            "pid": os.getpid(),
            "chunks": [list(r) for r in zip(self.seq, self.idx, self.t_ns, strict=True)],
            "chunk_targets": list(self.target_ns),
            "chunk_write_begin": list(self.begin_ns),
            "requests": [[s, r[0], r[1] if r[1] >= 0 else None] for s, r in self.requests.items()],
            "backpressured_writes": self.backpressured,
        }


# ------------------------------------------------------------------------------------------- streams


class _Timers:
    """Every stream's next write in one heap of ``(target_ns, order, stream)``, under one asyncio timer.

    An asyncio timer per chunk costs a ``TimerHandle`` and heap comparisons made in Python; tuples of
    integers compare in C. A stream has at most one entry at a time; a stream that ended is skipped
    when its entry comes up rather than searched for. One pass runs at most as many entries as were
    in the heap when it began, so a server that has fallen behind still reads sockets between passes.
    """

    __slots__ = ("heap", "in_pass", "loop", "order", "timer", "when")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.heap: list[tuple[int, int, _Stream]] = []
        self.order = 0
        self.timer: asyncio.TimerHandle | None = None
        self.when = 0
        self.in_pass = False

    def push(self, target: int, stream: _Stream) -> None:
        self.order += 1
        heapq.heappush(self.heap, (target, self.order, stream))
        if not self.in_pass and (self.timer is None or target < self.when):
            self.arm()

    def arm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.heap:
            self.when = self.heap[0][0]
            self.timer = self.loop.call_at(self.when * 1e-9, self.run_due)

    def run_due(self) -> None:
        self.timer = None
        self.in_pass = True
        heap = self.heap
        budget = len(heap)
        now = _monotonic_ns()
        # asyncio fired this timer because the first entry is due (to its float rounding): run it.
        first = True
        try:
            while heap and budget > 0 and (first or heap[0][0] <= now):
                first = False
                budget -= 1
                stream = heapq.heappop(heap)[2]
                if not stream.ended:
                    stream.fire()
                now = _monotonic_ns()
        finally:
            self.in_pass = False
            self.arm()


@dataclass(slots=True)
class _Plan:
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


class _Stream:
    """One completion being generated: a chain of writes on absolute targets.

    Target k is ``body received + ttft + k * gap`` (or the request's script), never "previous write
    + gap", so a late wake-up delays one chunk and not every chunk after it. The chunk bytes are
    rendered once per request; the fault-free path writes a prebuilt bytes object per chunk.
    """

    __slots__ = (
        "base_ns",
        "body",
        "conn",
        "ended",
        "first_ns",
        "frame",
        "gap_ns",
        "k",
        "last",
        "last_event",
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
        server: GroundTruthServer,
        conn: _Connection,
        seq: int,
        n: int,
        prompt_tokens: int,
        base_ns: int,
        ttft_ns: int,
        gap_ns: int,
        script: list[int] | None,
        plan: _Plan | None,
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
        self.frame: Callable[[bytes], bytes] = _chunk_frame if conn.chunked else _raw_frame
        self.mid_event = b""
        self.last_event = b""
        self.mid = b""
        self.last = b""
        self.tail = b""
        self.body = b""

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
        return self.base_ns + offset + self.shift_ns

    def schedule(self, k: int) -> None:
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

    def start(self) -> None:
        self.server.waiting += 1
        self.server.active.add(self)
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
        t0 = _monotonic_ns()
        tr.write(self.last if last else self.mid)
        t = _monotonic_ns()
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
            tr.write(frame(plan.error_event) + frame(_SSE_DONE) + (_CHUNK_END if self.conn.chunked else b""))
            self.finish()
            return
        if k in plan.malformed:
            self.pending_events.append(_SSE_MALFORMED)
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
        t0 = _monotonic_ns()
        tr.write(data)
        t = _monotonic_ns()
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
        self.request_row[1] = _monotonic_ns()
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


# ------------------------------------------------------------------------------------------ protocol


class _Connection(asyncio.Protocol):
    """One client connection: parse a request, answer it, then the next one if kept alive."""

    def __init__(self, server: GroundTruthServer) -> None:
        self.server = server
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.buf = bytearray()
        self.head: RequestHead | None = None
        self.busy = False
        self.closed = False
        self.keep_alive = True
        self.chunked = True
        self.in_process = False
        self.stream: _Stream | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # asyncio already disables Nagle; set it explicitly so a chunk never waits for an ACK.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.stream is not None:
            self.stream.end()
        self.server.connections.discard(self)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.buf += data
        if not self.busy:
            self.process()

    def eof_received(self) -> bool | None:
        """The client is gone (as uvicorn reads an EOF): let the transport close and end any stream.

        Keeping a half-closed socket open would leave a stalled or never-answered stream running
        forever, since nothing is written to it that could fail.
        """
        self.closed = True
        return None

    def process(self) -> None:
        """Parse and dispatch as many complete requests as the buffer holds, one at a time."""
        if self.in_process:
            return
        self.in_process = True
        try:
            while not self.busy and not self.closed:
                if self.head is None:
                    end = self.buf.find(b"\r\n\r\n")
                    if end < 0:
                        self.check_partial_head()
                        return
                    try:
                        self.head = parse_request_head(bytes(self.buf[:end]))
                    except HttpError as e:
                        self.reject(e)
                        return
                    del self.buf[: end + 4]
                    if self.head.content_length > MAX_BODY_BYTES:
                        self.reject(HttpError(413, "request body too large"))
                        return
                    if (
                        self.head.headers.get("expect", "").lower() == "100-continue"
                        and len(self.buf) < self.head.content_length
                    ):
                        # curl sends this for bodies over 1 KiB and waits a second unless answered.
                        self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                head = self.head
                if len(self.buf) < head.content_length:
                    return
                recv_ns = _monotonic_ns()
                body = bytes(self.buf[: head.content_length])
                del self.buf[: head.content_length]
                self.head = None
                self.busy = True
                self.keep_alive = head.keep_alive
                self.chunked = head.version == "HTTP/1.1"
                self.server.dispatch(self, head, body, recv_ns)
        finally:
            self.in_process = False

    def check_partial_head(self) -> None:
        """Reject garbage as soon as its first line is complete, not when the client gives up."""
        if len(self.buf) > MAX_HEAD_BYTES:
            self.reject(HttpError(431, "request head too large"))
            return
        nl = self.buf.find(b"\n")
        if nl >= 0:
            line = bytes(self.buf[:nl])
            try:
                if not line.endswith(b"\r"):
                    raise HttpError(400, "request line must end with CRLF")
                _check_request_line(line[:-1].decode("latin-1"))
            except HttpError as e:
                self.reject(e)

    def reject(self, e: HttpError) -> None:
        body = b"Invalid HTTP request received." if e.status == 400 else _error_body(e.status, e.message)
        ctype = "text/plain; charset=utf-8" if e.status == 400 else "application/json"
        self.busy = True
        self.keep_alive = False
        self.transport.write(_full_response(e.status, body, ctype, keep_alive=False))
        self.close()

    def send(self, data: bytes) -> None:
        """Write a whole response and move on to the next request."""
        if self.closed:
            return
        self.transport.write(data)
        self.response_done()

    def response_done(self) -> None:
        self.busy = False
        if self.closed:
            return
        if not self.keep_alive:
            self.close()
            return
        if self.buf:
            self.process()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.close()

    def drop(self, rst: bool) -> None:
        """End the connection with no further bytes: FIN after what was written, or RST at once."""
        if self.closed:
            return
        if rst:
            sock = self.transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            self.closed = True
            self.transport.abort()
        else:
            self.close()


# -------------------------------------------------------------------------------------------- server


class GroundTruthServer:
    """The server inside one event loop; :func:`main` runs it as a process.

    Usable in-process too (``await server.start()``), but a benchmark should run it in its own
    process so that the load generator's CPU use cannot delay the writes it is measured against.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        chunk_log_path: str | Path | None = None,
    ) -> None:
        self.settings = settings or Settings()
        self.host = host
        self.requested_port = port
        self.chunk_log_path = Path(chunk_log_path) if chunk_log_path else None
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.timers: _Timers = None  # type: ignore[assignment]
        self.log = ChunkLog()
        self.connections: set[_Connection] = set()
        self.active: set[_Stream] = set()
        self.next_seq = 0
        self.waiting = 0
        self.running = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_done = 0
        self.requests_total = 0
        self.last_authorization: dict[str, str] = {}
        """Path -> the last ``Authorization`` header a request to it carried (``/_*`` paths excluded)."""
        self.started_wall = time.time()
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> int:
        """Listen and return the port (the chosen one when 0 was asked for)."""
        self.loop = asyncio.get_running_loop()
        self.timers = _Timers(self.loop)
        self._server = await self.loop.create_server(
            lambda: _Connection(self), self.host, self.requested_port, backlog=4096, reuse_address=True
        )
        return self.port

    async def stop(self) -> None:
        """Stop listening, cut every connection, then write the chunk log file."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            if conn.stream is not None:
                conn.stream.end()
            conn.closed = True
            conn.transport.abort()
        await asyncio.sleep(0)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        self.write_chunk_log()

    def write_chunk_log(self) -> None:
        """Write the log atomically, so a reader sees the whole file or none of it."""
        if self.chunk_log_path is None:
            return
        tmp = self.chunk_log_path.with_name(self.chunk_log_path.name + ".tmp")
        tmp.write_bytes(_json_bytes(self.log.dump()))
        os.replace(tmp, self.chunk_log_path)

    # -- control

    def apply_control(self, doc: Any) -> dict[str, Any]:
        """Validate the whole document, then apply it: a bad key changes nothing.

        Keys: ``ttft_ms``, ``gap_ms``, ``model``, ``accept_any_model``, ``preemptions_total``,
        ``healthy``, ``kv_capacity_tokens``, ``faults`` (replaces the plan, hit counts restart),
        ``script`` (``{"schedules": {"<seq>": [ttft_ms, gap_ms, ...]}}``, replaces the schedules; chunks
        past a schedule's end follow ``gap_ms``), ``reset_chunklog`` and ``reset_seq``. Settings reach
        requests that arrive afterwards; streams in flight keep the ones they started with. Returns
        the resulting settings, as ``GET /_control`` does.
        """
        if not isinstance(doc, dict):
            raise ControlError("control body must be a JSON object")
        unknown = set(doc) - _CONTROL_KEYS
        if unknown:
            raise ControlError(f"unknown control keys {sorted(unknown)}; known: {sorted(_CONTROL_KEYS)}")
        s = self.settings
        ttft = _number(doc, "ttft_ms", s.ttft_ms)
        gap = _number(doc, "gap_ms", s.gap_ms)
        preemptions = _number(doc, "preemptions_total", s.preemptions_total)
        kv_capacity = _integer(doc, "kv_capacity_tokens", s.kv_capacity_tokens, minimum=1)
        model = doc.get("model", s.model)
        if not isinstance(model, str) or not model:
            raise ControlError("model must be a non-empty string")
        for key in ("accept_any_model", "healthy", "reset_chunklog", "reset_seq"):
            if key in doc and not isinstance(doc[key], bool):
                raise ControlError(f"{key} must be true or false")
        faults = s.faults
        if "faults" in doc:
            if not isinstance(doc["faults"], list):
                raise ControlError("faults must be a list")
            faults = [_compile_fault(f) for f in doc["faults"]]
        schedules = _compile_script(doc["script"]) if "script" in doc else s.schedules
        assert ttft is not None and gap is not None and preemptions is not None
        s.ttft_ms, s.gap_ms, s.preemptions_total, s.kv_capacity_tokens = ttft, gap, preemptions, kv_capacity
        s.model = model
        s.accept_any_model = doc.get("accept_any_model", s.accept_any_model)
        s.healthy = doc.get("healthy", s.healthy)
        s.faults = faults
        s.schedules = schedules
        if doc.get("reset_chunklog"):
            self.log = ChunkLog()
            for stream in self.active:
                stream.log = self.log
                self.log.requests[stream.seq] = stream.request_row
        if doc.get("reset_seq"):
            self.next_seq = 0
        return self.describe()

    def describe(self) -> dict[str, Any]:
        return {
            **self.settings.describe(),
            "next_seq": self.next_seq,
            "chunks_logged": len(self.log),
            "last_authorization": dict(self.last_authorization),
        }

    # -- metrics

    def metrics_text(self) -> str:
        """vLLM's metric names in the Prometheus text format, as prometheus_client renders them.

        Counters come with their ``_created`` series in a separate gauge family, as vLLM serves them,
        so a scraper that matches on prefixes is caught mistaking one for the other.
        """
        labels = f'{{engine="0",model_name="{_escape_label(self.settings.model)}"}}'
        generated = self.generation_tokens_done + sum(s.k for s in self.active)
        kv = sum(s.kv_tokens for s in self.active) / self.settings.kv_capacity_tokens
        out: list[str] = []

        def counter(name: str, help_text: str, value: float) -> None:
            out.append(f"# HELP vllm:{name}_total {help_text}")
            out.append(f"# TYPE vllm:{name}_total counter")
            out.append(f"vllm:{name}_total{labels} {float(value)!r}")
            out.append(f"# HELP vllm:{name}_created {help_text}")
            out.append(f"# TYPE vllm:{name}_created gauge")
            out.append(f"vllm:{name}_created{labels} {self.started_wall!r}")

        def gauge(name: str, help_text: str, value: float) -> None:
            out.append(f"# HELP vllm:{name} {help_text}")
            out.append(f"# TYPE vllm:{name} gauge")
            out.append(f"vllm:{name}{labels} {float(value)!r}")

        gauge("num_requests_running", "Number of requests in model execution batches.", self.running)
        gauge("num_requests_waiting", "Number of requests waiting to be processed.", self.waiting)
        gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", min(kv, 1.0))
        counter("num_preemptions", "Cumulative number of preemption from the engine.", self.settings.preemptions_total)
        counter("prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens_total)
        counter("generation_tokens", "Number of generation tokens processed.", generated)
        counter("request_success", "Count of successfully processed requests.", self.requests_total)
        return "\n".join(out) + "\n"

    # -- routing

    def dispatch(self, conn: _Connection, head: RequestHead, body: bytes, recv_ns: int) -> None:
        path, method = head.path, head.method
        ka = conn.keep_alive
        auth = head.headers.get("authorization")
        if auth is not None and not path.startswith("/_"):
            self.last_authorization[path] = auth
        if path == "/v1/completions":
            if method != "POST":
                conn.send(_detail(405, ka))
                return
            self.completions(conn, body, recv_ns)
            return
        handlers: dict[str, tuple[str, Callable[[], tuple[int, bytes, str]]]] = {
            "/health": ("GET", self._health),
            "/v1/models": ("GET", self._models),
            "/version": ("GET", lambda: (200, b'{"version":"groundtruth"}', "application/json")),
            "/metrics": ("GET", self._metrics),
            "/_chunklog": ("GET", lambda: (200, _json_bytes(self.log.dump()), "application/json")),
        }
        if path == "/_control":
            if method == "GET":
                conn.send(_full_response(200, _json_bytes(self.describe()), "application/json", ka))
                return
            if method != "POST":
                conn.send(_detail(405, ka))
                return
            try:
                result = self.apply_control(json.loads(body or b"{}"))
            except (ControlError, ValueError) as e:
                conn.send(_full_response(400, _error_body(400, str(e)), "application/json", ka))
                return
            conn.send(_full_response(200, _json_bytes(result), "application/json", ka))
            return
        entry = handlers.get(path)
        if entry is None:
            conn.send(_detail(404, ka))
            return
        if method != entry[0]:
            conn.send(_detail(405, ka))
            return
        status, payload, ctype = entry[1]()
        conn.send(_full_response(status, payload, ctype, ka))

    def _health(self) -> tuple[int, bytes, str]:
        return (200 if self.settings.healthy else 503), b"", "application/json"

    def _models(self) -> tuple[int, bytes, str]:
        m = self.settings.model
        card = {
            "id": m,
            "object": "model",
            "created": int(self.started_wall),
            "owned_by": "vllm",
            "root": m,
            "parent": None,
            "max_model_len": 1_000_000,
        }
        return 200, _json_bytes({"object": "list", "data": [card]}), "application/json"

    def _metrics(self) -> tuple[int, bytes, str]:
        return 200, self.metrics_text().encode("utf-8"), "text/plain; version=0.0.4; charset=utf-8"

    # -- completions

    def completions(self, conn: _Connection, body: bytes, recv_ns: int) -> None:
        seq = self.next_seq
        self.next_seq += 1
        ka = conn.keep_alive
        s = self.settings
        try:
            req = _parse_completion(body, s)
        except HttpError as e:
            conn.send(_full_response(e.status, _error_body(e.status, e.message), "application/json", ka))
            return
        prompt_tokens, max_tokens, stream, include_usage = req
        row = [recv_ns, -1]
        self.log.requests[seq] = row

        terminal: _Fault | None = None
        plan: _Plan | None = None
        for fault in s.faults:
            if not fault.matches(seq, prompt_tokens):
                continue
            if fault.kind in TERMINAL_FAULTS:
                if terminal is None:
                    terminal = fault
                    fault.hits += 1
                continue
            if not stream:
                continue
            fault.hits += 1
            if plan is None:
                plan = _Plan()
            _add_to_plan(plan, fault, s.gap_ms)
        if terminal is not None:
            self._terminal(conn, terminal, recv_ns, row)
            return

        script = s.schedules.get(seq)
        st = _Stream(
            self,
            conn,
            seq,
            max_tokens,
            prompt_tokens,
            recv_ns,
            round(s.ttft_ms * 1_000_000),
            round(s.gap_ms * 1_000_000),
            script,
            plan,
            row,
            stream,
        )
        conn.stream = st
        created = int(time.time())
        model_json = json.dumps(s.model)
        rid = f"cmpl-{seq}"
        if not stream:
            n = max_tokens
            st.body = _full_response(
                200,
                _json_bytes(
                    {
                        "id": rid,
                        "object": "text_completion",
                        "created": created,
                        "model": s.model,
                        "choices": [
                            {
                                "index": 0,
                                "text": TOKEN_TEXT * n,
                                "logprobs": None,
                                "finish_reason": "length",
                                "stop_reason": None,
                                "prompt_logprobs": None,
                            }
                        ],
                        "usage": {
                            "prompt_tokens": prompt_tokens,
                            "total_tokens": prompt_tokens + n,
                            "completion_tokens": n,
                        },
                    }
                ),
                "application/json",
                ka,
            )
            st.start()
            return

        prefix = (
            f'data: {{"id":"{rid}","object":"text_completion","created":{created},"model":{model_json},'
            f'"choices":[{{"index":0,"text":{json.dumps(TOKEN_TEXT)},"logprobs":null,"finish_reason":'
        ).encode()
        st.mid_event = prefix + b'null,"stop_reason":null}]}\n\n'
        st.last_event = prefix + b'"length","stop_reason":null}]}\n\n'
        frame = st.frame
        st.mid = frame(st.mid_event)
        st.last = frame(st.last_event)
        tail = b""
        if include_usage:
            usage = (
                f'data: {{"id":"{rid}","object":"text_completion","created":{created},"model":{model_json},'
                f'"choices":[],"usage":{{"prompt_tokens":{prompt_tokens},'
                f'"total_tokens":{prompt_tokens + max_tokens},"completion_tokens":{max_tokens}}}}}\n\n'
            ).encode()
            tail += frame(usage)
        tail += frame(_SSE_DONE)
        if conn.chunked:
            tail += _CHUNK_END
        st.tail = tail
        headers = [("content-type", "text/event-stream; charset=utf-8")]
        if conn.chunked:
            headers.append(("transfer-encoding", "chunked"))
        else:
            conn.keep_alive = False
        conn.transport.write(_response_head(200, headers, conn.keep_alive))
        st.start()

    def _terminal(self, conn: _Connection, fault: _Fault, recv_ns: int, row: list[int]) -> None:
        p = fault.params
        if fault.kind == "headers_never":
            return  # the connection stays busy; bytes the client sends are buffered and ignored

        def fire() -> None:
            if conn.closed:
                return
            row[1] = _monotonic_ns()
            if fault.kind == "close_before_headers":
                conn.drop(bool(p.get("rst", False)))
                return
            status = _HTTP_FAULT_STATUS[fault.kind]
            extra: list[tuple[str, str]] = []
            if status == 429:
                extra.append(("retry-after", str(p.get("retry_after", 1))))
            message = p.get("message", f"injected {status} ({fault.kind})")
            body = _error_body(status, message, p.get("type"))
            conn.send(_full_response(status, body, "application/json", conn.keep_alive, extra))

        delay_ns = round(float(p.get("delay_ms", 0.0)) * 1_000_000)
        if delay_ns <= 0:
            fire()
        else:
            self.loop.call_at((recv_ns + delay_ns) * 1e-9, fire)


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _detail(status: int, keep_alive: bool) -> bytes:
    """FastAPI's shape for unknown routes and methods, which is what vLLM answers."""
    return _full_response(status, _json_bytes({"detail": _REASONS[status]}), "application/json", keep_alive)


def _parse_completion(body: bytes, s: Settings) -> tuple[int, int, bool, bool]:
    """(prompt tokens, max tokens, stream, include usage), or the 4xx vLLM would answer."""
    try:
        req = json.loads(body)
    except ValueError:
        raise HttpError(400, "request body is not valid JSON") from None
    if not isinstance(req, dict):
        raise HttpError(400, "request body must be a JSON object")
    model = req.get("model")
    if model is not None and model != s.model and not s.accept_any_model:
        raise HttpError(404, f"The model `{model}` does not exist.")
    prompt = req.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        prompt_tokens = len(prompt.split())
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        prompt_tokens = len(prompt)
    else:
        raise HttpError(400, "prompt must be a string, a list of one string, or a list of token ids")
    max_tokens = req.get("max_tokens", DEFAULT_MAX_TOKENS)
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise HttpError(400, f"max_tokens must be at least 1, got {max_tokens!r}")
    stream = req.get("stream", False)
    if not isinstance(stream, bool):
        raise HttpError(400, "stream must be a boolean")
    options = req.get("stream_options")
    if options is not None:
        if not stream:
            raise HttpError(400, "Stream options can only be defined when `stream=True`.")
        if not isinstance(options, dict):
            raise HttpError(400, "stream_options must be an object")
    include_usage = bool(options and options.get("include_usage"))
    return prompt_tokens, max_tokens, stream, include_usage


def _add_to_plan(plan: _Plan, fault: _Fault, gap_ms: float) -> None:
    p = fault.params
    kind = fault.kind
    if kind == "cut_mid_stream":
        after = int(p.get("after_chunks", 1))
        plan.cut_after = after if plan.cut_after is None else min(plan.cut_after, after)
        plan.cut_rst = bool(p.get("rst", False))
    elif kind == "malformed_json":
        plan.malformed.add(int(p.get("at_chunk", 1)))
    elif kind == "stall":
        stall_ms = p.get("stall_ms", 1000.0)
        at = int(p.get("at_chunk", 1))
        forever = stall_ms is None or stall_ms >= FOREVER_MS
        plan.stalls[at] = None if forever else round(float(stall_ms) * 1_000_000)
    elif kind == "error_event":
        at = int(p.get("at_chunk", 1))
        plan.error_at = at if plan.error_at is None else min(plan.error_at, at)
        code = int(p.get("code", 500))
        error = {
            "error": {
                "message": p.get("message", "injected engine error"),
                "type": p.get("type", _HTTP_ERROR_TYPES.get(code, "InternalServerError")),
                "param": None,
                "code": code,
            }
        }
        plan.error_event = b"data: " + json.dumps(error).encode("utf-8") + b"\n\n"
    elif kind == "keepalive_comments":
        interval_ms = p.get("interval_ms") or gap_ms
        plan.ping_interval_ns = max(100_000, round(float(interval_ms) * 1_000_000))
        plan.ping_event = b": " + str(p.get("comment", "ping")).encode("utf-8") + b"\n\n"
    elif kind == "multi_event_writes":
        plan.group = int(p.get("events_per_write", 3))
        plan.same_http_chunk = bool(p.get("same_http_chunk", False))


# ---------------------------------------------------------------------------------------- subprocess


class ServerProcess:
    """A ground-truth server running in a child process, with a small stdlib client for it.

    Talks to the server through ``http.client`` so that tests of another client never depend on
    that client to set up or inspect the server.
    """

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        host: str,
        port: int,
        chunk_log_path: Path,
        stderr_path: Path,
        workdir: tempfile.TemporaryDirectory[str] | None,
    ) -> None:
        self.proc = proc
        self.host = host
        self.port = port
        self.chunk_log_path = chunk_log_path
        self.stderr_path = stderr_path
        self._workdir = workdir

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def request(
        self, method: str, path: str, body: Any = None, timeout: float = 30.0
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            payload = None if body is None else _json_bytes(body)
            headers = {"content-type": "application/json"} if payload is not None else {}
            conn.request(method, path, body=payload, headers=headers)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def control(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Apply a control document; raises ``ValueError`` with the server's message if refused."""
        status, _, data = self.request("POST", "/_control", dict(changes))
        doc = json.loads(data)
        if status != 200:
            raise ValueError(doc.get("error", {}).get("message", data.decode("utf-8", "replace")))
        return doc

    def metrics(self) -> str:
        return self.request("GET", "/metrics")[2].decode("utf-8")

    def dump(self) -> dict[str, Any]:
        """The full log: live from the server, or from the file it wrote when it stopped."""
        if self.proc.poll() is None:
            return json.loads(self.request("GET", "/_chunklog")[2])
        return json.loads(self.chunk_log_path.read_bytes())

    def chunk_log(self) -> list[list[int]]:
        """``[seq, chunk index, write time ns]`` for every content chunk written, in write order."""
        return self.dump()["chunks"]

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM (the server writes its chunk log and exits), SIGKILL if it does not."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)

    def close(self) -> None:
        self.stop()
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def start_server_process(
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    ttft_ms: float = DEFAULT_TTFT_MS,
    gap_ms: float = DEFAULT_GAP_MS,
    model: str = DEFAULT_MODEL,
    accept_any_model: bool = False,
    script: Mapping[str, Any] | str | Path | None = None,
    chunk_log: str | Path | None = None,
    startup_timeout_s: float = 20.0,
    python: str = sys.executable,
) -> ServerProcess:
    """Start ``python -m tailgate.groundtruth`` and return once it listens (its port file exists).

    Files the caller does not name (port file, chunk log, stderr, script) go to a temporary folder
    that :meth:`ServerProcess.close` removes; a named ``chunk_log`` is left in place.
    """
    workdir = tempfile.TemporaryDirectory(prefix="groundtruth-")
    wd = Path(workdir.name)
    port_file = wd / "port"
    log_path = Path(chunk_log) if chunk_log is not None else wd / "chunklog.json"
    stderr_path = wd / "stderr.txt"
    args = [
        python,
        "-m",
        "tailgate.groundtruth",
        "--host",
        host,
        "--port",
        str(port),
        "--port-file",
        str(port_file),
        "--chunk-log",
        str(log_path),
        "--ttft-ms",
        str(ttft_ms),
        "--gap-ms",
        str(gap_ms),
        "--model",
        model,
    ]
    if accept_any_model:
        args.append("--accept-any-model")
    if script is not None:
        if isinstance(script, Mapping):
            script_path = wd / "script.json"
            script_path.write_text(json.dumps(dict(script)), encoding="utf-8")
        else:
            script_path = Path(script)
        args += ["--script", str(script_path)]
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env)
    deadline = time.monotonic() + startup_timeout_s
    while True:
        if port_file.exists():
            text = port_file.read_text(encoding="ascii").strip()
            if text:
                return ServerProcess(proc, host, int(text), log_path, stderr_path, workdir)
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            tail = stderr_path.read_text(encoding="utf-8", errors="replace")[-2000:]
            workdir.cleanup()
            raise RuntimeError(f"ground-truth server did not start (exit {proc.returncode}): {tail}")
        time.sleep(0.01)


# ------------------------------------------------------------------------------------------------ CLI


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


async def _serve(args: argparse.Namespace) -> None:
    settings = Settings(
        ttft_ms=args.ttft_ms,
        gap_ms=args.gap_ms,
        model=args.model,
        accept_any_model=args.accept_any_model,
    )
    server = GroundTruthServer(settings, args.host, args.port, args.chunk_log)
    if args.script:
        server.apply_control({"script": json.loads(Path(args.script).read_text(encoding="utf-8"))})
    await server.start()
    # Startup objects never become garbage: keep full collections from walking them mid-run.
    gc.collect()
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except NotImplementedError:  # no loop signal handlers on this platform
            signal.signal(sig, lambda *_: loop.call_soon_threadsafe(stop.set))
    if args.port_file:
        _write_atomic(Path(args.port_file), f"{server.port}\n")
    print(f"groundtruth listening on {args.host}:{server.port} pid {os.getpid()}", file=sys.stderr, flush=True)
    await stop.wait()
    await server.stop()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tailgate.groundtruth",
        description="Ground-truth OpenAI-compatible streaming server with a per-chunk write-time log.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (see --port-file)")
    p.add_argument("--port-file", help="written with the listening port once the server accepts connections")
    p.add_argument("--chunk-log", help="JSON file the chunk and request logs are written to on shutdown")
    p.add_argument("--ttft-ms", type=float, default=DEFAULT_TTFT_MS)
    p.add_argument("--gap-ms", type=float, default=DEFAULT_GAP_MS)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--accept-any-model", action="store_true", help="do not answer 404 for other model names")
    p.add_argument("--script", help='JSON file {"schedules": {"<seq>": [ttft_ms, gap_ms, ...]}}')
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
