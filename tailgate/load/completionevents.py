"""What a completion stream's events say: content chunks, the end marker, usage, finish reason, errors.

The SSE framing (:mod:`tailgate.load.sse`) cuts the body into events; this reads them. Most events of a
long stream are content chunks that differ from each other only in their text, so after the first few a
stream learns their template (:func:`~tailgate.load.sse.content_template`) and counts a chunk that fits it
without decoding its JSON: the read path's CPU per chunk, not parsing, is what bounds how many streams one
load process times exactly. When the events' stamps are taken is not decided here
(:mod:`tailgate.load.chunkstamps`): every event of one read shares one instant.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from tailgate.jsontypes import JsonMapping
from tailgate.load.sse import JSON_STRING, content_template
from tailgate.load.timing import StreamTiming
from tailgate.load.transport import RequestFailure, error_message

TEMPLATE_ATTEMPTS = 3
"""Decoded content chunks that may propose a fast-path template before a stream gives up on one."""


def token_count(usage: JsonMapping, key: str, event: bytes) -> int | None:
    """A usage count as the record schema holds it (an int), or the event is malformed."""
    value = usage.get(key)
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise RequestFailure("malformed_event", f"usage.{key} is not an integer: {event[:80]!r}")


class EventReader:
    """Reads one stream's events into its :class:`StreamTiming`, one read's worth at a time.

    After :meth:`read`, :attr:`content` and :attr:`others` count that read's content chunks and other events
    (``[DONE]``, the usage-only chunk) up to where it stopped: when an event is malformed, the chunks before
    it still count."""

    __slots__ = ("_attempts", "_fixed", "_prefix", "_suffix", "content", "others", "template", "timing")

    def __init__(self, timing: StreamTiming) -> None:
        self.timing = timing
        self._prefix = self._suffix = b""
        self._fixed = 0
        """``len(prefix) + len(suffix)``; 0 while there is no template."""
        self._attempts = TEMPLATE_ATTEMPTS
        self.template: tuple[bytes, bytes] | None = None
        """``(prefix, suffix)`` of this stream's content chunks once learned (the read path's fast check)."""
        self.content = 0
        self.others = 0

    def read(self, events: Iterable[bytes]) -> None:
        """One read's events (their instant is the stamper's: :mod:`tailgate.load.chunkstamps`)."""
        timing = self.timing
        prefix, suffix, fixed = self._prefix, self._suffix, self._fixed
        string_literal = JSON_STRING.fullmatch
        content = others = 0
        try:
            for event in events:
                # fast path: a content chunk like the template; no decode
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
                obj = self._decode(event)
                choices = obj.get("choices")
                if not choices:
                    others += 1
                    continue  # the usage-only chunk: not a token
                if not isinstance(choices, list):
                    raise RequestFailure("malformed_event", f"choices is not a list: {event[:80]!r}")
                if timing.response_id is None:
                    rid = obj.get("id")
                    timing.response_id = rid if isinstance(rid, str) else None
                content += 1
                reason = choices[0].get("finish_reason") if isinstance(choices[0], dict) else None
                if reason:
                    if not isinstance(reason, str):
                        raise RequestFailure("malformed_event", f"finish_reason is not a string: {event[:80]!r}")
                    timing.finish_reason = reason
                elif not fixed and self._attempts:
                    self._attempts -= 1
                    template = content_template(event, obj)
                    if template is not None:
                        prefix, suffix = self._prefix, self._suffix = self.template = template
                        fixed = self._fixed = len(prefix) + len(suffix)
        finally:
            self.content, self.others = content, others

    def _decode(self, event: bytes) -> JsonMapping:
        """An event that is not the template's: a JSON object, its error or usage taken."""
        try:
            obj = json.loads(event)
        except (ValueError, RecursionError):
            raise RequestFailure("malformed_event", f"event is not JSON: {event[:80]!r}") from None
        if not isinstance(obj, dict):
            raise RequestFailure("malformed_event", f"event is not a JSON object: {event[:80]!r}")
        if "error" in obj:
            raise RequestFailure("server_error_event", error_message(event) or "error event without a message")
        usage = obj.get("usage")
        if usage:
            if not isinstance(usage, dict):
                raise RequestFailure("malformed_event", f"usage is not an object: {event[:80]!r}")
            self.timing.prompt_tokens = token_count(usage, "prompt_tokens", event)
            self.timing.completion_tokens = token_count(usage, "completion_tokens", event)
        return obj


__all__ = ["TEMPLATE_ATTEMPTS", "EventReader", "token_count"]
