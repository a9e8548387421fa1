"""One request of an order, either side of its stream: the body and id it is sent with (built for every request
before the stage starts) and the record its timings become (built after the stream ended, off the path that
stamps chunks).

A module of its own so the order runner holds only the dispatching, the draining and the reporting: what one
request is made of is read, and checked, apart from them.
"""

from __future__ import annotations

import time

from tailgate.contracts import Order, OrderConfig
from tailgate.load.arrivals import DEFAULT_ARRIVALS
from tailgate.load.clock import wall
from tailgate.load.payloads import DEFAULT_ENDPOINT, endpoints
from tailgate.load.prompts import Prompt
from tailgate.load.promptsources import DEFAULT_PROMPTS
from tailgate.load.timing import StreamTiming
from tailgate.records import RequestRecord

Plan = tuple[int, int, int, int, int | None, int | None]
"""One request of an order as the dispatcher holds it: trace id, prompt tokens, max tokens, intended send (ns on
the monotonic clock), gated batch, and the tokenizer's count of a built prompt."""


def request_body(cfg: OrderConfig, prompt: Prompt, max_tokens: int, endpoint: str) -> bytes:
    """The JSON body for one request on the chosen endpoint (the seed filler goes to chat as one user turn)."""
    ep = endpoints()[endpoint]
    messages = prompt.turns() if ep.messages else None
    return ep.body(cfg.model, prompt.text or "", messages, max_tokens, ignore_eos=cfg.ignore_eos)


def request_id(run_id: str, stage: int, trace_id: int) -> str:
    """The ``X-Request-Id`` of one request: unique in a run, and readable back from vLLM's request log."""
    return f"tg-{run_id}-{stage}-{trace_id}"


def _offsets_ms(times_ns: list[int], origin_ns: int) -> list[float]:
    """Milliseconds after ``origin_ns`` to the nearest microsecond, in integer arithmetic: ``round(x, 3)``
    per chunk cost more than the rest of the record, inside the loop that times the other streams."""
    shift = 500 - origin_ns
    return [(t + shift) // 1000 / 1000 for t in times_ns]


def _delays_ms(delays_ns: list[int]) -> list[float]:
    """Read delays in ms to the microsecond (-1 stays -1: no kernel stamp for that read)."""
    return [-1.0 if d < 0 else (d + 500) // 1000 / 1000 for d in delays_ns]


def _ms(a: int | None, b: int | None) -> float | None:
    return None if a is None or b is None else round((b - a) / 1e6, 3)


def request_record(
    order: Order,
    plan: Plan,
    t: StreamTiming,
    in_flight: int,
    cfg: OrderConfig,
    worker: str,
) -> RequestRecord:
    """The record of one finished stream, from what its timing saw; ``worker`` names the process that sent it."""
    trace_id, prompt_tokens, max_tokens, intended_ns, batch, tokenized = plan
    sent = t.sent_ns or intended_ns
    worst_gap = round(t.worst_gap_ns / 1e6, 3) if t.first_chunk_ns is not None else None
    return RequestRecord(
        run_id=order.run_id, worker=worker, trace_id=trace_id, stage=order.stage,
        stage_label=order.stage_label, arm=order.arm, rate_or_batch=order.rate_or_batch,
        batch=batch, prompt_tokens_planned=prompt_tokens, max_tokens=max_tokens,
        ignore_eos=cfg.ignore_eos, intended_s=wall(intended_ns), sent_s=wall(sent),
        schedule_lag_ms=round((sent - intended_ns) / 1e6, 3), in_flight_at_send=in_flight,
        sent_mono_ns=t.sent_ns or None,
        connected_s=None if t.connected_ns is None else wall(t.connected_ns),
        request_written_s=None if t.written_ns is None else wall(t.written_ns),
        headers_s=None if t.headers_ns is None else wall(t.headers_ns),
        first_chunk_s=None if t.first_chunk_ns is None else wall(t.first_chunk_ns),
        last_chunk_s=None if t.last_chunk_ns is None else wall(t.last_chunk_ns),
        end_s=wall(t.end_ns or time.perf_counter_ns()),
        ttft_ms=_ms(sent, t.first_chunk_ns), ttft_from_intended_ms=_ms(intended_ns, t.first_chunk_ns),
        worst_gap_ms=worst_gap,
        worst_gap_end_s=None if t.worst_gap_end_ns is None else wall(t.worst_gap_end_ns),
        total_ms=_ms(sent, t.last_chunk_ns), total_from_intended_ms=_ms(intended_ns, t.last_chunk_ns),
        chunks=t.chunks, prompt_tokens=t.prompt_tokens, completion_tokens=t.completion_tokens,
        finish_reason=t.finish_reason, status=t.status, response_id=t.response_id,
        reads=t.reads, max_events_per_read=t.max_events_per_read,
        max_read_delay_ms=None if t.max_read_delay_ns is None else round(t.max_read_delay_ns / 1e6, 3),
        late_coalesced_reads=t.late_coalesced_reads,
        client_coalesced=t.late_coalesced_reads > 0 and t.stamp != "capture", chunk_stamp=t.stamp,
        error_class=t.error_class, error=t.error,
        chunk_offsets_ms=None if t.chunk_ns is None else _offsets_ms(t.chunk_ns, sent),
        chunk_read_delays_ms=None if t.chunk_delay_ns is None else _delays_ms(t.chunk_delay_ns),
        chunk_read_offsets_ms=None if t.read_chunk_ns is None else _offsets_ms(t.read_chunk_ns, sent),
        prompt_source=cfg.prompts or DEFAULT_PROMPTS, endpoint=cfg.endpoint or DEFAULT_ENDPOINT,
        arrivals=order.arrivals or DEFAULT_ARRIVALS, prompt_tokens_tokenized=tokenized,
    )  # fmt: skip
