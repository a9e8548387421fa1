"""What one streaming request observed, in ``perf_counter_ns`` ticks: the record's raw material.

Filled in by the request's parts as they run (the connection in :mod:`tailgate.load.transport`, the events'
meaning in :mod:`tailgate.load.completionevents`, the chunk stamps in :mod:`tailgate.load.chunkstamps`), so
a request cancelled half-way still reports what it saw.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class StreamTiming:
    """Everything one request observed, in ``perf_counter_ns`` ticks."""

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


__all__ = ["StreamTiming"]
