"""Which load processes take a stage: the ready handshake (only a worker that proved it holds the API key
by HMAC, :mod:`tailgate.load.peers`, counts as ready; the key is never sent), losses noticed between stages,
and the clock round trip measured from every process just before each stage.

Held by :class:`~tailgate.load.session.RunSession` as a part of its own because it answers one question (who
is in, with which clock) apart from running the stages; it keeps who is ready, refused, lost and measured, and
is handed the links, the clock and the settings it shares with the session.
"""

from __future__ import annotations

from gevent.event import Event

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tailgate.jsontypes import JsonObject
from tailgate.load import distributed
from tailgate.load.distributed import ClockSync
from tailgate.load.links import LoadLinks
from tailgate.load.options import Settings
from tailgate.load.peers import PeerGate
from tailgate.load.plan import Stage

log = logging.getLogger("tailgate")

READY_TIMEOUT_S = 60.0
"""How long a run waits for every expected load process to report ready before it goes with those that did."""


@dataclass(frozen=True)
class ClockCheck:
    """One round-trip measurement of a load process's clock, taken just before a stage."""

    stage: str
    t: float
    offset_ms: float
    rtt_ms: float


@dataclass
class LoadProcess:
    """One load process of a distributed run as ``run.json``'s ``workers`` lists it: its name, its clock
    against the master's stage by stage, when it joined, how it stamped chunks, and its loss if any."""

    worker: str
    clock_offset_ms: float
    clock_rtt_ms: float
    clock_rounds: int
    joined_stage: str
    lost: str | None = None
    clock_by_stage: list[ClockCheck] = field(default_factory=list)
    clock_drift_ppm: float | None = None
    """How fast its clock moved against the master's; None until two stages measured it apart in time."""
    chunk_stamp: str | None = None
    """Absent from the file until an order's DONE says how this process stamped chunks."""
    chunk_stamp_note: str | None = None

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "worker": self.worker, "clock_offset_ms": self.clock_offset_ms, "clock_rtt_ms": self.clock_rtt_ms,
            "clock_rounds": self.clock_rounds, "joined_stage": self.joined_stage, "lost": self.lost,
            "clock_by_stage": [dataclasses.asdict(c) for c in self.clock_by_stage],
            "clock_drift_ppm": self.clock_drift_ppm,
        }  # fmt: skip
        if self.chunk_stamp is not None:
            out["chunk_stamp"] = self.chunk_stamp
        if self.chunk_stamp_note is not None:
            out["chunk_stamp_note"] = self.chunk_stamp_note
        return out


class WorkersLost(Exception):
    """No load process is left to take a stage."""


