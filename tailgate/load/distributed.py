"""What a run spread over Locust worker processes (on one host or many) needs beyond one process.

Four things, each kept out of the single-process path:

- **One writer.** Workers keep no files: each send is announced to the master the moment it goes
  out (the master writes the send journal) and finished records follow in small batches (the master
  writes the records). A worker that dies loses only what it had in flight, and the master, which
  knows what it announced, writes those as ``worker_lost`` records itself; a results folder on the
  master's disk is the whole run, whichever host sent what.
- **One clock.** When a worker reports ready the master measures its wall-clock offset over several
  round trips and keeps the one with the smallest round trip (its error is at most half that RTT).
  Orders carry the stage start converted to the worker's clock, and records come back converted to
  the master's, so a worker whose clock is seconds off still sends on the master's schedule.
- **No secret on the wire.** The API key never leaves the master: a worker reads it from its own
  environment (``TAILGATE_API_KEY``) or command line. When the master has a key, a worker must prove it
  holds the same one (an HMAC of a fresh nonce) before it is counted ready; a peer that cannot (a stranger
  on the master port) gets no order, so it learns neither the key nor the server.
- **Fresh before every stage.** Every worker a stage is split over answers a clock round trip just before
  the stage; one that does not is left out (nothing of it in flight), and each measured offset is kept, so a
  drifting clock shows up in ``run.json`` instead of in the arrivals.
- **Nothing discarded.** A worker declared lost that comes back (a partition heals) still has its send
  notices and records written; a record supersedes the ``worker_lost`` written for it, and the stage's
  summary is written again. A worker that hears nothing from the master for :data:`MASTER_SILENCE_S`
  stops sending, cancels its streams and leaves the stage's journal and records in the results folder.
- **Ports.** Locust's default master port (5557) makes two runs on one host cross-connect; tools of
  this project pick a free port instead.
"""

from __future__ import annotations

import gevent
from gevent.event import Event

import hashlib
import hmac
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from tailgate.contracts import Order
from tailgate.jsontypes import JsonMapping, JsonObject, json_float, json_floats, json_objects
from tailgate.load.clock import wall
from tailgate.load.processes import CHUNKS_PER_PROCESS, auto_processes, free_port, master_port_args
from tailgate.load.tally import StageTally
from tailgate.records import WORKER_LOST, RecordError, RequestRecord, json_line, worker_name
from tailgate.resultfiles import records_file, sent_file

__all__ = ["CHUNKS_PER_PROCESS", "auto_processes", "free_port", "master_port_args"]

log = logging.getLogger("tailgate")

SENT_MESSAGE = "tailgate_sent"
RECORDS_MESSAGE = "tailgate_records"
PING_MESSAGE = "tailgate_ping"
PONG_MESSAGE = "tailgate_pong"
CHALLENGE_MESSAGE = "tailgate_challenge"
PROOF_MESSAGE = "tailgate_proof"
MASTER_SILENCE_S = 3.0
"""A worker that heard no heartbeat from the master for this long stops its load on its own. Locust's master
sends one every second and marks a silent worker missing after about four, so a worker cut off stops close to
when the master writes off its share; whatever it sent meanwhile is reconciled when the link returns."""
UNREPORTED = "unreported"
"""Suffix of the journal and record files a worker writes itself when it lost the master."""

RECORD_BATCH = 32
"""Records per message at most: small enough that a message never holds the worker's loop for long."""
RECORD_FLUSH_S = 0.1
"""A finished record waits at most this long on its worker before it is sent to the master."""
SYNC_ROUNDS = 8
"""Round trips per clock measurement; the one with the smallest RTT gives the offset."""
SYNC_REPLY_TIMEOUT_S = 2.0
DEADLINE_MARGIN_S = 10.0
"""A group's deadline is its last arrival + the request timeout + connect timeout + this margin."""
LOSS_POLICIES = ("continue", "stop")
API_KEY_ENV = "TAILGATE_API_KEY"

_own_key: str | None = None


def add_arguments(parser: Any) -> None:
    g = parser.add_argument_group("tailgate distributed")
    g.add_argument(
        "--on-worker-loss",
        choices=LOSS_POLICIES,
        default="continue",
        help="a worker lost mid-run: continue with the others from the next stage, or stop the run",
    )


