"""The per-request record: one schema written by the load path and read by the analysis.

Every request that was sent ends as exactly one record, successful or not. Records are appended
to a JSONL file per load-generator process as each request ends, and flushed, so killing the
generator loses only what was in flight, and a reader can tell how much that was.

Times: intervals (``*_ms``) come from a monotonic clock; absolute instants (``*_s``) are epoch
seconds derived from one wall-clock anchor per process, so records from several processes, and
server time series, share one axis.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TextIO

import orjson

from tailgate import jsonl, resultfiles
from tailgate.jsontypes import JsonMapping, JsonObject
from tailgate.load.arrivals import DEFAULT_ARRIVALS
from tailgate.load.payloads import DEFAULT_ENDPOINT
from tailgate.load.promptsources import DEFAULT_PROMPTS


@dataclass(slots=True)
class RequestRecord:
    # identity and plan
    run_id: str
    worker: str
    trace_id: int
    stage: int
    stage_label: str
    arm: str
    """``continuous`` or ``gated``."""
    rate_or_batch: float
    batch: int | None
    """Gated arm: index of the batch this request belongs to."""
    prompt_tokens_planned: int
    max_tokens: int
    ignore_eos: bool
    # client path, epoch seconds
    intended_s: float
    """When the plan said this request should go out (open loop: t0 + cumulative gaps)."""
    sent_s: float
    """When the client started the request (before connecting, as the reference harness does)."""
    schedule_lag_ms: float
    in_flight_at_send: int
    sent_mono_ns: int | None = None
    """The actual send on the generator's ``perf_counter_ns`` clock (``CLOCK_MONOTONIC`` on Linux): joins
    ``chunk_offsets_ms`` to a server's monotonic log on the same host without a wall-clock round trip."""
    connected_s: float | None = None
    """When the TCP (and TLS) connection was up. A gated batch connects all its requests first."""
    request_written_s: float | None = None
    """When the whole request had been handed to the kernel: the order in which these instants fall is the
    order in which the server can see the requests (a gated batch writes them in trace order)."""
    # response path, epoch seconds (None when never reached)
    headers_s: float | None = None
    first_chunk_s: float | None = None
    last_chunk_s: float | None = None
    end_s: float | None = None
    # derived, milliseconds from monotonic clocks
    ttft_ms: float | None = None
    """First content chunk minus actual send: the reference harness's TTFT."""
    ttft_from_intended_ms: float | None = None
    """First content chunk minus intended send: includes any client-side lateness."""
    worst_gap_ms: float | None = None
    """Longest interval between consecutive content chunks of this stream."""
    worst_gap_end_s: float | None = None
    """When the worst gap ended: lines stalls up against server-side events."""
    total_ms: float | None = None
    total_from_intended_ms: float | None = None
    chunks: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    status: int | None = None
    response_id: str | None = None
    # how much of this record's timing the client could have hidden (see tailgate/load/client.py)
    reads: int = 0
    """Reads that returned bytes of the response."""
    max_events_per_read: int = 0
    """The most content events one read delivered; they share one timestamp, so gaps between them read 0."""
    max_read_delay_ms: float | None = None
    """The longest a read's newest bytes waited in the kernel before the client read them (kernel receive
    stamp to ``recv`` return): a lower bound on how late this stream was timestamped. None: not measurable
    (TLS, no receive stamps)."""
    late_coalesced_reads: int = 0
    """Reads that delivered two or more content events more than 1 ms after their newest bytes arrived."""
    client_coalesced: bool = False
    """True when any read was late and coalesced: the client, not the server, may have merged chunks the
    server sent apart, so this stream's gaps are not a measurement of the server. Never with capture stamps:
    a late read no longer moves them."""
    chunk_stamp: str | None = None
    """What this record's chunk times are: ``capture`` (each chunk's segment's arrival, from a packet
    socket), ``kernel`` (the kernel's receive stamp of each read's newest bytes) or ``recv`` (each read's
    return); None in records from before the choice was recorded."""
    # workload (schema 3; older records load with these defaults: the seed's filler on completions, Poisson)
    prompt_source: str = DEFAULT_PROMPTS
    """Which prompt source built this request's prompt (``seed``, ``unique``, ``dataset``, ``prefix``,
    ``mooncake``)."""
    endpoint: str = DEFAULT_ENDPOINT
    """``completions`` or ``chat``. A chat stream's ``chunks`` include its first, role-only delta."""
    arrivals: str = DEFAULT_ARRIVALS
    """The arrival process of its stage (``poisson``, ``gamma``, ``trace``; ``batches`` for the gated arm)."""
    prompt_tokens_tokenized: int | None = None
    """The served tokenizer's count of the prompt as built (``/tokenize``), when a source measured it; the
    usage's ``prompt_tokens`` is what the server actually counted."""
    # outcome
    error_class: str | None = None
    error: str | None = None
    chunk_offsets_ms: list[float] | None = field(default=None)
    """Optional: every content chunk's arrival, ms after send (``--record-chunks``)."""
    chunk_read_delays_ms: list[float] | None = field(default=None)
    """Optional, with ``chunk_offsets_ms``: how long each chunk's read came after the kernel received the
    read's newest bytes (-1: unknown). The offset minus this is the kernel's stamp, the offset plus it (under
    ``TAILGATE_CHUNK_STAMP=kernel``) the ``recv`` one: the self-check compares both from one run."""
    chunk_read_offsets_ms: list[float] | None = field(default=None)
    """Optional, with capture stamps and ``chunk_offsets_ms``: the in-process stamps the capture replaced."""

    @property
    def ok(self) -> bool:
        return self.error_class is None

    def to_dict(self) -> JsonObject:
        """A shallow dict: ``asdict``'s deep copy of the chunk list cost more than the request's parsing,
        inside the event loop that times the other streams."""
        d: JsonObject = {name: getattr(self, name) for name in RECORD_FIELDS}
        # the workload fields at their defaults are left out: a seed run's records stay byte for byte what
        # schema 2 wrote, and readers fill the defaults in (``WORKLOAD_DEFAULTS``)
        for name, default in WORKLOAD_DEFAULTS.items():
            if d[name] == default:
                del d[name]
        if d["chunk_offsets_ms"] is None:
            del d["chunk_offsets_ms"]
        if d["chunk_read_delays_ms"] is None:
            del d["chunk_read_delays_ms"]
        if d["chunk_read_offsets_ms"] is None:
            del d["chunk_read_offsets_ms"]
        if d["chunk_stamp"] is None:  # a record that never met the load path's stamps (a lost worker's)
            del d["chunk_stamp"]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    def to_line(self) -> bytes:
        """The record as one JSON line, as the files hold it (:func:`json_line`)."""
        return json_line(self.to_dict())

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> RequestRecord:
        """A record read back (a file's line, a worker's message): the fields this schema knows, defaults for the
        ones a record may leave out (:data:`OPTIONAL_ON_DISK`), keys of a newer schema ignored.

        Raises :class:`RecordError` when a field every record carries is missing: such a line is not a record.
        """
        known = {name: row[name] for name in RECORD_FIELDS if name in row}
        if len(known) < len(_REQUIRED) or not _REQUIRED.issubset(known):
            missing = sorted(_REQUIRED.difference(known))
            raise RecordError(f"not a request record: no {', '.join(missing)}")
        return cls(**known)

    def for_summary(self) -> RequestRecord:
        """This record without its per-chunk lists: what the in-memory views keep (no summary reads the lists,
        and they are most of a record's size)."""
        if self.chunk_offsets_ms is None and self.chunk_read_delays_ms is None and self.chunk_read_offsets_ms is None:
            return self
        return replace(self, chunk_offsets_ms=None, chunk_read_delays_ms=None, chunk_read_offsets_ms=None)


