"""The control document (``POST /_control``): validated whole, then applied, and the settings it leaves read
back; with it, what a stream-shaping fault it set does to the plan of a stream it matches.

A module of its own because it is how the server is told what later requests get, apart from the routing and
the completions that run on every request; it knows the server only as :class:`Controlled`.
"""

from __future__ import annotations

import json
from typing import Protocol

from tailgate.jsontypes import JsonObject

from .engine import EngineModel, EngineModelError
from .faults import ControlError, Fault, compile_fault, compile_pause, compile_script, integer_field, number_field
from .settings import ChunkLog, Settings
from .stream import Plan, Stream
from .wire import CONTROL_KEYS, FOREVER_MS, HTTP_ERROR_TYPES


class Controlled(Protocol):
    """What the control document reads and changes (the ``GroundTruthServer``)."""

    settings: Settings
    log: ChunkLog
    active: set[Stream]
    next_seq: int
    worker: int
    workers: int
    last_authorization: dict[str, str]

    def set_engine(self, model: EngineModel | None) -> None: ...


def apply_control(server: Controlled, doc: object) -> JsonObject:
    """Validate the whole document, then apply it: a bad key changes nothing.

    Keys: ``ttft_ms``, ``gap_ms``, ``model``, ``accept_any_model``, ``preemptions_total``,
    ``healthy``, ``kv_capacity_tokens``, ``write_delay_us``, ``faults`` (replaces the plan, hit counts restart),
    ``script`` (``{"schedules": {"<seq>": [ttft_ms, gap_ms, ...]}}``, replaces the schedules; chunks
    past a schedule's end follow ``gap_ms``), ``pause`` (``{"at_seq": S, "ms": P}``: every stream waits P ms
    from request S's arrival), ``reset_chunklog`` and ``reset_seq``. Settings reach
    requests that arrive afterwards; streams in flight keep the ones they started with. Returns
    the resulting settings, as ``GET /_control`` does.
    """
    if not isinstance(doc, dict):
        raise ControlError("control body must be a JSON object")
    unknown = set(doc) - CONTROL_KEYS
    if unknown:
        raise ControlError(f"unknown control keys {sorted(unknown)}; known: {sorted(CONTROL_KEYS)}")
    s = server.settings
    ttft = number_field(doc, "ttft_ms", s.ttft_ms)
    gap = number_field(doc, "gap_ms", s.gap_ms)
    preemptions = number_field(doc, "preemptions_total", s.preemptions_total)
    delay = number_field(doc, "write_delay_us", s.write_delay_us)
    kv_capacity = integer_field(doc, "kv_capacity_tokens", s.kv_capacity_tokens, minimum=1)
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
        faults = [compile_fault(f) for f in doc["faults"]]
    schedules = compile_script(doc["script"]) if "script" in doc else s.schedules
    pause = compile_pause(doc["pause"]) if "pause" in doc else s.pause
    engine_model = s.engine
    if "engine" in doc:
        try:
            engine_model = None if doc["engine"] is None else EngineModel.from_dict(doc["engine"])
        except (EngineModelError, TypeError) as e:
            raise ControlError(str(e)) from None
    assert ttft is not None and gap is not None and preemptions is not None and delay is not None
    s.write_delay_us = delay
    s.ttft_ms, s.gap_ms, s.preemptions_total, s.kv_capacity_tokens = ttft, gap, preemptions, kv_capacity
    s.model = model
    s.accept_any_model = doc.get("accept_any_model", s.accept_any_model)
    s.healthy = doc.get("healthy", s.healthy)
    s.faults = faults
    s.schedules = schedules
    s.pause = pause
    if "engine" in doc:
        s.engine = engine_model
        server.set_engine(engine_model)
    if doc.get("reset_chunklog"):
        server.log = ChunkLog()
        for stream in server.active:
            stream.log = server.log
            server.log.requests[stream.seq] = stream.request_row
    if doc.get("reset_seq"):
        server.next_seq = server.worker
    return describe(server)


def describe(server: Controlled) -> JsonObject:
    """The settings in force, with this worker's place and counts (``GET /_control``)."""
    return {
        **server.settings.describe(),
        "next_seq": server.next_seq,
        "worker": server.worker,
        "workers": server.workers,
        "chunks_logged": len(server.log),
        "last_authorization": dict(server.last_authorization),
    }


def add_to_plan(plan: Plan, fault: Fault, gap_ms: float) -> None:
    """What one matched stream-shaping fault does to the plan of the stream it matched."""
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
        plan.stalls[at] = None if stall_ms is None or stall_ms >= FOREVER_MS else round(float(stall_ms) * 1_000_000)
    elif kind == "error_event":
        at = int(p.get("at_chunk", 1))
        plan.error_at = at if plan.error_at is None else min(plan.error_at, at)
        code = int(p.get("code", 500))
        error = {
            "error": {
                "message": p.get("message", "injected engine error"),
                "type": p.get("type", HTTP_ERROR_TYPES.get(code, "InternalServerError")),
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