# -- secrets -----------------------------------------------------------------------------------------
def set_own_key(key: str | None) -> None:
    """The key of this worker's own command line (``--processes`` children inherit the master's)."""
    global _own_key
    _own_key = key or None


def api_key() -> str | None:
    """The worker's own environment, else its own command line: never anything received."""
    return os.environ.get(API_KEY_ENV) or _own_key


def proof(key: str | None, nonce: str) -> str | None:
    """What a worker answers a challenge with: shows it holds the key without sending it."""
    if not key:
        return None
    return hmac.new(key.encode(), nonce.encode(), hashlib.sha256).hexdigest()


def new_nonce() -> str:
    return secrets.token_hex(16)


def proof_ok(key: str | None, nonce: str, answer: Any) -> bool:
    expected = proof(key, nonce)
    return expected is None or (isinstance(answer, str) and hmac.compare_digest(expected, answer))


def on_challenge(environment: Any, msg: Any, **_: Any) -> None:
    nonce = str(msg.data.get("nonce") or "")
    answer = {"nonce": nonce, "proof": proof(api_key(), nonce), "worker": worker_name()}
    environment.runner.send_message(PROOF_MESSAGE, answer)


def master_gone(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """The master's host refuses a connection to its port: its process is gone for good. A partition (or a
    host that is down) answers nothing at all, which says nothing, so that is False."""
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


# -- worker side ----------------------------------------------------------------------------------------
class WorkerStream:
    """Stands in for the worker's send journal and record file: both go to the master instead.

    A send is announced at once (one small message) so the master knows what was in flight if this
    process dies; records are batched (:data:`RECORD_BATCH`, :data:`RECORD_FLUSH_S`). The current order's
    sends and records are also kept here until its DONE, so a worker that loses the master can leave them
    on disk itself (:meth:`spool`)."""

    def __init__(self, runner: Any, worker: str, folder: str) -> None:
        self.runner = runner
        self.worker = worker
        self.folder = folder
        self._batch: list[JsonObject] = []
        self._timer: gevent.Greenlet | None = None
        self.written = 0
        self.offset_s = 0.0
        """This worker's clock minus the master's, as the current order says (for :meth:`spool`)."""
        self._sends: list[tuple[int, int]] = []
        self._rows: list[JsonObject] = []

    def begin_order(self, order: Order) -> None:
        """A new order: what the master has of the last one is complete (its DONE followed it)."""
        self.offset_s = order.t0_wall - (order.t0_master or order.t0_wall)
        self._sends.clear()
        self._rows.clear()

    def sent(self, stage: int, trace_id: int) -> None:
        self._sends.append((stage, trace_id))
        self.runner.send_message(
            SENT_MESSAGE, {"folder": self.folder, "worker": self.worker, "sent": [stage, trace_id, time.time()]}
        )

    def sent_many(self, stage: int, trace_ids: Iterable[int]) -> None:
        """A gated batch, announced before any of it goes out (as the local journal does)."""
        for trace_id in trace_ids:
            self.sent(stage, trace_id)

    def dropped(self, stage: int, trace_id: int) -> None:
        """Take back an announced send that did not go out (in-flight cap, or a stop)."""
        self.runner.send_message(
            SENT_MESSAGE, {"folder": self.folder, "worker": self.worker, "dropped": [stage, trace_id]}
        )

    def write(self, record: RequestRecord) -> None:
        row = record.to_dict()
        self._rows.append(row)
        self._batch.append(row)
        self.written += 1
        if len(self._batch) >= RECORD_BATCH:
            self.flush()
        elif self._timer is None:
            self._timer = gevent.spawn_later(RECORD_FLUSH_S, self.flush)

    def flush(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None and timer is not gevent.getcurrent():
            timer.kill(block=False)
        if self._batch:
            batch, self._batch = self._batch, []
            self.runner.send_message(RECORDS_MESSAGE, {"folder": self.folder, "worker": self.worker, "records": batch})

    def spool(self) -> Path | None:
        """The current order's journal and records, written here (on the master's clock): the master may
        never have received them. Readers keep one record per request, so what did arrive counts once."""
        if not self._sends and not self._rows:
            return None
        folder = Path(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / sent_file(f"{self.worker}-{UNREPORTED}"), "a", encoding="utf-8") as f:
            f.write("".join(f"{stage} {trace_id}\n" for stage, trace_id in self._sends))
        with open(folder / records_file(f"{self.worker}-{UNREPORTED}"), "a", encoding="utf-8") as f:
            f.write(b"".join(json_line(to_master_clock(row, self.offset_s)) for row in self._rows).decode())
        return folder

    def close(self) -> None:
        self.flush()


def on_ping(environment: Any, msg: Any, **_: Any) -> None:
    """Answer at once, with this process's wall clock: the master times the round trip."""
    environment.runner.send_message(PONG_MESSAGE, {**msg.data, "t_worker": wall(time.perf_counter_ns())})


# -- master side --------------------------------------------------------------------------------------
ABSOLUTE_MIN_S = 1e8
"""Record fields named ``*_s`` above this are epoch instants (converted between clocks); below, durations."""


def to_master_clock(row: JsonMapping, offset_s: float) -> JsonMapping:
    """A worker's record on the master's clock: every epoch instant minus the worker's offset (a new object,
    keys in their order; the row itself when the clocks agree)."""
    if not offset_s:
        return row
    return {
        key: value - offset_s if key.endswith("_s") and isinstance(value, float) and value > ABSOLUTE_MIN_S else value
        for key, value in row.items()
    }


@dataclass(frozen=True)
class ClockReading:
    """A load process's clock against the master's, from the fastest of several round trips (the one a
    queue delayed least)."""

    offset_s: float
    """The process's wall clock minus the master's, at the midpoint of the round trip."""
    rtt_s: float
    rounds: int


class ClockSync:
    """Offsets of workers' wall clocks from the master's (worker minus master), by minimum RTT."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.offsets: dict[str, ClockReading] = {}
        self._replies: dict[str, tuple[float, float, float]] = {}
        self._event = Event()

    def on_pong(self, node: str, data: JsonMapping) -> None:
        """A ``PONG_MESSAGE``: the ping's own send time back, with the worker's clock at its answer."""
        received = time.time()  # before the reads: the round trip ends when the answer is here
        t_master, t_worker = json_float(data, "t_master", where="pong"), json_float(data, "t_worker", where="pong")
        self._replies[f"{node}:{data.get('seq')}"] = (t_master, received, t_worker)
        self._event.set()

    def measure(self, node: str, rounds: int = SYNC_ROUNDS) -> ClockReading | None:
        """None when any round goes unanswered: a node that cannot answer now must not take a stage."""
        best: tuple[float, float] | None = None
        for seq in range(rounds):
            key = f"{node}:{seq}"
            self._replies.pop(key, None)
            self.runner.send_message(PING_MESSAGE, {"seq": seq, "t_master": time.time()}, client_id=node)
            deadline = time.monotonic() + SYNC_REPLY_TIMEOUT_S
            while key not in self._replies and time.monotonic() < deadline:
                self._event.clear()
                self._event.wait(timeout=0.05)
            if key not in self._replies:
                return None
            t1, t2, tw = self._replies.pop(key)
            rtt = t2 - t1
            if best is None or rtt < best[0]:
                best = (rtt, tw - (t1 + t2) / 2)
        if best is None:
            return None
        result = ClockReading(offset_s=best[1], rtt_s=best[0], rounds=rounds)
        self.offsets[node] = result
        return result

    def offset(self, node: str) -> float:
        entry = self.offsets.get(node)
        return 0.0 if entry is None else entry.offset_s


class MasterSink:
    """The master's writer for one run: the send journal and records of every worker, on one disk.

    Keeps per worker what was announced sent and what was recorded, so a lost worker's share can be
    accounted exactly: announced but unrecorded -> a ``worker_lost`` record; never announced -> never sent.
    """

    def __init__(self, folder: Path, clock: ClockSync, tally: StageTally | None = None) -> None:
        self.folder = folder
        self.clock = clock
        self.tally = StageTally() if tally is None else tally
        """Every record written here, kept per stage for the stage summaries (see :mod:`tailgate.load.tally`)."""
        self.sent: dict[str, dict[tuple[int, int], float]] = {}
        self.recorded: dict[str, set[tuple[int, int]]] = {}
        self.workers: dict[str, str] = {}
        self.dead: set[str] = set()
        self._records: dict[str, TextIO] = {}
        self._journals: dict[str, TextIO] = {}
        self.late: Callable[[int], None] | None = None
        """Called with a stage index when a node already written off sends for it (a healed partition)."""

    def _file(self, files: dict[str, TextIO], worker: str, name: str) -> TextIO:
        f = files.get(worker)
        if f is None:
            f = open(self.folder / name, "a", encoding="utf-8", buffering=1)
            files[worker] = f
        return f

    def _mine(self, node: str, data: JsonMapping) -> bool:
        return data.get("folder") == str(self.folder)

    def _late(self, node: str, stage: int) -> None:
        """A lost node's data still counts: it was sent or recorded. Its stage's accounting is redone."""
        if node in self.dead and self.late is not None:
            self.late(stage)

    def on_sent(self, node: str, data: JsonMapping) -> None:
        """A ``SENT_MESSAGE``: ``sent`` is ``[stage, trace_id, wall time]``, ``dropped`` ``[stage, trace_id]``."""
        if not self._mine(node, data):
            return
        worker = self.workers.setdefault(node, str(data.get("worker") or node))
        if "dropped" in data:
            stage, trace_id = json_floats(data, "dropped", where="send notice")
            self.sent.get(node, {}).pop((int(stage), int(trace_id)), None)
            self._file(self._journals, worker, sent_file(worker)).write(f"{int(stage)} {int(trace_id)} dropped\n")
            self._late(node, int(stage))
            return
        stage, trace_id, t = json_floats(data, "sent", where="send notice")
        self.sent.setdefault(node, {})[(int(stage), int(trace_id))] = float(t) - self.clock.offset(node)
        self._file(self._journals, worker, sent_file(worker)).write(f"{int(stage)} {int(trace_id)}\n")
        self._late(node, int(stage))

    def on_records(self, node: str, data: JsonMapping) -> None:
        if not self._mine(node, data):
            return
        worker = self.workers.setdefault(node, str(data.get("worker") or node))
        offset = self.clock.offset(node)
        out = self._file(self._records, worker, records_file(worker))
        done = self.recorded.setdefault(node, set())
        lines = []
        records = []
        for row in json_objects(data, "records", where="records message"):
            row = to_master_clock(row, offset)
            lines.append(json_line(row))
            try:
                record = RequestRecord.from_dict(row)
            except (RecordError, TypeError) as e:  # written as it came; the files' reader counts it unreadable
                log.error("tailgate: %s sent a record this version cannot read (%s)", worker, e)
                continue
            done.add((record.stage, record.trace_id))
            records.append(record)
        if lines:
            out.write(b"".join(lines).decode())
            self.tally.add_many(records)
            for stage in {record.stage for record in records}:
                self._late(node, stage)

    def lose(self, node: str, order: Order, reason: str) -> tuple[int, int]:
        """Close a lost worker's order: returns (written as worker_lost, never sent).

        Anything that node still sends afterwards is written too (see :meth:`_late`): a real record supersedes
        the ``worker_lost`` one written here (:func:`tailgate.records.read_records` keeps one per request)."""
        self.dead.add(node)
        worker = self.workers.get(node, node)
        sent = self.sent.get(node, {})
        done = self.recorded.get(node, set())
        stage = order.stage
        lost = never = 0
        out = self._file(self._records, worker, records_file(worker))
        now = time.time()
        for trace_id, prompt_tokens, max_tokens, offset_s, batch, _ in order.items:
            key = (stage, int(trace_id))
            if key in done:
                continue
            if key not in sent:
                never += 1
                continue
            intended = order.t0_master + float(offset_s)
            record = RequestRecord(
                run_id=order.run_id, worker=worker, trace_id=int(trace_id), stage=stage,
                stage_label=order.stage_label, arm=order.arm, rate_or_batch=order.rate_or_batch, batch=batch,
                prompt_tokens_planned=prompt_tokens, max_tokens=max_tokens, ignore_eos=order.config.ignore_eos,
                intended_s=intended, sent_s=sent[key], schedule_lag_ms=round((sent[key] - intended) * 1000, 3),
                in_flight_at_send=-1, end_s=now, error_class=WORKER_LOST, error=reason,
            )  # fmt: skip
            out.write(record.to_line().decode())
            self.tally.add(record)
            lost += 1
        return lost, never

    def close(self) -> None:
        for f in [*self._records.values(), *self._journals.values()]:
            f.close()
        self._records.clear()
        self._journals.clear()