class RecordError(ValueError):
    """A line or message that is not a request record."""


RECORD_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RequestRecord))
_REQUIRED: frozenset[str] = frozenset(
    f.name for f in fields(RequestRecord) if f.default is MISSING and f.default_factory is MISSING
)
WORKLOAD_DEFAULTS: dict[str, str | None] = {
    "prompt_source": DEFAULT_PROMPTS, "endpoint": DEFAULT_ENDPOINT, "arrivals": DEFAULT_ARRIVALS,
    "prompt_tokens_tokenized": None,
}  # fmt: skip
"""Schema 3's fields and the value a record without them (schema 2, or a seed run) means."""
OPTIONAL_ON_DISK: frozenset[str] = frozenset(
    {"chunk_offsets_ms", "chunk_read_delays_ms", "chunk_read_offsets_ms", "chunk_stamp", *WORKLOAD_DEFAULTS}
)
"""Fields a record on disk may leave out: per-chunk lists not asked for, a stamp never taken, workload defaults."""


def json_line(row: JsonMapping) -> bytes:
    """One compact JSON line, newline included.

    orjson, not ``json.dumps``: a record with 100 chunks' offsets and read delays costs ~93 us to encode with the
    standard library against ~11 us here, its dict included (``benchmarks/read_path.py --records``), and a load
    process encodes each one inside the loop that stamps the other streams' chunks. The text differs from
    ``json.dumps`` only in how floats under 1e-4 are spelled (``0.00001`` for ``1e-05``, the same value read
    back) and in writing NaN as null. An integer orjson refuses (beyond 64 bits) falls back to the standard
    encoder.
    """
    try:
        return orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:
        return (json.dumps(row, separators=(",", ":")) + "\n").encode()


