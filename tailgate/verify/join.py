"""The self-check's join and its statistics: the client's records against the ground-truth server's
write log, chunk by chunk, and the tests the figures rest on (the Kolmogorov-Smirnov test of the
inter-arrival times, distributions of the errors).

Both sides read ``CLOCK_MONOTONIC``, so the join needs no clock synchronisation; the server's response
id ``cmpl-<seq>`` names the request, so it is exact by construction and anything unmatched is reported.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tailgate.records import RequestRecord
from tailgate.stats import percentile

if TYPE_CHECKING:  # the name only: the server's package is not loaded to join its log
    from tailgate.verify.groundtruth.settings import ChunkLogDump

_MS = 1e6

# ----------------------------------------------------------------------------------------- statistics


def kolmogorov_sf(x: float) -> float:
    """P(K > x) for the Kolmogorov distribution (the asymptotic KS null), by its alternating series.

    Below 0.2 the series converges too slowly to be worth summing and the value is 1 to eight
    decimals anyway.
    """
    if x <= 0.2:
        return 1.0
    total = 0.0
    for k in range(1, 101):
        term = math.exp(-2.0 * k * k * x * x)
        total += term if k % 2 else -term
        if term < 1e-16:
            break
    return min(1.0, max(0.0, 2.0 * total))


@dataclass(frozen=True, slots=True)
class KSResult:
    statistic: float
    """D = sup |F_n(x) - F(x)|."""
    n: int
    p_value: float
    """Asymptotic, with Stephens' small-sample correction ``(sqrt(n) + 0.12 + 0.11/sqrt(n)) * D``."""


def ks_exponential(samples: Sequence[float], rate: float) -> KSResult:
    """One-sample KS test of ``samples`` against Exp(``rate``), the rate known in advance (not fitted).

    The rate is the one the schedule was drawn with, so the textbook null distribution applies;
    fitting it from the data would need Lilliefors' tables instead.
    """
    if rate <= 0:
        raise ValueError("rate must be positive")
    xs = sorted(samples)
    n = len(xs)
    if n == 0:
        return KSResult(0.0, 0, 1.0)
    d = 0.0
    for i, x in enumerate(xs):
        cdf = -math.expm1(-rate * x) if x > 0 else 0.0
        d = max(d, (i + 1) / n - cdf, cdf - i / n)
    root = math.sqrt(n)
    return KSResult(d, n, kolmogorov_sf((root + 0.12 + 0.11 / root) * d))


def distribution(values: Sequence[float]) -> dict[str, float | int | None]:
    """n, min, p50, p99, p99.9 and max, the percentiles interpolated as everywhere else in tailgate."""
    if not values:
        return {"n": 0, "min": None, "p50": None, "p99": None, "p99.9": None, "max": None}
    xs = sorted(values)  # once: sorting a sorted list again is linear, and a run's log holds millions of chunks
    return {
        "n": len(xs),
        "min": xs[0],
        "p50": percentile(xs, 50),
        "p99": percentile(xs, 99),
        "p99.9": percentile(xs, 99.9),
        "max": xs[-1],
    }


# --------------------------------------------------------------------------------------------- join


