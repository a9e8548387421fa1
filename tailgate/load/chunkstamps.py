"""When a stream's chunks arrived: one instant per read, the worst gap, and the signs of a late reader.

Every content event of one read gets the same instant (when the read returned, or with kernel stamps when
the kernel received its newest bytes): parsing the read's events must not spread their stamps. The first
content read's instant ends the TTFT. Only a read's first event can end a gap (the others follow it at 0),
so the gap, the count and the chunk stamps are updated once per read, after its events have been read.
"""

from __future__ import annotations

from itertools import repeat

from tailgate.load.sse import event_ends
from tailgate.load.timing import StreamTiming
from tailgate.stats import wider_gap

LATE_READ_NS = 1_000_000
"""A read this long after its newest bytes arrived is late: the client, not the server, set its events' times.
Matches the self-check's 1 ms bound on the client-added error."""


class ChunkStamper:
    """Stamps one stream's reads into its :class:`StreamTiming`.

    With ``body_offset`` (packet capture), it also notes where each content chunk ends in the response, so a
    capture can give the chunk the arrival of the segment that carried its last byte."""

    __slots__ = ("_kernel", "_last_bytes", "_raw_pos", "_tail", "timing")

    def __init__(self, timing: StreamTiming, *, kernel: bool, body_offset: int | None = None) -> None:
        self.timing = timing
        self._kernel = kernel
        self._last_bytes: list[int] | None = None
        if body_offset is not None:
            timing.chunk_last_bytes = self._last_bytes = []
        self._raw_pos = body_offset or 0
        """Where the next read starts in the response."""
        self._tail = b""
        """The previous read's last byte: an event's blank line may be split between two reads."""

    def stamp(self, read_ns: int, delay: int | None, content: int, others: int, data: bytes) -> None:
        """One read's ``content`` chunks (and ``others`` events): ``read_ns`` when it returned, ``delay`` how long
        its newest bytes had waited in the kernel (None: unknown), ``data`` what it brought."""
        timing = self.timing
        now = read_ns
        if delay is not None:
            if timing.max_read_delay_ns is None or delay > timing.max_read_delay_ns:
                timing.max_read_delay_ns = delay
            if self._kernel:
                now = read_ns - delay
        if content:
            last = timing.last_chunk_ns
            if last is None:
                timing.first_chunk_ns = now  # the TTFT's end: the read that brought the first content chunk
            # the comparison alone on the read path; the rule (stats.wider_gap) only when the gap widens
            elif now - last > timing.worst_gap_ns:
                timing.worst_gap_ns, timing.worst_gap_end_ns = wider_gap(
                    timing.worst_gap_ns, timing.worst_gap_end_ns, last, now
                )
            timing.last_chunk_ns = now
            timing.chunks += content
            if timing.chunk_ns is not None and timing.chunk_delay_ns is not None:
                timing.chunk_ns.extend(repeat(now, content))
                timing.chunk_delay_ns.extend(repeat(-1 if delay is None else delay, content))
            if content > timing.max_events_per_read:
                timing.max_events_per_read = content
            if content > 1 and delay is not None and delay > LATE_READ_NS:
                timing.late_coalesced_reads += 1
            if self._last_bytes is not None:
                tail = self._tail
                self._last_bytes.extend(event_ends(tail + data, self._raw_pos - len(tail), content, content + others))
        if self._last_bytes is not None:
            self._raw_pos += len(data)
            self._tail = data[-1:]


__all__ = ["LATE_READ_NS", "ChunkStamper"]