class WorkerRoster:
    """Who takes each stage of one run: the processes that said ready, those refused for want of the key, those
    written off, and each one's clock and losses as ``run.json`` lists them.

    The links, the clock and the settings are the session's, shared with its orders and its sink; the roster
    only asks them. ``run.json`` stays the session's file: the roster hands it the workers' lines through
    ``on_clocks`` once a stage's clocks are measured."""

    def __init__(
        self,
        settings: Settings,
        links: LoadLinks,
        clock: ClockSync,
        *,
        nodes_expected: Callable[[], int],
        on_worker_loss: str,
        gate: PeerGate | None,
        on_clocks: Callable[[dict[str, JsonObject]], None],
    ) -> None:
        self.settings = settings
        self.links = links
        self.clock = clock
        self._nodes_expected = nodes_expected
        self.on_worker_loss = on_worker_loss
        self._gate = gate
        """The master's admission of peers (the key proof); None in one process."""
        self._on_clocks = on_clocks
        self.ready: dict[str, str] = {}
        """Node id -> the worker's name, for every process that proved the key and said ready."""
        self._ready_event = Event()
        self.workers: dict[str, LoadProcess] = {}
        """Per load process: its name, clock offset and RTT, the stage it joined at, and a loss if any."""
        self.lost: dict[str, str] = {}
        self.refused: dict[str, str] = {}
        """Load processes that could not show they hold the key: never given an order."""

    def workers_json(self) -> dict[str, JsonObject]:
        """``run.json``'s ``workers``: every load process that took a stage, by node id."""
        return {node: w.to_json() for node, w in self.workers.items()}

    def name(self, node: str) -> str:
        """The worker's own name once it said ready; its node id before that."""
        return self.ready.get(node, node)

    def _refusals(self) -> None:
        """Peers that answered the challenge without the key in force: named once, listed, given nothing."""
        if self._gate is None or not self.settings.api_key:
            return
        for node, why in self._gate.refusals().items():
            if node not in self.refused and node not in self.ready:
                self.refused[node] = why
                log.error("tailgate: load process %s: given no orders (set %s in its environment)", why,
                          distributed.API_KEY_ENV)  # fmt: skip

    def wait_ready(self) -> list[str]:
        expected = self._nodes_expected()
        deadline = time.monotonic() + READY_TIMEOUT_S
        self._refusals()
        while len(self.ready) + len(self.refused) < expected and (not self.ready or time.monotonic() < deadline):
            self._ready_event.clear()
            self._ready_event.wait(timeout=0.25)
            self._refusals()
        if len(self.ready) < expected:
            log.warning("tailgate: %d of %d load process(es) ready after %.0f s; going with those",
                        len(self.ready), expected, READY_TIMEOUT_S)  # fmt: skip
        return sorted(self.ready)

    def on_ready(self, node_id: str, worker: str) -> None:
        """A worker's user started. It only gets Locust's spawn once it proved the key; a peer that says ready
        without having proved it (a forged message) is not counted."""
        if not self.links.admitted(node_id, self.settings):
            log.error("tailgate: %s said it is ready without showing the key: ignored", worker)
            return
        self.ready[node_id] = worker
        self._ready_event.set()

    def write_off(self, node: str, reason: str, *, at: str) -> None:
        """Written off for this run (``at``: the stage it was lost in, or before): its share is accounted, and
        the master tells it to quit when it is heard."""
        self.lost[node] = reason
        if self._gate is not None:
            self._gate.write_off(node)
        if node in self.workers:
            self.workers[node].lost = f"{at}: {reason}"

    def lost_reason(self, node: str) -> str | None:
        """Why a load process can no longer take part (written off, or its links say it is gone)."""
        if node in self.lost:
            return self.lost[node]
        return self.links.lost_reason(node)

    def stamped(self, node: str, stamp: str | None, note: str | None) -> None:
        """An order's DONE said how this process stamped chunks (and why not with kernel stamps)."""
        w = self.workers.get(node)
        if w is None:
            return
        if stamp:
            w.chunk_stamp = stamp
        if note:
            w.chunk_stamp_note = note

    def nodes_for(self, stage: Stage) -> list[str]:
        """The processes that take this stage: every ready one not lost; one that joined since the
        last stage starts here, after its clock is measured (never in the middle of a stage)."""
        for node in sorted(self.ready):
            reason = None if node in self.lost else self.lost_reason(node)
            if reason:  # went between stages: nothing of it was in flight
                self.write_off(node, reason, at=f"before {stage.label}")
                log.error("tailgate: load process %s lost before %s (%s)", self.ready[node], stage.label, reason)
                if self.on_worker_loss == "stop":
                    raise WorkersLost(f"load process {self.ready[node]} lost before {stage.label} "
                                      "(--on-worker-loss stop)")  # fmt: skip
        nodes = sorted(n for n in self.ready if n not in self.lost)
        if not nodes:
            raise WorkersLost("no load process left")
        if not self.links.measures_clocks:
            return nodes
        for node in nodes:
            # a fresh round trip from every process this stage is split over, just before it: one lost in the
            # settle (Locust notices after seconds) is left out instead of given a share it never sends, and the
            # offset follows a drifting clock
            joined = node not in self.workers
            measured = self.clock.measure(node)
            if measured is None:
                reason = "did not answer a clock round trip before the stage"
                self.write_off(node, reason, at=f"before {stage.label}")
                log.error("tailgate: load process %s %s %s; left out", self.ready[node], reason, stage.label)
                if self.on_worker_loss == "stop" and not joined:
                    raise WorkersLost(f"load process {self.ready[node]} lost before {stage.label} "
                                      "(--on-worker-loss stop)")  # fmt: skip
                continue
            offset_ms, rtt_ms = round(measured.offset_s * 1000, 3), round(measured.rtt_s * 1000, 3)
            if joined:
                self.workers[node] = LoadProcess(
                    worker=self.ready[node], clock_offset_ms=offset_ms, clock_rtt_ms=rtt_ms,
                    clock_rounds=measured.rounds, joined_stage=stage.label,
                )  # fmt: skip
                log.info("tailgate: load process %s: clock offset %+.3f ms (RTT %.3f ms)", self.ready[node],
                         offset_ms, rtt_ms)  # fmt: skip
            w = self.workers[node]
            w.clock_offset_ms, w.clock_rtt_ms = offset_ms, rtt_ms
            history = w.clock_by_stage
            history.append(ClockCheck(stage=stage.label, t=round(time.time(), 3), offset_ms=offset_ms, rtt_ms=rtt_ms))
            if len(history) > 1 and history[-1].t > history[0].t:
                span = history[-1].t - history[0].t
                moved_s = (history[-1].offset_ms - history[0].offset_ms) / 1000
                w.clock_drift_ppm = round(moved_s / span * 1e6, 1)
        self._on_clocks(self.workers_json())
        nodes = [n for n in nodes if n not in self.lost]
        if not nodes:
            raise WorkersLost("no load process left")
        return nodes