@dataclass(slots=True)
class Join:
    """Client records matched to the server's chunk log, and every error derived from the match."""

    requests: int = 0
    """Records of the run (successful or not)."""
    failed: int = 0
    matched_requests: int = 0
    client_chunks: int = 0
    server_chunks: int = 0
    """Chunks the server wrote for the sequence numbers the records name."""
    matched_chunks: int = 0
    unclaimed_server_requests: int = 0
    """Completions the server streamed that no record names (a lost record, or another client)."""
    problems: list[str] = field(default_factory=list)
    chunk_error_ms: list[float] = field(default_factory=list)
    chunk_error_begin_ms: list[float] = field(default_factory=list)
    """The same against the instant the server's write call began: an upper bound, never negative
    for a correct match, that also holds when the server was descheduled inside its write."""
    ttft_error_ms: list[float] = field(default_factory=list)
    worst_gap_error_ms: list[float] = field(default_factory=list)
    worst_gap_beyond_write_ms: list[float] = field(default_factory=list)
    """The worst-gap error beyond what the server's own write calls leave open (logs with write begins): a
    chunk left the server somewhere between its write call's beginning and return, so any gap between
    ``max(begin[k+1] - return[k])`` and ``max(return[k+1] - begin[k])`` is a true worst gap. 0 inside
    that window, else the distance to it: the part of the error only the client can have made."""
    true_ttft_ms: list[float] = field(default_factory=list)
    true_worst_gap_ms: list[float] = field(default_factory=list)
    upload_ms: list[float] = field(default_factory=list)
    """Server's body-received minus the client's send: connect, upload and the server's parse."""
    schedule_lag_ms: list[float] = field(default_factory=list)
    sent_mono_ns: list[int] = field(default_factory=list)
    write_lateness_ms: list[float] = field(default_factory=list)
    """The server's own error, write minus its target: context for the client's."""
    by_stamp: dict[str, dict[str, list[float]]] = field(
        default_factory=lambda: {m: {"chunk": [], "ttft": [], "gap": []} for m in ("capture", "recv", "kernel")}
    )
    """Chunk, TTFT and worst-gap errors as each chunk stamp would have made them, from the same reads
    (records with ``chunk_read_delays_ms`` whose reads all had kernel stamps; with capture stamps, the
    in-process ones they replaced, ``chunk_read_offsets_ms``)."""

    @property
    def exact(self) -> bool:
        return (
            not self.problems
            and self.failed == 0
            and self.matched_requests == self.requests > 0
            and self.matched_chunks == self.client_chunks == self.server_chunks
            and self.unclaimed_server_requests == 0
        )


def _seq_of(response_id: object) -> int | None:
    if isinstance(response_id, str) and response_id.startswith("cmpl-") and response_id[5:].isdigit():
        return int(response_id[5:])
    return None


def server_writes(dump: ChunkLogDump) -> dict[int, dict[int, int]]:
    """seq -> {chunk index -> write-returned ns} from a ground-truth chunk-log document."""
    out: dict[int, dict[int, int]] = {}
    for seq, idx, t_ns in dump["chunks"]:
        out.setdefault(seq, {})[idx] = t_ns
    return out


def server_write_begins(dump: ChunkLogDump) -> dict[tuple[int, int], int]:
    """(seq, chunk index) -> the instant the write call began (empty for logs without it)."""
    begins = dump.get("chunk_write_begin") or []
    if len(begins) != len(dump["chunks"]):
        return {}
    return {(row[0], row[1]): b for row, b in zip(dump["chunks"], begins, strict=True)}


def _both_stamps(offsets: Sequence[float], delays: Sequence[float], stamp: str) -> dict[str, list[float]] | None:
    """Each chunk's offset under the ``recv`` and the ``kernel`` stamp, or None if a read had no kernel stamp."""
    if len(delays) != len(offsets) or any(d < 0 for d in delays):
        return None
    if stamp == "kernel":
        return {"kernel": list(offsets), "recv": [o + d for o, d in zip(offsets, delays, strict=True)]}
    return {"recv": list(offsets), "kernel": [o - d for o, d in zip(offsets, delays, strict=True)]}


def _all_stamps(rec: RequestRecord, offsets: Sequence[float], stamp: str) -> dict[str, list[float]]:
    """Each chunk's offset under every stamp the record lets us rebuild: ``capture`` where it was used, and
    the in-process ``kernel`` and ``recv`` from the same reads."""
    delays = rec.chunk_read_delays_ms or []
    if rec.chunk_stamp != "capture":
        return _both_stamps(offsets, delays, rec.chunk_stamp or stamp) or {}
    read = rec.chunk_read_offsets_ms
    if read is None or len(read) != len(offsets):
        return {"capture": list(offsets)}
    return {"capture": list(offsets), **(_both_stamps(read, delays, "kernel") or {})}


def beyond_write_window(client_gap_ms: float, returns: Sequence[int], begins: Sequence[int]) -> float:
    """How far a stream's client worst gap lies outside the worst gaps its server's write calls allow (ns in)."""
    pairs = range(len(returns) - 1)
    high = max(returns[k + 1] - begins[k] for k in pairs) / _MS
    low = max(begins[k + 1] - returns[k] for k in pairs) / _MS
    if client_gap_ms > high:
        return client_gap_ms - high
    return client_gap_ms - low if client_gap_ms < low else 0.0


