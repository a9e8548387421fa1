"""The fault language of POST /_control: validated once, so a bad test setup fails at the control call
rather than as a puzzling stream later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict, cast

from tailgate.jsontypes import JsonMapping, JsonObject, JsonValue

from .wire import FAULT_KINDS, MATCH_KEYS

# ------------------------------------------------------------------------------------------- control


class ControlError(ValueError):
    """A control document that cannot be applied; nothing of it was applied."""


class FaultMatch(TypedDict, total=False):
    """Which requests a fault takes, as :func:`compile_fault` checked it (a plain dict: it is shown back as given)."""

    seq: int | list[int]
    every: int
    offset: int
    prompt_tokens: int
    all: bool


class FaultParams(TypedDict, total=False):
    """A fault's settings beside ``kind``, ``match`` and ``times``, as :func:`_validate_fault_params` checked them."""

    message: str
    delay_ms: float | None
    retry_after: float | str
    type: str
    rst: JsonValue
    """Taken for its truth, as ``same_http_chunk``."""
    after_chunks: int
    at_chunk: int
    stall_ms: float | None
    """None (or at least ``FOREVER_MS``): the stream never resumes."""
    code: int
    interval_ms: float | None
    comment: str
    events_per_write: int
    same_http_chunk: JsonValue


def _as_json(doc: FaultMatch | FaultParams) -> JsonObject:
    """Both hold only the JSON values the control document gave (checked when it was read)."""
    return cast(JsonObject, doc)


@dataclass(slots=True)
class Fault:
    kind: str
    match: FaultMatch
    params: FaultParams
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

    def describe(self) -> JsonObject:
        out: JsonObject = {"match": _as_json(self.match), "kind": self.kind, **_as_json(self.params), "hits": self.hits}
        if self.times is not None:
            out["times"] = self.times
        return out


def number_field(doc: JsonMapping, key: str, default: float | None, minimum: float = 0.0) -> float | None:
    value = doc.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise ControlError(f"{key} must be a number >= {minimum}, got {value!r}")
    return float(value)


def integer_field(doc: JsonMapping, key: str, default: int, minimum: int = 0) -> int:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ControlError(f"{key} must be an integer >= {minimum}, got {value!r}")
    return value


def compile_fault(doc: object) -> Fault:
    if not isinstance(doc, dict):
        raise ControlError(f"a fault must be an object, got {doc!r}")
    kind = doc.get("kind")
    if kind not in FAULT_KINDS:
        raise ControlError(f"unknown fault kind {kind!r}; known: {', '.join(FAULT_KINDS)}")
    match = doc.get("match", {"all": True})
    if not isinstance(match, dict) or not match or not set(match) <= MATCH_KEYS:
        raise ControlError(f"match must be an object with keys among {sorted(MATCH_KEYS)}, got {match!r}")
    seq = match.get("seq")
    if seq is not None and not (
        (isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0)
        or (isinstance(seq, list) and all(isinstance(s, int) and s >= 0 for s in seq))
    ):
        raise ControlError(f"match.seq must be a request number or a list of them, got {seq!r}")
    if "every" in match:
        integer_field(match, "every", 1, minimum=1)
        integer_field(match, "offset", 0)
    if "prompt_tokens" in match:
        integer_field(match, "prompt_tokens", 0)
    if "all" in match and match["all"] is not True:
        raise ControlError("match.all must be true")
    params = {k: v for k, v in doc.items() if k not in ("kind", "match", "times")}
    times = doc.get("times")
    if times is not None:
        times = integer_field(doc, "times", 0, minimum=1)
    _validate_fault_params(kind, params)
    return Fault(kind, cast(FaultMatch, dict(match)), cast(FaultParams, params), times)


def _validate_fault_params(kind: str, p: JsonMapping) -> None:
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
    number_field(p, "delay_ms", 0.0)
    for key in ("after_chunks", "at_chunk"):
        integer_field(p, key, 0)
    number_field(p, "stall_ms", 0.0)
    number_field(p, "interval_ms", None, minimum=0.1)
    integer_field(p, "events_per_write", 2, minimum=1)
    integer_field(p, "code", 500)
    for key in ("message", "type", "comment"):
        if key in p and not isinstance(p[key], str):
            raise ControlError(f"{key} must be a string")
    comment = p.get("comment")
    if isinstance(comment, str) and ("\n" in comment or "\r" in comment):
        raise ControlError("comment must be one line")
    if "retry_after" in p and not isinstance(p["retry_after"], int | float | str):
        raise ControlError("retry_after must be a number or a string")


def compile_pause(doc: object) -> tuple[int, int] | None:
    """``{"at_seq": S, "ms": P}``: a server-wide pause of every stream, the way an engine step that stalls pauses
    them all at once; it starts when request S arrives. Returns ``(S, P in ns)``; None clears it."""
    if doc is None:
        return None
    if not isinstance(doc, dict) or set(doc) != {"at_seq", "ms"}:
        raise ControlError('pause must be {"at_seq": <request number>, "ms": <pause>} or null')
    ms = number_field(doc, "ms", None)
    assert ms is not None
    return integer_field(doc, "at_seq", 0), round(ms * 1_000_000)


def compile_script(doc: object) -> dict[int, list[int]]:
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