def worker_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class RecordSink(Protocol):
    """Where a load process puts a finished request's record: its own file (:class:`RecordWriter`), or in a
    distributed run the stream to the master, the single writer of the files."""

    def write(self, record: RequestRecord) -> None: ...

    def close(self) -> None: ...


class SendSink(Protocol):
    """Where a load process notes each send before it goes out: its own journal (:class:`SendJournal`), or the
    master's, through the same stream."""

    def sent(self, stage: int, trace_id: int) -> None: ...

    def sent_many(self, stage: int, trace_ids: Iterable[int]) -> None: ...

    def dropped(self, stage: int, trace_id: int) -> None: ...

    def close(self) -> None: ...


class RecordWriter:
    """Appends one JSON line per finished request and flushes it at once.

    A line is written with a single ``write`` call so that a crash leaves at most one partial
    line at the end of the file, which :func:`read_records` skips and counts.
    """

    def __init__(self, directory: str | Path, worker: str | None = None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.worker = worker or worker_name()
        self.path = self.directory / resultfiles.records_file(self.worker)
        self._file: BinaryIO = open(self.path, "ab")
        self.written = 0

    def write(self, record: RequestRecord) -> None:
        self._file.write(record.to_line())
        self._file.flush()
        self.written += 1

    def close(self) -> None:
        self._file.close()


@dataclass(slots=True)
class RecordScan:
    records: list[RequestRecord]
    partial_lines: int
    """Lines that did not parse as a record: a generator killed mid-write leaves one at the end of a file."""
    files: int
    superseded: int = 0
    """Records dropped as second copies of one request: a ``worker_lost`` record written by the master for a
    worker that later reported the request itself, or a worker's own copy of what the master also wrote."""


def supersedes(new: RequestRecord, old: RequestRecord) -> bool:
    """A second record of one request replaces the first only when it is the worker's own and the first is the
    ``worker_lost`` the master wrote for it: the one rule of the files' reader and the live stage summary."""
    return old.error_class == "worker_lost" and new.error_class != "worker_lost"


def _one_per_request(rows: list[RequestRecord]) -> tuple[list[RequestRecord], int]:
    """Keep one record per (run, stage, request), the worker's own over a ``worker_lost`` written for it."""
    kept: dict[tuple[str, int, int], int] = {}
    out: list[RequestRecord] = []
    dropped = 0
    for row in rows:
        key = (row.run_id, row.stage, row.trace_id)
        at = kept.get(key)
        if at is None:
            kept[key] = len(out)
            out.append(row)
            continue
        dropped += 1
        if supersedes(row, out[at]):
            out[at] = row
    return out, dropped


record_files = resultfiles.record_files


def iter_record_lines(path: Path) -> Iterator[JsonMapping | None]:
    """Each record line, None for one that does not parse (counted by the callers)."""
    return jsonl.iter_objects(path)


def read_records(directory: str | Path) -> RecordScan:
    """Read every worker's records in a folder, skipping (and counting) unparsable lines."""
    out: list[RequestRecord] = []
    bad = 0
    files = record_files(directory)
    for path in files:
        for obj in iter_record_lines(path):
            try:
                out.append(RequestRecord.from_dict(obj if obj is not None else {}))
            except (RecordError, TypeError):
                bad += 1
    out, superseded = _one_per_request(out)
    return RecordScan(out, bad, len(files), superseded)


class SendJournal:
    """One short line per request, written just before it is sent (ahead of its send time, so the write
    never delays the send: a kill in between counts at most the next arrival, or one gated batch, as lost).

    Compared with the records, it tells how many requests were in flight (sent, never recorded)
    when a load generator died.
    """

    def __init__(self, directory: str | Path, worker: str) -> None:
        self.path = Path(directory) / resultfiles.sent_file(worker)
        self._file: TextIO = open(self.path, "a", encoding="utf-8", buffering=1)

    def sent(self, stage: int, trace_id: int) -> None:
        self._file.write(f"{stage} {trace_id}\n")

    def sent_many(self, stage: int, trace_ids: Iterable[int]) -> None:
        """Several requests in one ``write``: a gated batch is journaled before any of it goes out."""
        self._file.write("".join(f"{stage} {t}\n" for t in trace_ids))

    def dropped(self, stage: int, trace_id: int) -> None:
        """Take back a request journaled ahead of its send time that was then not sent (in-flight cap)."""
        self._file.write(f"{stage} {trace_id} dropped\n")

    def close(self) -> None:
        self._file.close()


def read_sent(directory: str | Path) -> set[tuple[int, int]]:
    """(stage, trace_id) pairs journaled as sent by every worker in a folder.

    Only newline-terminated lines count: a line cut by a crash could read as another request
    (``0 12`` cut to ``0 1``).
    """
    out: set[tuple[int, int]] = set()
    for path in sorted(Path(directory).glob(resultfiles.SENT_GLOB)):
        text = path.read_text(encoding="utf-8", errors="replace")
        for line in text[: text.rfind("\n") + 1].splitlines():
            entry = journal_entry(line)
            if entry is None:
                continue
            stage, trace_id, dropped = entry
            if dropped:
                out.discard((stage, trace_id))
            else:
                out.add((stage, trace_id))
    return out


def journal_entry(line: str | bytes) -> tuple[int, int, bool] | None:
    """One send-journal line as ``(stage, trace_id, dropped)``; None for anything else. The one parser of the
    journal: the analysis (:func:`read_sent`) and the live tab count sends the same way."""
    parts = line.split()
    if len(parts) not in (2, 3):
        return None
    try:
        stage, trace_id = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    if len(parts) == 2:
        return stage, trace_id, False
    tag = parts[2].decode() if isinstance(parts[2], bytes) else parts[2]
    return (stage, trace_id, True) if tag == "dropped" else None


@dataclass(frozen=True, slots=True)
class InFlightLoss:
    """Requests the send journal says were sent that have no readable record: lost with a killed generator."""

    sent: int
    recorded: int
    """Sent requests that have a record."""
    lost: int
    lost_by_stage: dict[int, int]
    unreadable_lines: int | None
    """Record lines that did not parse; only known when :func:`lost_in_flight` read the records itself."""


def lost_in_flight(directory: str | Path, recorded: Iterable[tuple[int, int]] | None = None) -> InFlightLoss:
    """What the send journal lists without a record.

    A load generator writes the journal line before a request goes out and the record when it
    ends, so the difference is exactly what was in flight when it died (a record cut mid-write
    counts as lost too). ``recorded`` takes ``(stage, trace_id)`` pairs a caller has already read,
    so a large run is not parsed twice; by default the folder's records are read here.
    """
    sent = read_sent(directory)
    unreadable: int | None = None
    if recorded is None:
        scan = read_records(directory)
        pairs = {(r.stage, r.trace_id) for r in scan.records}
        unreadable = scan.partial_lines
    else:
        pairs = {(int(stage), int(trace_id)) for stage, trace_id in recorded}
    lost = sent - pairs
    by_stage: dict[int, int] = {}
    for stage, _ in sorted(lost):
        by_stage[stage] = by_stage.get(stage, 0) + 1
    return InFlightLoss(len(sent), len(sent) - len(lost), len(lost), by_stage, unreadable)


WORKER_LOST = "worker_lost"
"""The error class of the record the master writes for a request in flight on a load process that was lost."""


@dataclass(frozen=True, slots=True)
class StageAccounting:
    """Where every planned arrival of a stage went: ``planned = recorded + lost_in_flight + never_sent``.

    The one rule, whoever counts: the load process when it closes a stage (the summary carries the counts),
    the report over a results folder, the coordinator waiting for the last records. None: the source that
    would say is missing (a run without a send journal cannot tell lost from never sent)."""

    planned: int | None
    sent: int | None
    """From the send journal (written before each send; by the master for workers), so a stopped or broken
    stage says how much of its plan never went out, not only what was recorded."""
    recorded: int
    lost_in_flight: int | None
    """Sent without a record, and the records written for requests in flight on a lost load process."""
    never_sent: int | None

    @property
    def ran_short(self) -> bool:
        """Part of the stage never went out or never came back."""
        return bool(self.never_sent) or bool(self.lost_in_flight)


def account_stage(
    planned: int | None, sent: Iterable[int] | None, recorded: Iterable[int], worker_lost: int = 0
) -> StageAccounting:
    """One stage's accounting from its plan size, the trace ids its journal lists as sent (None: no journal),
    the trace ids that have a record, and how many of those records are ``worker_lost``."""
    have = set(recorded)
    if sent is None:
        out_count: int | None = len(have)
        lost: int | None = None
    else:
        journal = set(sent)
        out_count, lost = len(journal), worker_lost + len(journal - have)
    never = planned - out_count if planned is not None and out_count is not None else None
    return StageAccounting(planned, out_count, len(have) - worker_lost, lost, never)
