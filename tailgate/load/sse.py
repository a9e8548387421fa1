"""Incremental decoding of a streamed HTTP/1.1 body into server-sent events.

Two layers, both fed whatever one socket read returned: HTTP chunked transfer framing (how
uvicorn sends each event), then SSE lines. Both keep their partial state between reads, so an
event split across reads, or several events in one read, come out exactly once, each at the
moment its last byte was parsed. Also what a stream needs of its events' bytes beyond decoding them: the
template of a content chunk (to recognise the next ones without decoding) and where each event ends in the
response (to join it to the packet that carried it).
"""

from __future__ import annotations

import json
import re

from tailgate.jsontypes import JsonMapping

MAX_PENDING_BYTES = 4 * 1024 * 1024
"""A line this long without a newline is not an SSE stream we can trust; stop buffering it."""


class StreamFormatError(ValueError):
    """The bytes on the wire are not valid chunked framing or SSE."""


class ChunkedDecoder:
    """Strips HTTP/1.1 chunked transfer framing, incrementally."""

    __slots__ = ("_buf", "_remaining", "_state", "done")

    _SIZE, _DATA, _DATA_END, _TRAILER = range(4)

    def __init__(self) -> None:
        self._buf = b""
        self._remaining = 0
        self._state = self._SIZE
        self.done = False

    def feed(self, data: bytes) -> bytes:
        out: list[bytes] = []
        if self._state == self._SIZE and not self._buf and not self.done:
            # Whole chunks at the start of a read (how servers flush each event; a late read holds
            # several) skip the state machine; the rest (extensions, bare LF, a split chunk, the last
            # chunk) takes it from where they end.
            nl = data.find(b"\r\n", 0, 18)
            if nl > 0 and data[-2:] == b"\r\n" and data[:nl].isalnum():
                try:
                    size = int(data[:nl], 16)
                except ValueError:
                    size = 0
                if size > 0 and len(data) == nl + size + 4:
                    return data[nl + 2 : -2]  # exactly one chunk: the usual read
            pos, n = 0, len(data)
            while pos < n:
                nl = data.find(b"\r\n", pos, pos + 18)
                if nl <= pos or not data[pos:nl].isalnum():
                    break
                try:
                    size = int(data[pos:nl], 16)
                except ValueError:
                    break
                end = nl + 2 + size
                if size <= 0 or end + 2 > n or data[end : end + 2] != b"\r\n":
                    break
                out.append(data[nl + 2 : end])
                pos = end + 2
            if pos == n:
                return out[0] if len(out) == 1 else b"".join(out)
            if pos:
                data = data[pos:]
        buf = self._buf + data if self._buf else data
        pos = 0
        n = len(buf)
        while pos < n and not self.done:
            if self._state == self._DATA:
                take = min(self._remaining, n - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    self._state = self._DATA_END
                continue
            nl = buf.find(b"\n", pos)
            if nl < 0:
                if n - pos > 1024:
                    raise StreamFormatError("chunk framing line too long")
                break
            line = buf[pos:nl].rstrip(b"\r")
            pos = nl + 1
            if self._state == self._SIZE:
                size_field = line.split(b";", 1)[0].strip()
                try:
                    size = int(size_field, 16)
                except ValueError:
                    raise StreamFormatError(f"bad chunk size {size_field[:20]!r}") from None
                if size < 0:
                    raise StreamFormatError("negative chunk size")
                if size == 0:
                    self._state = self._TRAILER
                else:
                    self._remaining = size
                    self._state = self._DATA
            elif self._state == self._DATA_END:
                if line:
                    raise StreamFormatError("chunk data longer than its declared size")
                self._state = self._SIZE
            else:  # trailer section ends with an empty line
                if not line:
                    self.done = True
        self._buf = buf[pos:]
        return b"".join(out)

    @property
    def between_chunks(self) -> bool:
        """True when the next byte starts a chunk's size line (nothing of a chunk is held)."""
        return self._state == self._SIZE and not self._buf and not self.done


class SSEParser:
    """Turns body bytes into the data payloads of complete SSE events.

    Comment lines (``: ping``) and fields other than ``data`` are ignored; multi-line data is
    joined with newlines, as the SSE specification says. An event is complete at its blank line.
    """

    __slots__ = ("_buf", "_data")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []

    def feed(self, data: bytes) -> list[bytes]:
        if (
            not self._buf
            and not self._data
            and data[:6] == b"data: "
            and data.find(b"\n") == len(data) - 2
            and data[-1:] == b"\n"
            and data[-3:-2] != b"\r"
        ):
            # Exactly one single-line event, ``data: <payload>\n\n``: what vLLM sends per token.
            return [data[6:-2]]
        if not self._buf and not self._data and data[:6] == b"data: " and data[-2:] == b"\n\n" and b"\r" not in data:
            # Several such events in one read (a read that came late): split them without the line loop.
            parts = data[:-2].split(b"\n\n")
            if all(p[:6] == b"data: " and b"\n" not in p for p in parts):
                return [p[6:] for p in parts]
        buf = self._buf + data if self._buf else data
        events: list[bytes] = []
        pos = 0
        while True:
            nl = buf.find(b"\n", pos)
            if nl < 0:
                break
            line = buf[pos:nl]
            pos = nl + 1
            if line[-1:] == b"\r":
                line = line[:-1]
            if not line:
                if self._data:
                    events.append(self._data[0] if len(self._data) == 1 else b"\n".join(self._data))
                    self._data = []
            elif line[:5] == b"data:":
                value = line[5:]
                if value[:1] == b" ":
                    value = value[1:]
                self._data.append(value)
        rest = buf[pos:]
        if len(rest) > MAX_PENDING_BYTES:
            raise StreamFormatError("SSE line exceeds 4 MiB without a newline")
        self._buf = rest
        return events

    @property
    def pending(self) -> bool:
        """True when bytes of an unfinished event are buffered (a cut stream)."""
        return bool(self._buf or self._data)


JSON_STRING = re.compile(rb'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"')
"""One JSON string literal, exactly as ``json.loads`` accepts it (no raw control characters)."""
TEXT_KEY = b'"text":'


def content_template(event: bytes, obj: JsonMapping) -> tuple[bytes, bytes] | None:
    """``(prefix, suffix)`` around the text of a decoded content chunk, or None if it cannot serve as one.

    A stream's content chunks differ only in their text: vLLM repeats id, created, model and every
    other field byte for byte. An event that is this prefix, one JSON string literal, then this
    suffix therefore decodes to this chunk with another text: a content chunk, ``finish_reason``
    null, no usage, no error. Checking that costs a fraction of ``json.loads``. The template is
    accepted only if the skeleton with an empty text decodes to exactly the decoded chunk with an
    empty text, so an odd layout (a ``"text":`` inside another value, whitespace, extra choices)
    yields no template rather than a wrong one.
    """
    choices = obj.get("choices")
    if not (isinstance(choices, list) and len(choices) == 1 and isinstance(choices[0], dict)):
        return None
    first = choices[0]
    if first.get("finish_reason") is not None or not isinstance(first.get("text"), str) or obj.get("usage"):
        return None
    start = event.find(b'"choices":[{')
    key = event.find(TEXT_KEY, start) if start >= 0 else -1
    if key < 0:
        return None
    literal = JSON_STRING.match(event, key + len(TEXT_KEY))
    if literal is None:
        return None
    prefix, suffix = event[: literal.start()], event[literal.end() :]
    try:
        skeleton = json.loads(prefix + b'""' + suffix)
    except (ValueError, RecursionError):
        return None
    return (prefix, suffix) if skeleton == {**obj, "choices": [{**first, "text": ""}]} else None


def event_ends(raw: bytes, start: int, content: int, events: int) -> list[int]:
    """Offsets in the response of the last byte of each of a read's first ``content`` events.

    ``raw`` is the read's bytes as they came (with any chunked framing), ``start`` its offset in the
    response, ``events`` how many events the read completed. Each event ends in a blank line; the content
    events come before the usage chunk and ``[DONE]``. When the blank lines found are not one per event
    (``\r\n`` line ends, a comment), every content event is given the read's last byte: the kernel stamp's
    reading of the read (its newest bytes)."""
    ends = []
    i = raw.find(b"\n\n")
    while i >= 0:
        ends.append(start + i + 1)
        i = raw.find(b"\n\n", i + 2)
    if len(ends) != events:
        return [start + len(raw) - 1] * content
    return ends[:content]
