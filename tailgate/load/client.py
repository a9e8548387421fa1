"""One streaming completion over a fresh HTTP/1.1 connection, timed event by event.

A plain ``socket`` is used on purpose: under Locust it is gevent's cooperative socket, with
threads it is the ordinary one, and in both cases nothing sits between a ``recv`` returning and
the timestamp taken for the events it completed (no connection pool to wait on, no line
iterator buffering ahead). A fresh connection per request is what the reference harness does
with ``urllib``, so TTFT includes the same connect cost.

Every outcome is classified: a request either completes with ``[DONE]`` or ends with an
``error_class`` and whatever timing it got before failing.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

from tailgate.load.capture import connection_key
from tailgate.load.payloads import build_chat_payload, build_payload, build_request
from tailgate.load.reads import RECV_BYTES, HubReads, read_stamped
from tailgate.load.rxstamp import (
    CHUNK_STAMP_ENV,
    CHUNK_STAMPS,
    DEFAULT_CHUNK_STAMP,
    PAIR_NS,
    REFRESH_NS,
    SO_TIMESTAMPNS,
    WallToClock,
    chunk_stamp_mode,
    enable_rx_timestamps,
)
from tailgate.load.sse import JSON_STRING, ChunkedDecoder, SSEParser, StreamFormatError, content_template, event_ends
from tailgate.load.target import Target, TargetError, Timeouts
from tailgate.stats import wider_gap

__all__ = [  # the request's parts live beside this module; their names stay importable from here
    "CHUNK_STAMPS",
    "CHUNK_STAMP_ENV",
    "DEFAULT_CHUNK_STAMP",
    "LATE_READ_NS",
    "PAIR_NS",
    "RECV_BYTES",
    "REFRESH_NS",
    "SO_TIMESTAMPNS",
    "TEMPLATE_ATTEMPTS",
    "HubReads",
    "StreamTiming",
    "Target",
    "TargetError",
    "Timeouts",
    "WallToClock",
    "build_chat_payload",
    "build_payload",
    "build_request",
    "chunk_stamp_mode",
    "content_template",
    "event_ends",
    "stream_completion",
]


LATE_READ_NS = 1_000_000
"""A read this long after its newest bytes arrived is late: the client, not the server, set its events' times.
Matches the self-check's 1 ms bound on the client-added error."""

TEMPLATE_ATTEMPTS = 3
"""Decoded content chunks that may propose a fast-path template before a stream gives up on one."""


@dataclass(slots=True)
class StreamTiming:
    """Everything one request observed, in ``perf_counter_ns`` ticks.

    Filled in while the request runs, so a request cancelled half-way still reports what it saw.
    """

    sent_ns: int = 0
    connected_ns: int | None = None
    written_ns: int | None = None
    """When the whole request (head and body) had been handed to the kernel."""
    headers_ns: int | None = None
    first_chunk_ns: int | None = None
    last_chunk_ns: int | None = None
    end_ns: int | None = None
    worst_gap_ns: int = 0
    worst_gap_end_ns: int | None = None
    chunks: int = 0
    done: bool = False
    status: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    response_id: str | None = None
    error_class: str | None = None
    error: str | None = None
    chunk_ns: list[int] | None = field(default=None)
    chunk_delay_ns: list[int] | None = field(default=None)
    """With ``chunk_ns``: each chunk's read delay (``max_read_delay_ns``'s per-read value; -1 unknown), so
    both stamps (``recv`` and ``kernel``) of every chunk can be compared from one run."""
    reads: int = 0
    """``recv`` calls that returned bytes of the response."""
    max_events_per_read: int = 0
    """The most content events one read delivered: above 1, those events share one timestamp."""
    max_read_delay_ns: int | None = None
    """The longest wait between the kernel receiving a read's newest bytes and the read returning (a lower
    bound on how long those bytes sat unread); None where the kernel gives no receive stamps (TLS, not Linux)."""
    late_coalesced_reads: int = 0
    """Reads that delivered two or more content events and came more than ``LATE_READ_NS`` after their newest
    bytes arrived: events the server sent apart may have been merged by a client that read late."""
    conn_key: str | None = None
    """With packet capture: the connection as the capture process names it (``capture.connection_key``)."""
    chunk_last_bytes: list[int] | None = None
    """With packet capture: each content chunk's last byte, as an offset into the response, so it can be
    given the arrival of the segment that carried it (``capture.chunk_times``)."""
    stamp: str | None = None
    """What the chunk times are: ``capture``, ``kernel`` or ``recv`` (set when the record is built)."""
    read_chunk_ns: list[int] | None = None
    """With ``chunk_ns`` and capture: the in-process stamps the capture replaced, for the self-check."""


