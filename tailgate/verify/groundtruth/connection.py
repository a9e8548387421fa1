"""One client connection of the ground-truth server: HTTP/1.x parsing with keep-alive and pipelining,
rejections as uvicorn words them, and the ways a connection may end (FIN, RST).

It knows the server only as a :class:`ConnectionHost` (the open connections, and where a parsed request
goes), so the server owns connections without the two modules importing each other.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Protocol

from .stream import Stream
from .wire import (
    MAX_BODY_BYTES,
    MAX_HEAD_BYTES,
    HttpError,
    RequestHead,
    check_request_line,
    error_body,
    full_response,
    monotonic_ns,
    parse_request_head,
)


class ConnectionHost(Protocol):
    """What a connection needs from its server."""

    connections: set[Connection]

    def dispatch(self, conn: Connection, head: RequestHead, body: bytes, recv_ns: int) -> None: ...


# ------------------------------------------------------------------------------------------ protocol


class Connection(asyncio.Protocol):
    """One client connection: parse a request, answer it, then the next one if kept alive."""

    def __init__(self, server: ConnectionHost) -> None:
        self.server = server
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.buf = bytearray()
        self.head: RequestHead | None = None
        self.busy = False
        self.closed = False
        self.keep_alive = True
        self.chunked = True
        self.in_process = False
        self.stream: Stream | None = None

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
                recv_ns = monotonic_ns()
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
                check_request_line(line[:-1].decode("latin-1"))
            except HttpError as e:
                self.reject(e)

    def reject(self, e: HttpError) -> None:
        body = b"Invalid HTTP request received." if e.status == 400 else error_body(e.status, e.message)
        ctype = "text/plain; charset=utf-8" if e.status == 400 else "application/json"
        self.busy = True
        self.keep_alive = False
        self.transport.write(full_response(e.status, body, ctype, keep_alive=False))
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
