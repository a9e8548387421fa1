"""One streaming completion over a fresh HTTP/1.1 connection, timed event by event.

A plain ``socket`` is used on purpose: under Locust it is gevent's cooperative socket, with
threads it is the ordinary one, and in both cases nothing sits between a ``recv`` returning and
the timestamp taken for the events it completed (no connection pool to wait on, no line
iterator buffering ahead). A fresh connection per request is what the reference harness does
with ``urllib``, so TTFT includes the same connect cost.

Every outcome is classified: a request either completes with ``[DONE]`` or ends with an
``error_class`` and whatever timing it got before failing. The request's parts are modules of their own,
each testable alone: the connection and response head (:mod:`~tailgate.load.transport`), the SSE framing
(:mod:`~tailgate.load.sse`), what the events say (:mod:`~tailgate.load.completionevents`) and when their
chunks arrived (:mod:`~tailgate.load.chunkstamps`); this module drives them over one connection.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from tailgate.load.capture import connection_key
from tailgate.load.chunkstamps import LATE_READ_NS, ChunkStamper
from tailgate.load.completionevents import TEMPLATE_ATTEMPTS, EventReader
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
from tailgate.load.sse import (
    JSON_STRING,
    ChunkedDecoder,
    SSEParser,
    StreamFormatError,
    content_template,
    event_ends,
)
from tailgate.load.target import Target, TargetError, Timeouts
from tailgate.load.timing import StreamTiming
from tailgate.load.transport import RequestFailure, ResponseHead, connect, read_head, redact, refuse_status

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


CHUNK_SIZES = {b"%x" % size: size for size in range(1, 4096)}
"""A chunk's size line, as servers write it (lower-case hex), to its size: one lookup where ``int(line, 16)`` and
the checks that keep ``int`` from accepting what chunked framing does not (signs, spaces, underscores) cost four
times as much on every read. A chunk of 4 KiB or more takes the general decoder."""
PLAIN_STRING_BYTES = bytes(b for b in range(0x20, 0x80) if b not in b'"\\')
"""The bytes a JSON string literal may hold without an escape: deleting them from a literal that has no escape
leaves only its two quotes, a quarter of the cost of matching :data:`JSON_STRING` (which decides otherwise)."""


class StreamReads:
    """A 200 response's body, read by read: framing, events and stamps of one stream.

    :meth:`take` is what every read of the stream goes through, in the hub's callback or in a greenlet's own
    loop; it is the read path's whole per-read cost. Once the stream's content chunks have a template
    (:func:`~tailgate.load.sse.content_template`), the usual read (one whole HTTP chunk holding one event like
    the template) is recognised on the wire bytes in one pass, without framing, SSE or event objects: the
    checks are those the three layers would make, so it counts exactly what they would count."""

    __slots__ = (
        "_decoder",
        "_events",
        "_feed",
        "_parser",
        "_received",
        "_stamp",
        "_to_read",
        "_wire",
        "_wire_ready",
    )

    def __init__(self, timing: StreamTiming, head: ResponseHead, *, kernel: bool, capture_offsets: bool) -> None:
        self._decoder = ChunkedDecoder() if head.chunked else None
        self._parser = SSEParser()
        self._feed = self._parser.feed
        self._events = EventReader(timing)
        stamper = ChunkStamper(timing, kernel=kernel, body_offset=head.body_offset if capture_offsets else None)
        self._stamp = stamper.stamp
        self._to_read = head.content_length
        self._received = 0
        self._wire: tuple[bytes, bytes, int, int] | None = None
        """The template as it comes on the wire: ``(b"data: " + prefix, suffix + b"\n\n\r\n", len of each)``."""
        self._wire_ready = False
        """The framing and the SSE parser stand between two events, so a read may start a whole one."""

    def take(self, data: bytes, read_ns: int, delay: int | None) -> bool:
        """One read's events, all at the read's instant; True when the response is complete."""
        self._received += len(data)
        events = self._events
        events.timing.reads += 1
        wire = self._wire
        if wire is not None and self._wire_ready:
            prefix, suffix, prefix_len, suffix_len = wire
            nl = data.find(b"\r\n", 0, 6)
            start = nl + 2
            end = len(data) - suffix_len
            if (
                CHUNK_SIZES.get(data[:nl]) == end + suffix_len - 2 - start
                and data.startswith(prefix, start)
                and data.endswith(suffix)
                and data.isascii()
                and (
                    (
                        data[start + prefix_len : end].translate(None, PLAIN_STRING_BYTES) == b'""'
                        and data[start + prefix_len] == data[end - 1] == 0x22  # the quotes at its ends
                    )
                    or JSON_STRING.fullmatch(data, start + prefix_len, end) is not None
                )
            ):
                self._stamp(read_ns, delay, 1, 0, data)
                return False  # a content chunk; the response ends with the zero-size chunk
        decoder = self._decoder
        payload = decoder.feed(data) if decoder is not None else data
        try:
            events.read(self._feed(payload) if payload else ())
        finally:  # a bad event still leaves the chunks before it counted
            self._stamp(read_ns, delay, events.content, events.others, data)
        if decoder is not None:
            self._wire_ready = decoder.between_chunks and not self._parser.pending
            if wire is None and events.template is not None:
                prefix, suffix = events.template
                self._wire = (b"data: " + prefix, suffix + b"\n\n\r\n", len(prefix) + 6, len(suffix) + 4)
            return decoder.done
        return self._to_read is not None and self._received >= self._to_read


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
    if record_chunks:
        timing.chunk_ns = []
        timing.chunk_delay_ns = []
    sock: socket.socket | None = None
    timing.sent_ns = clock()
    deadline = timing.sent_ns + int(timeouts.request_s * 1e9)
    phase = "connect"
    try:
        sock = connect(target, timeouts.connect_s)
        timing.connected_ns = clock()
        phase = "headers"
        timestamps = enable_rx_timestamps(sock)
        capture_offsets = capture and target.scheme != "https"
        if capture_offsets:
            timing.conn_key = connection_key(sock.getpeername()[:2], sock.getsockname()[:2])
        if write is None:
            sock.sendall(request)
            timing.written_ns = clock()
        else:
            timing.written_ns = write(sock, request)
        head = read_head(sock, timestamps, clock, deadline, timeouts.request_s)
        timing.headers_ns = head.read_ns
        timing.status = head.status
        if head.status != 200:
            phase = "error_body"
            raise refuse_status(sock, head, (deadline - clock()) / 1e9)
        phase = "stream"
        reads = StreamReads(timing, head, kernel=stamp == "kernel", capture_offsets=capture_offsets)
        complete = reads.take(head.rest, head.read_ns, head.delay) if head.rest else False
        if not complete:
            read_until_complete(sock, reads, timestamps, clock, deadline, timeouts)
        if not timing.done:
            why = f"stream ended without [DONE] after {timing.chunks} content chunks"
            raise RequestFailure("stream_truncated", why)
    except RequestFailure as f:
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
            timing.error = redact(timing.error, api_key)
    return timing


def read_until_complete(
    sock: socket.socket,
    reads: StreamReads,
    timestamps: bool,
    clock: Callable[[], int],
    deadline_ns: int,
    timeouts: Timeouts,
) -> None:
    """Every read of the stream through ``reads.take`` until the response is complete or the server closes,
    within the stall limit between reads and the request limit overall (:class:`RequestFailure` past one).

    Under gevent the reads are taken in the hub (:class:`HubReads`); with threads or TLS, in this loop."""
    stall_s = timeouts.stall_s or timeouts.request_s
    if HubReads.usable(sock):
        hub_reads = HubReads(sock, stall_s, deadline_ns)
        try:
            hub_reads.run(reads.take, timestamps, clock)
        except TimeoutError:
            if hub_reads.deadline_hit:
                raise RequestFailure("request_timeout", f"stream still open after {timeouts.request_s:g} s") from None
            raise RequestFailure("stall_timeout", f"no bytes for {stall_s:g} s mid-stream") from None
        return
    read_timeout = -1.0  # what the socket's timeout was last set to in this loop
    complete = False
    while not complete:
        remaining = (deadline_ns - clock()) / 1e9
        if remaining <= 0:
            raise RequestFailure("request_timeout", f"stream still open after {timeouts.request_s:g} s")
        try:
            timeout = stall_s if stall_s < remaining else remaining
            if timeout != read_timeout:  # far from the deadline it is stall_s every time: set once
                sock.settimeout(timeout)
                read_timeout = timeout
            data, read_ns, delay = read_stamped(sock, timestamps, clock)
        except TimeoutError:
            if remaining <= stall_s:  # the limit that ends first, from when this read began
                raise RequestFailure("request_timeout", f"stream still open after {timeouts.request_s:g} s") from None
            raise RequestFailure("stall_timeout", f"no bytes for {stall_s:g} s mid-stream") from None
        complete = reads.take(data, read_ns, delay) if data else True
