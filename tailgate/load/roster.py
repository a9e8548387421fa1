"""Which load processes take a stage: the ready handshake (only a worker that proved it holds the API key
by HMAC, :mod:`tailgate.load.peers`, counts as ready; the key is never sent), losses noticed between stages,
and the clock round trip measured from every process just before each stage.

A part of :class:`~tailgate.load.session.RunSession` of its own because it answers one question (who is
in, with which clock) apart from running the stages; the session holds the state it reads and writes.
"""

from __future__ import annotations

from gevent.event import Event

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tailgate.jsontypes import JsonObject
from tailgate.load import distributed
from tailgate.load.distributed import ClockSync
from tailgate.load.links import LoadLinks
from tailgate.load.options import Settings
from tailgate.load.peers import PeerGate
from tailgate.load.plan import Stage
from tailgate.load.runfiles import write_json
from tailgate.resultfiles import RUN_META

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
    """The session's ready, proof and clock bookkeeping (mixed into ``RunSession``, which sets every field)."""

    runner: Any
    settings: Settings
    folder: Path
    meta: JsonObject
    clock: ClockSync
    on_worker_loss: str
    workers: dict[str, LoadProcess]
    lost: dict[str, str]
    refused: dict[str, str]
    links: LoadLinks
    _nodes_expected: Callable[[], int]
    _ready: dict[str, str]
    _ready_event: Event
    gate: PeerGate | None
    written_off: Callable[[str], None] | None

    def workers_json(self) -> dict[str, JsonObject]:
        """``run.json``'s ``workers``: every load process that took a stage, by node id."""
        return {node: w.to_json() for node, w in self.workers.items()}

    def _refusals(self) -> None:
        """Peers that answered the challenge without the key in force: named once, listed, given nothing."""
        if self.gate is None or not self.settings.api_key:
            return
        for node, why in self.gate.refusals().items():
            if node not in self.refused and node not in self._ready:
                self.refused[node] = why
                log.error("tailgate: load process %s: given no orders (set %s in its environment)", why,
                          distributed.API_KEY_ENV)  # fmt: skip

    def _wait_ready(self) -> list[str]:
        expected = self._nodes_expected()
        deadline = time.monotonic() + READY_TIMEOUT_S
        self._refusals()
        while len(self._ready) + len(self.refused) < expected and (not self._ready or time.monotonic() < deadline):
            self._ready_event.clear()
            self._ready_event.wait(timeout=0.25)
            self._refusals()
        if len(self._ready) < expected:
            log.warning("tailgate: %d of %d load process(es) ready after %.0f s; going with those",
                        len(self._ready), expected, READY_TIMEOUT_S)  # fmt: skip
        return sorted(self._ready)

    def on_ready(self, node_id: str, worker: str) -> None:
        """A worker's user started. It only gets Locust's spawn once it proved the key; a peer that says ready
        without having proved it (a forged message) is not counted."""
        if not self.links.admitted(node_id, self.settings):
            log.error("tailgate: %s said it is ready without showing the key: ignored", worker)
            return
        self._ready[node_id] = worker
        self._ready_event.set()

    def _mark_lost(self, node: str, reason: str) -> None:
        """Written off for this run: its share is accounted, and the master tells it to quit when it is heard."""
        self.lost[node] = reason
        if self.written_off is not None:
            self.written_off(node)

    def _lost_reason(self, node: str) -> str | None:
        """Why a load process can no longer take part (written off, or its links say it is gone)."""
        if node in self.lost:
            return self.lost[node]
        return self.links.lost_reason(node)

    def _stage_nodes(self, stage: Stage) -> list[str]:
        """The processes that take this stage: every ready one not lost; one that joined since the
        last stage starts here, after its clock is measured (never in the middle of a stage)."""
        for node in sorted(self._ready):
            reason = None if node in self.lost else self._lost_reason(node)
            if reason:  # went between stages: nothing of it was in flight
                self._mark_lost(node, reason)
                if node in self.workers:
                    self.workers[node].lost = f"before {stage.label}: {reason}"
                log.error("tailgate: load process %s lost before %s (%s)", self._ready[node], stage.label, reason)
                if self.on_worker_loss == "stop":
                    raise WorkersLost(f"load process {self._ready[node]} lost before {stage.label} "
                                      "(--on-worker-loss stop)")  # fmt: skip
        nodes = sorted(n for n in self._ready if n not in self.lost)
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
                self._mark_lost(node, reason)
                if not joined:
                    self.workers[node].lost = f"before {stage.label}: {reason}"
                log.error("tailgate: load process %s %s %s; left out", self._ready[node], reason, stage.label)
                if self.on_worker_loss == "stop" and not joined:
                    raise WorkersLost(f"load process {self._ready[node]} lost before {stage.label} "
                                      "(--on-worker-loss stop)")  # fmt: skip
                continue
            offset_ms, rtt_ms = round(measured.offset_s * 1000, 3), round(measured.rtt_s * 1000, 3)
            if joined:
                self.workers[node] = LoadProcess(
                    worker=self._ready[node], clock_offset_ms=offset_ms, clock_rtt_ms=rtt_ms,
                    clock_rounds=measured.rounds, joined_stage=stage.label,
                )  # fmt: skip
                log.info("tailgate: load process %s: clock offset %+.3f ms (RTT %.3f ms)", self._ready[node],
                         offset_ms, rtt_ms)  # fmt: skip
            w = self.workers[node]
            w.clock_offset_ms, w.clock_rtt_ms = offset_ms, rtt_ms
            history = w.clock_by_stage
            history.append(ClockCheck(stage=stage.label, t=round(time.time(), 3), offset_ms=offset_ms, rtt_ms=rtt_ms))
            if len(history) > 1 and history[-1].t > history[0].t:
                span = history[-1].t - history[0].t
                moved_s = (history[-1].offset_ms - history[0].offset_ms) / 1000
                w.clock_drift_ppm = round(moved_s / span * 1e6, 1)
        self.meta["workers"] = self.workers_json()
        write_json(self.folder / RUN_META, self.meta)
        nodes = [n for n in nodes if n not in self.lost]
        if not nodes:
            raise WorkersLost("no load process left")
        return nodes
