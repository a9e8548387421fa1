"""The wire: constants of the emulated server, a small HTTP/1.1 request parser and response framing.

Kept apart from the streaming logic so the parser can be fuzzed and tested on bytes alone.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any

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

HTTP_FAULT_STATUS = {"http_429": 429, "http_500": 500, "http_503": 503}
HTTP_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Payload Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}
_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
SSE_DONE = b"data: [DONE]\n\n"
SSE_MALFORMED = b"data: {not json\n\n"
CHUNK_END = b"0\r\n\r\n"
MATCH_KEYS = frozenset({"seq", "every", "offset", "prompt_tokens", "all"})
CONTROL_KEYS = frozenset(
    {
        "pause",
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
        "engine",
        "write_delay_us",
    }
)

monotonic_ns = time.monotonic_ns


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


def check_request_line(line: str) -> tuple[str, str, str]:
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
    method, target, version = check_request_line(lines[0])
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
    date: bytes = _date_cache[1]
    return date


def response_head(status: int, headers: Sequence[tuple[str, str]], keep_alive: bool) -> bytes:
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, REASONS.get(status, "Unknown").encode("ascii"))]
    lines.append(b"date: " + _http_date() + b"\r\n")
    lines.append(b"server: groundtruth\r\n")
    for name, value in headers:
        lines.append(f"{name}: {value}\r\n".encode("latin-1"))
    if not keep_alive:
        lines.append(b"connection: close\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


def full_response(
    status: int,
    body: bytes,
    content_type: str,
    keep_alive: bool,
    extra: Sequence[tuple[str, str]] = (),
) -> bytes:
    headers = [("content-type", content_type), ("content-length", str(len(body))), *extra]
    return response_head(status, headers, keep_alive) + body


def json_bytes(obj: object) -> bytes:
    """Compact JSON of a ``JsonObject`` or of a ``TypedDict`` of JSON values (the chunk log's, which ``JsonValue``
    cannot name)."""
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def error_body(status: int, message: str, error_type: str | None = None, param: str | None = None) -> bytes:
    """vLLM's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = error_type or HTTP_ERROR_TYPES.get(status, "Error")
    return json_bytes({"error": {"message": message, "type": kind, "param": param, "code": status}})


def chunk_frame(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def raw_frame(payload: bytes) -> bytes:
    return payload
