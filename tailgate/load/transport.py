"""A completion request's connection: connect, read the response head, read an error body.

Everything here happens once per request, before or instead of the event stream; what the stream's events
say is :mod:`tailgate.load.completionevents`, and when they are stamped :mod:`tailgate.load.chunkstamps`.
Each failure is a :class:`RequestFailure` with the ``error_class`` its record will carry.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from tailgate.load.reads import RECV_BYTES, HubReads, read_stamped
from tailgate.load.sse import ChunkedDecoder, StreamFormatError
from tailgate.load.target import Target

HEAD_LIMIT_BYTES = 65536
"""Response headers longer than this are a bad response, not something to keep reading."""

ERROR_BODY_BYTES = 65536
"""How much of a non-200 body is read for its message."""


class RequestFailure(Exception):
    """How a request ended when it did not end with ``[DONE]``: the record's ``error_class`` and message."""

    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message


def literal_family(host: str) -> int | None:
    """The address family of a numeric host, None for a name that needs resolving."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        return family
    return None


def open_socket(target: Target, timeout: float) -> socket.socket:
    """Connect; a numeric host skips ``getaddrinfo``.

    Under gevent, ``create_connection`` resolves through a thread pool even for an IP literal: a
    hand-off to another OS thread and back per request, which competes for the GIL with the loop
    that is timestamping other streams.
    """
    family = literal_family(target.host)
    if family is None:
        sock = socket.create_connection((target.host, target.port), timeout=timeout)
    else:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            connect_now((target.host, target.port), sock)
        except BaseException:
            sock.close()
            raise
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if target.scheme == "https":
        ctx = ssl.create_default_context()
        sock = ctx.wrap_socket(sock, server_hostname=target.host)
    return sock


CONNECTING = (errno.EINPROGRESS, errno.EALREADY, errno.EWOULDBLOCK)


def connect_now(address: tuple[str, int], sock: socket.socket) -> None:
    """Connect, without a turn of the event loop where the handshake is already done.

    A non-blocking connect returns "in progress" even on loopback, where the whole handshake has run inside that
    very call; gevent then waits for writability: a loop turn, two greenlet switches and a timeout object, ~20 us
    of the load process's CPU per request, paid at every arrival. Asking the kernel again settles it at once;
    where the handshake is really under way (a remote server), gevent's wait takes over, with its timeout."""
    if HubReads.usable(sock):
        raw = sock._sock  # type: ignore[attr-defined]  # gevent's non-blocking socket underneath
        err = raw.connect_ex(address)
        if err in CONNECTING:
            err = raw.connect_ex(address)
        if err in (0, errno.EISCONN):
            return
        if err not in CONNECTING:
            raise OSError(err, os.strerror(err))  # the errno's own class: ConnectionRefusedError, TimeoutError...
    sock.connect(address)


def connect(target: Target, timeout: float) -> socket.socket:
    """:func:`open_socket`, with each way a connection fails classified."""
    try:
        return open_socket(target, timeout)
    except ConnectionRefusedError:
        raise RequestFailure("connection_refused", f"connection refused by {target.host}:{target.port}") from None
    except TimeoutError:
        raise RequestFailure("connect_timeout", f"no connection within {timeout:g} s") from None
    except ssl.SSLError as e:
        raise RequestFailure("tls_error", str(e) or type(e).__name__) from None
    except OSError as e:
        raise RequestFailure("connect_error", f"{type(e).__name__}: {e}") from None


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """The status line and headers, and the first read's bytes past them (the stream's start, if any)."""

    status: int
    headers: dict[str, str]
    body_offset: int
    """Where the body starts in the response: the chunk positions a packet capture needs count from 0."""
    rest: bytes
    """What the read that completed the head brought after it."""
    read_ns: int
    """When that read returned."""
    delay: int | None
    """How long that read's newest bytes had waited in the kernel (None: unknown)."""

    @property
    def chunked(self) -> bool:
        return "chunked" in self.headers.get("transfer-encoding", "").lower()

    @property
    def content_length(self) -> int | None:
        """The body's length where the server gave one and the body is not chunked."""
        length = self.headers.get("content-length")
        if length and length.isascii() and length.isdigit() and not self.chunked:
            return int(length)
        return None


def read_head(
    sock: socket.socket, timestamps: bool, clock: Callable[[], int], deadline_ns: int, request_s: float
) -> ResponseHead:
    """Read until the blank line that ends the headers, by ``deadline_ns``; parse the status and headers."""
    buf = b""
    while True:
        remaining = (deadline_ns - clock()) / 1e9
        if remaining <= 0:
            raise RequestFailure("headers_timeout", f"no response headers within {request_s:g} s")
        sock.settimeout(remaining)
        data, read_ns, delay = read_stamped(sock, timestamps, clock)
        if not data:
            raise RequestFailure("connection_closed", "server closed the connection before sending headers")
        buf += data
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            break
        if len(buf) > HEAD_LIMIT_BYTES:
            raise RequestFailure("bad_response", "response headers exceed 64 KiB")
    lines = buf[:end].decode("latin-1").split("\r\n")
    code = lines[0].split(" ", 2)[1] if lines[0].count(" ") else ""
    if not (len(code) == 3 and code.isascii() and code.isdigit() and code[0] in "12345"):
        raise RequestFailure("bad_response", f"bad status line {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return ResponseHead(int(code), headers, end + 4, buf[end + 4 :], read_ns, delay)


def refuse_status(sock: socket.socket, head: ResponseHead, seconds_left: float) -> RequestFailure:
    """The failure a non-200 response ends the request with, its message read from the body (within a few
    seconds: the body explains the failure, it is not worth waiting on)."""
    body = head.rest
    to_read = head.content_length
    sock.settimeout(min(5.0, max(0.1, seconds_left)))
    try:
        while (to_read is None or len(body) < to_read) and len(body) < ERROR_BODY_BYTES:
            data = sock.recv(RECV_BYTES)
            if not data:
                break
            body += data
    except OSError:
        pass
    if head.chunked:
        try:
            body = ChunkedDecoder().feed(body)
        except StreamFormatError:
            pass
    return RequestFailure(f"http_{head.status}", error_message(body) or f"HTTP {head.status}")


def error_message(body: bytes) -> str:
    """The message of an error body or event (OpenAI's ``{"error": {"message": ...}}`` or plain text), cut short."""
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


def redact(text: str, secret: str) -> str:
    """``text`` without ``secret`` or any start of it 8+ characters long (a message cut mid-key).

    Servers and gateways sometimes quote the credential they rejected; what they say ends up in
    records and logs, where the key must never appear.
    """
    for n in range(len(secret), min(len(secret), 8) - 1, -1):
        if secret[:n] in text:
            text = text.replace(secret[:n], "<redacted>")
    return text


__all__ = [
    "RequestFailure",
    "ResponseHead",
    "connect",
    "error_message",
    "literal_family",
    "open_socket",
    "read_head",
    "redact",
    "refuse_status",
]