class _Failure(Exception):
    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message


def _literal_family(host: str) -> int | None:
    """The address family of a numeric host, None for a name that needs resolving."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        return family
    return None


def _connect(target: Target, timeout: float) -> socket.socket:
    """Connect; a numeric host skips ``getaddrinfo``.

    Under gevent, ``create_connection`` resolves through a thread pool even for an IP literal: a
    hand-off to another OS thread and back per request, which competes for the GIL with the loop
    that is timestamping other streams.
    """
    family = _literal_family(target.host)
    if family is None:
        sock = socket.create_connection((target.host, target.port), timeout=timeout)
    else:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect((target.host, target.port))
        except BaseException:
            sock.close()
            raise
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if target.scheme == "https":
        ctx = ssl.create_default_context()
        sock = ctx.wrap_socket(sock, server_hostname=target.host)
    return sock


def _error_message(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        if isinstance(err, dict):
            text = str(err.get("message") or err)
        else:
            text = str(err)
    except (ValueError, RecursionError):  # a deeply nested body is still just an unreadable message
        pass
    return text[:300]


def _token_count(usage: dict[str, Any], key: str, event: bytes) -> int | None:
    """A usage count as the record schema holds it (an int), or the event is malformed."""
    value = usage.get(key)
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise _Failure("malformed_event", f"usage.{key} is not an integer: {event[:80]!r}")


def _redact(text: str, secret: str) -> str:
    """``text`` without ``secret`` or any start of it 8+ characters long (a message cut mid-key).

    Servers and gateways sometimes quote the credential they rejected; what they say ends up in
    records and logs, where the key must never appear.
    """
    for n in range(len(secret), min(len(secret), 8) - 1, -1):
        if secret[:n] in text:
            text = text.replace(secret[:n], "<redacted>")
    return text


def stream_completion(
    target: Target,
    body: bytes,
    timing: StreamTiming,
    *,
    timeouts: Timeouts = Timeouts(),
    api_key: str | None = None,
    record_chunks: bool = False,
    request: bytes | None = None,
    write: Callable[[socket.socket, bytes], int] | None = None,
    stamp: str = DEFAULT_CHUNK_STAMP,
    capture: bool = False,
) -> StreamTiming:
    """Send one streaming completion and fill ``timing``; never raises for request failures.

    ``request`` is the prebuilt request (:func:`build_request`), else it is built from ``body`` here.
    ``write`` hands the request bytes to whoever decides when they go out (a gated batch writes its
    requests in trace order from one place); it returns when they were written, or raises what the
    write raised. ``stamp`` picks the instant given to a read's events (see ``CHUNK_STAMPS``); ``capture``
    also notes the connection and where each chunk ends in the response, for packet-capture stamps (not
    over TLS, whose bytes on the wire are not the response's).

    Only non-``Exception`` interruptions (a greenlet being killed, Ctrl-C) propagate, after
    ``timing`` is marked ``cancelled`` so the caller can still write its record.
    """
    clock = time.perf_counter_ns
    if request is None:
        request = build_request(target, body, api_key)
    stall_s = timeouts.stall_s or timeouts.request_s
    if record_chunks:
        timing.chunk_ns = []
        timing.chunk_delay_ns = []
    sock: socket.socket | None = None
    kernel_stamp = stamp == "kernel"
    timing.sent_ns = clock()
    deadline = timing.sent_ns + int(timeouts.request_s * 1e9)
    phase = "connect"
    try:
        try:
            sock = _connect(target, timeouts.connect_s)
        except ConnectionRefusedError:
            where = f"{target.host}:{target.port}"
            raise _Failure("connection_refused", f"connection refused by {where}") from None
        except TimeoutError:
            raise _Failure("connect_timeout", f"no connection within {timeouts.connect_s:g} s") from None
        except ssl.SSLError as e:
            raise _Failure("tls_error", str(e) or type(e).__name__) from None
        except OSError as e:
            raise _Failure("connect_error", f"{type(e).__name__}: {e}") from None
        timing.connected_ns = clock()
        phase = "headers"
        timestamps = enable_rx_timestamps(sock)
        last_bytes: list[int] | None = None
        if capture and target.scheme != "https":
            timing.conn_key = connection_key(sock.getpeername()[:2], sock.getsockname()[:2])
            timing.chunk_last_bytes = last_bytes = []
        if write is None:
            sock.sendall(request)
            timing.written_ns = clock()
        else:
            timing.written_ns = write(sock, request)

        # --- status line and headers
        buf = b""
        read_ns = 0
        while True:
            remaining = (deadline - clock()) / 1e9
            if remaining <= 0:
                raise _Failure("headers_timeout", f"no response headers within {timeouts.request_s:g} s")
            sock.settimeout(remaining)
            data, read_ns, delay = read_stamped(sock, timestamps, clock)
            if not data:
                raise _Failure("connection_closed", "server closed the connection before sending headers")
            buf += data
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(buf) > 65536:
                raise _Failure("bad_response", "response headers exceed 64 KiB")
        timing.headers_ns = read_ns
        head_lines = buf[:end].decode("latin-1").split("\r\n")
        rest = buf[end + 4 :]
        code = head_lines[0].split(" ", 2)[1] if head_lines[0].count(" ") else ""
        if not (len(code) == 3 and code.isascii() and code.isdigit() and code[0] in "12345"):
            raise _Failure("bad_response", f"bad status line {head_lines[0][:80]!r}")
        status = int(code)
        timing.status = status
        headers: dict[str, str] = {}
        for line in head_lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        to_read = int(length) if length and length.isascii() and length.isdigit() and not chunked else None

        if status != 200:
            phase = "error_body"
            body_bytes = rest
            sock.settimeout(min(5.0, max(0.1, (deadline - clock()) / 1e9)))
            try:
                while (to_read is None or len(body_bytes) < to_read) and len(body_bytes) < 65536:
                    data = sock.recv(RECV_BYTES)
                    if not data:
                        break
                    body_bytes += data
            except OSError:
                pass
            if chunked:
                try:
                    body_bytes = ChunkedDecoder().feed(body_bytes)
                except StreamFormatError:
                    pass
            raise _Failure(f"http_{status}", _error_message(body_bytes) or f"HTTP {status}")

        # --- the event stream
        phase = "stream"
        decoder = ChunkedDecoder() if chunked else None
        parser = SSEParser()
        loads = json.loads
        string_literal = JSON_STRING.fullmatch
        prefix = suffix = b""
        fixed = 0  # len(prefix) + len(suffix); 0 while there is no template
        attempts = TEMPLATE_ATTEMPTS
        raw_pos = end + 4  # where the next read starts in the response
        tail = b""  # the previous read's last byte: an event's blank line may be split between two reads
        received = 0
        late_ns = LATE_READ_NS

        def take(data: bytes, read_ns: int, delay: int | None) -> bool:
            """One read's events, all at the read's instant; True when the response is complete."""
            nonlocal prefix, suffix, fixed, attempts, raw_pos, tail, received
            received += len(data)
            timing.reads += 1
            if delay is not None and (timing.max_read_delay_ns is None or delay > timing.max_read_delay_ns):
                timing.max_read_delay_ns = delay
            # one instant for every event of this read: when the read returned, or when the kernel
            # received its newest bytes; parsing the read's events must not spread their stamps. Only
            # the read's first event can end a gap (the others follow it at 0), so the gap, the count
            # and the chunk stamps are updated once per read, after its events (in a finally: a bad
            # event still leaves the chunks before it counted)
            now = read_ns - delay if kernel_stamp and delay is not None else read_ns
            content = others = 0
            payload = decoder.feed(data) if decoder is not None else data
            try:
                for event in parser.feed(payload) if payload else ():
                    # fast path: a content chunk like the template (see content_template); no decode
                    if (
                        fixed
                        and len(event) > fixed
                        and event.startswith(prefix)
                        and event.endswith(suffix)
                        and event.isascii()
                        and string_literal(event, len(prefix), len(event) - len(suffix)) is not None
                    ):
                        content += 1
                        continue
                    if event == b"[DONE]":
                        timing.done = True
                        others += 1
                        continue
                    try:
                        obj = loads(event)
                    except (ValueError, RecursionError):
                        raise _Failure("malformed_event", f"event is not JSON: {event[:80]!r}") from None
                    if not isinstance(obj, dict):
                        raise _Failure("malformed_event", f"event is not a JSON object: {event[:80]!r}")
                    if "error" in obj:
                        message = _error_message(event) or "error event without a message"
                        raise _Failure("server_error_event", message)
                    usage = obj.get("usage")
                    if usage:
                        if not isinstance(usage, dict):
                            raise _Failure("malformed_event", f"usage is not an object: {event[:80]!r}")
                        timing.prompt_tokens = _token_count(usage, "prompt_tokens", event)
                        timing.completion_tokens = _token_count(usage, "completion_tokens", event)
                    choices = obj.get("choices")
                    if not choices:
                        others += 1
                        continue  # the usage-only chunk: not a token
                    if not isinstance(choices, list):
                        raise _Failure("malformed_event", f"choices is not a list: {event[:80]!r}")
                    if timing.first_chunk_ns is None:
                        timing.first_chunk_ns = now
                        rid = obj.get("id")
                        timing.response_id = rid if isinstance(rid, str) else None
                    content += 1
                    reason = choices[0].get("finish_reason") if isinstance(choices[0], dict) else None
                    if reason:
                        if not isinstance(reason, str):
                            raise _Failure("malformed_event", f"finish_reason is not a string: {event[:80]!r}")
                        timing.finish_reason = reason
                    elif not fixed and attempts:
                        attempts -= 1
                        template = content_template(event, obj)
                        if template is not None:
                            prefix, suffix = template
                            fixed = len(prefix) + len(suffix)
            finally:
                if content:
                    last = timing.last_chunk_ns
                    # the comparison alone on the read path; the rule (stats.wider_gap) only when the gap widens
                    if last is not None and now - last > timing.worst_gap_ns:
                        timing.worst_gap_ns, timing.worst_gap_end_ns = wider_gap(
                            timing.worst_gap_ns, timing.worst_gap_end_ns, last, now
                        )
                    timing.last_chunk_ns = now
                    timing.chunks += content
                    if timing.chunk_ns is not None:
                        timing.chunk_ns.extend(repeat(now, content))
                        timing.chunk_delay_ns.extend(repeat(-1 if delay is None else delay, content))  # type: ignore[union-attr]
                    if content > timing.max_events_per_read:
                        timing.max_events_per_read = content
                    if content > 1 and delay is not None and delay > late_ns:
                        timing.late_coalesced_reads += 1
                    if last_bytes is not None:
                        last_bytes.extend(event_ends(tail + data, raw_pos - len(tail), content, content + others))
                raw_pos += len(data)
                tail = data[-1:]
            return (decoder is not None and decoder.done) or (to_read is not None and received >= to_read)

        complete = take(rest, read_ns, delay) if rest else False
        if not complete and HubReads.usable(sock):
            reads = HubReads(sock, stall_s, deadline)
            try:
                reads.run(take, timestamps, clock)
            except TimeoutError:
                if reads.deadline_hit:
                    raise _Failure("request_timeout", f"stream still open after {timeouts.request_s:g} s") from None
                raise _Failure("stall_timeout", f"no bytes for {stall_s:g} s mid-stream") from None
            complete = True
        read_timeout = -1.0  # what the socket's timeout was last set to in this loop (threads, TLS)
        while not complete:
            remaining = (deadline - clock()) / 1e9
            if remaining <= 0:
                raise _Failure("request_timeout", f"stream still open after {timeouts.request_s:g} s")
            try:
                timeout = stall_s if stall_s < remaining else remaining
                if timeout != read_timeout:  # far from the deadline it is stall_s every time: set once
                    sock.settimeout(timeout)
                    read_timeout = timeout
                data, read_ns, delay = read_stamped(sock, timestamps, clock)
            except TimeoutError:
                if remaining <= stall_s:  # the limit that ends first, from when this read began
                    message = f"stream still open after {timeouts.request_s:g} s"
                    raise _Failure("request_timeout", message) from None
                raise _Failure("stall_timeout", f"no bytes for {stall_s:g} s mid-stream") from None
            complete = take(data, read_ns, delay) if data else True
        if not timing.done:
            raise _Failure("stream_truncated", f"stream ended without [DONE] after {timing.chunks} content chunks")
    except _Failure as f:
        timing.error_class, timing.error = f.error_class, f.message
    except StreamFormatError as e:
        timing.error_class, timing.error = "malformed_stream", str(e)
    except TimeoutError:
        timing.error_class = "headers_timeout" if phase == "headers" else "stall_timeout"
        timing.error = f"timed out during {phase}"
    except (ConnectionResetError, BrokenPipeError) as e:
        timing.error_class, timing.error = "connection_reset", f"{type(e).__name__} during {phase}"
    except OSError as e:
        timing.error_class, timing.error = "io_error", f"{type(e).__name__} during {phase}: {e}"
    except Exception as e:  # a bug here must still leave a record, not a lost request
        timing.error_class, timing.error = "client_error", f"{type(e).__name__}: {e}"
    except BaseException:
        timing.error_class, timing.error = "cancelled", f"load generator stopped during {phase}"
        timing.end_ns = clock()
        raise
    finally:
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass
        if timing.end_ns is None:
            timing.end_ns = clock()
        if api_key and timing.error:
            timing.error = _redact(timing.error, api_key)
    return timing