def join_records(records: Sequence[RequestRecord], dump: ChunkLogDump, stamp: str = "recv") -> Join:
    """Match every record's chunks to the server's writes of the same sequence number and index.

    ``stamp`` names the chunk stamp the run used (``TAILGATE_CHUNK_STAMP``), so the other one can be
    rebuilt from the records' read delays and both compared on the same reads."""
    writes = server_writes(dump)
    begins = server_write_begins(dump)
    received = {row[0]: row[1] for row in dump.get("requests", [])}
    j = Join()
    claimed: set[int] = set()
    for rec in records:
        j.requests += 1
        if rec.error_class:
            j.failed += 1
            j.problems.append(f"trace {rec.trace_id}: {rec.error_class}: {rec.error}")
            continue
        j.schedule_lag_ms.append(rec.schedule_lag_ms)
        seq = _seq_of(rec.response_id)
        sent = rec.sent_mono_ns
        offsets = rec.chunk_offsets_ms
        if seq is None or sent is None or offsets is None:
            j.problems.append(f"trace {rec.trace_id}: no response id, sent_mono_ns or chunk offsets")
            continue
        j.sent_mono_ns.append(sent)
        if seq in claimed:
            j.problems.append(f"cmpl-{seq} claimed by two records")
            continue
        claimed.add(seq)
        mine = writes.get(seq, {})
        j.client_chunks += len(offsets)
        j.server_chunks += len(mine)
        if len(offsets) != len(mine):
            j.problems.append(f"cmpl-{seq}: client saw {len(offsets)} chunks, server wrote {len(mine)}")
        matched = 0
        for i, off in enumerate(offsets):
            t = mine.get(i)
            if t is None:
                continue
            matched += 1
            received_ms = sent / _MS + off
            j.chunk_error_ms.append(received_ms - t / _MS)
            if begins:
                j.chunk_error_begin_ms.append(received_ms - begins[(seq, i)] / _MS)
        j.matched_chunks += matched
        if matched != len(offsets) or not mine:
            continue
        j.matched_requests += 1
        ordered = [mine[i] for i in range(len(mine))] if len(mine) == max(mine) + 1 else sorted(mine.values())
        true_ttft = (ordered[0] - sent) / _MS
        j.true_ttft_ms.append(true_ttft)
        if rec.ttft_ms is not None:
            j.ttft_error_ms.append(rec.ttft_ms - true_ttft)
        true_gap = max((b - a for a, b in itertools.pairwise(ordered)), default=0) / _MS
        j.true_worst_gap_ms.append(true_gap)
        if rec.worst_gap_ms is not None and len(ordered) > 1:
            j.worst_gap_error_ms.append(rec.worst_gap_ms - true_gap)
            if begins and len(mine) == max(mine) + 1:
                starts = [begins[(seq, k)] for k in range(len(mine))]
                j.worst_gap_beyond_write_ms.append(beyond_write_window(rec.worst_gap_ms, ordered, starts))
        received_ns = received.get(seq)
        if received_ns is not None:
            j.upload_ms.append((received_ns - sent) / _MS)
        if len(ordered) == len(offsets):
            for mode, offs in _all_stamps(rec, offsets, stamp).items():
                got = j.by_stamp[mode]
                got["chunk"] += [sent / _MS + off - t / _MS for off, t in zip(offs, ordered, strict=True)]
                got["ttft"].append(offs[0] - true_ttft)
                if len(offs) > 1:
                    gap = max(b - a for a, b in itertools.pairwise(offs))
                    got["gap"].append(gap - true_gap)
    for lost in dump.get("workers_lost") or ():  # a worker of the server ended early: its streams are cut
        j.problems.append(f"server worker {lost.get('worker')} ended before the server was stopped: {lost}")
    j.unclaimed_server_requests = sum(1 for seq in writes if seq not in claimed)
    claimed_rows = [i for i, row in enumerate(dump["chunks"]) if row[0] in claimed]
    targets = dump.get("chunk_targets") or []
    if len(targets) == len(dump["chunks"]):
        j.write_lateness_ms = [(dump["chunks"][i][2] - targets[i]) / _MS for i in claimed_rows]
    return j
