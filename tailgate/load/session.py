"""One run of the experiment, from a Start (or a headless launch) to a finished results folder.

Locust keeps one shape object for the life of the process, but a web UI user presses Start many
times: each Start is a fresh :class:`RunSession` with its own run id, results folder, coordinator
greenlet and ``/metrics`` sampler, so nothing of one run (a finished flag, a ready worker, a stale
order, the host of the command line) leaks into the next.

A session ends in one of two ways, and both leave a finished run on disk:

- **naturally**: every stage is summarized (or ``--stop-on-errors`` ended it); the coordinator
  writes ``run.json`` as ``completed`` (or ``stopped after ...``);
- **stopped**: Stop in the UI, ``--run-time``, Ctrl-C or SIGTERM call :meth:`RunSession.stop`, which
  ends the coordinator, cancels the streams in flight (each is recorded as ``cancelled``), writes a
  summary marked ``partial`` for the stage that was running, ends the sampler and writes
  ``run.json`` as ``stopped``.
"""

from __future__ import annotations

import gevent
from gevent.event import Event

import dataclasses
import logging
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tailgate.arms import arm as arm_of
from tailgate.contracts import ContractError, Order, OrderConfig, OrderDone, StageSummary
from tailgate.jsontypes import JsonMapping, JsonObject, json_int
from tailgate.load.console import summary_line
from tailgate.load.distributed import DEADLINE_MARGIN_S, ClockSync, MasterSink
from tailgate.load.links import LoadLinks, OneProcess, WorkerProcesses
from tailgate.load.metrics import scrape
from tailgate.load.options import Settings
from tailgate.load.peers import PeerGate
from tailgate.load.plan import Stage, share
from tailgate.load.roster import WorkerRoster, WorkersLost
from tailgate.load.runfiles import run_metadata, write_json
from tailgate.load.sidecars import (
    REPORT_INTERRUPTED,
    launch_report,
    report_error,
    report_state,
    start_sampler,
    stop_helper,
)
from tailgate.load.stage_workload import order_item, stage_arrivals
from tailgate.load.stagesummaries import StageSummaries
from tailgate.load.tally import StageTally
from tailgate.records import WORKER_LOST, lost_in_flight
from tailgate.resultfiles import REPORT_LOG, RUN_META, report_html
from tailgate.runmeta import RunStatus, utc_stamp

log = logging.getLogger("tailgate")

START_LEAD_S = 0.25
"""Orders carry an absolute start time this far ahead, so every process has it before t0."""
DRAIN_TIMEOUT_S = 15.0
"""How long a stop waits for load processes to record the streams it cancelled."""


class StageDeadline(Exception):
    """A single-process stage outlived its deadline: its streams were cancelled and the run ends."""


class RunSession:
    """A single run: owns its folder, coordinator, sampler and, in the web UI, its report build; its roster
    (who takes each stage) and its stage summaries are parts of their own it hands what they share."""

    def __init__(
        self,
        runner: Any,
        settings: Settings,
        *,
        nodes_expected: Callable[[], int],
        own_folder: bool,
        local: bool,
        gate: PeerGate | None = None,
    ) -> None:
        self.runner = runner
        self.run_id = uuid.uuid4().hex[:12]
        self.started = time.time()
        if own_folder:
            stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(self.started))
            folder = settings.results_dir / f"{settings.arm}-{stamp}-{self.run_id}"
            folder.mkdir(parents=True, exist_ok=False)
            settings = dataclasses.replace(settings, results_dir=folder)
        settings.results_dir.mkdir(parents=True, exist_ok=True)
        self.settings = settings
        self.folder = settings.results_dir
        self.stages = settings.stages()
        self._nodes_expected = nodes_expected
        self.links: LoadLinks = OneProcess(runner, self._order_done) if local else WorkerProcesses(runner, gate)
        """How the coordinator reaches the processes that send: its own order runner, or Locust workers."""
        self.status = RunStatus.RUNNING.text()
        self.stop_reason: str | None = None
        self.failed: str | None = None
        self.ended_at: float | None = None
        self.ended = False
        """True once run.json holds the final status: nothing of this run runs any more."""
        self.natural_end = False
        """The coordinator ended the run itself (all stages, --stop-on-errors or a failure)."""
        self.stopping = False
        self.current: Stage | None = None
        self.report: subprocess.Popen[bytes] | None = None
        self._coordinator: gevent.Greenlet | None = None
        self._sampler: subprocess.Popen[bytes] | None = None
        self._done: dict[str, OrderDone] = {}
        """The running group's DONE by process: cleared in place, as the stage summaries read it too."""
        self._done_event = Event()
        self._waiting_for: set[str] = set()
        self._counts: dict[str, tuple[int, int]] = {}
        """Load process -> (requests sent, ended) as it last reported them (distributed runs)."""
        self.meta: JsonObject = {}
        self.clock = ClockSync(runner)
        self.tally = StageTally()
        """Every record the load processes reported, per stage: what the stage summaries are built from."""
        self.summaries = StageSummaries(settings, self.folder, self.run_id, self.stages, self.tally, self._done)
        self.sink: MasterSink | None = None if local else MasterSink(self.folder, self.clock, self.tally)
        """The single writer of a distributed run's records and send journal (None in one process)."""
        if self.sink is not None:
            self.sink.late = self.summaries.on_late
        self.stamp_notes: dict[str, str] = {}
        """Load process -> why it stamps chunks when read instead of with kernel stamps (clocks disagree)."""
        self.worker_errors: list[str] = []
        self._orders: dict[str, Order] = {}
        """The running group's order per process: a stop closes the share of any that is gone."""
        opts = getattr(getattr(runner, "environment", None), "parsed_options", None)
        self.on_worker_loss = getattr(opts, "on_worker_loss", None) or "continue"
        self.roster = WorkerRoster(
            settings, self.links, self.clock, nodes_expected=nodes_expected, on_worker_loss=self.on_worker_loss,
            gate=gate, on_clocks=self._write_workers,
        )  # fmt: skip

    def _write_workers(self, workers: dict[str, JsonObject]) -> None:
        """Every process's clock as measured before a stage, in ``run.json`` before the stage starts."""
        self.meta["workers"] = workers
        write_json(self.folder / RUN_META, self.meta)

    # -- life cycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self.meta = run_metadata(self.settings, self.run_id, self.started, self.stages, self._nodes_expected())
        write_json(self.folder / RUN_META, self.meta)
        self._sampler = self._start_sampler()
        self._coordinator = gevent.spawn(self._coordinate)

    @property
    def coordinator_alive(self) -> bool:
        return self._coordinator is not None and not self._coordinator.dead

    @property
    def sampler_alive(self) -> bool:
        return self._sampler is not None and self._sampler.poll() is None

    def stop(self, reason: str) -> None:
        """End a run that has not ended by itself; leaves the same finished folder a natural end does."""
        if self.ended or self.stopping:
            return
        self.stopping = True
        self.stop_reason = reason
        log.info("tailgate: stopping run %s (%s)", self.run_id, reason)
        if self._coordinator is not None:
            self._coordinator.kill(block=True, timeout=10)
        self._cancel_load()
        for node, order in sorted(self._orders.items()):
            lost_why = None if node in self._done or node in self.roster.lost else self.roster.lost_reason(node)
            if lost_why:  # its in-flight requests will never be recorded by it: close them now
                self._lose(node, order, lost_why)
        self._wait_recorded()
        stage = self.current
        if stage is not None and stage.index not in self.summaries.by_stage:
            records = self.tally.records(stage.index)
            after = scrape(self.settings.metrics_url) if self.settings.metrics_url else None
            summary = self.summaries.summarize(stage, records, after, partial=True)
            log.info("tailgate: %s (partial)", summary_line(summary))
        self._end(RunStatus.STOPPED.text())

    def _cancel_load(self) -> None:
        """Stop dispatching and cancel what is in flight, in every load process of this run."""
        self.links.cancel(self.roster.ready, self.run_id)

    def _wait_recorded(self) -> None:
        """Every request journaled as sent has its record: a worker process cancels on its own time."""
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while time.monotonic() < deadline:
            loss = lost_in_flight(self.folder, recorded=self.tally.keys())
            if loss.lost == 0:
                return
            gevent.sleep(0.1)
        log.warning("tailgate: %s: %d request(s) still without a record after %.0f s", self.run_id,
                    lost_in_flight(self.folder, recorded=self.tally.keys()).lost, DRAIN_TIMEOUT_S)  # fmt: skip

    def _end(self, status: str) -> None:
        if self.ended:
            return
        self._stop_sampler()
        if self.sink is not None:
            self.sink.close()
        self.status = status
        summaries = self.summaries.by_stage
        self.meta.update({
            "workers": self.roster.workers_json(), "workers_lost": self.roster.lost,
            "worker_errors": self.worker_errors, "on_worker_loss": self.on_worker_loss,
            "workers_refused": self.roster.refused,
            "chunk_stamp_notes": self.stamp_notes,
        })  # fmt: skip
        self.meta.update({
            "ended": utc_stamp(), "status": status, "stop_reason": self.stop_reason,
            "stages": [summaries[i].stage_label for i in sorted(summaries)],
            "partial_stages": [s.stage_label for _, s in sorted(summaries.items()) if s.partial],
            "error": self.failed,
        })  # fmt: skip
        write_json(self.folder / RUN_META, self.meta)
        self.ended_at = time.time()
        self.ended = True

    # -- the coordinator --------------------------------------------------------------------------
    def _coordinate(self) -> None:
        s = self.settings
        status = RunStatus.COMPLETED.text()
        try:
            nodes = self.roster.wait_ready()
            log.info("tailgate: run %s: %d load process(es) ready; %d stage(s); results in %s",
                     self.run_id, len(nodes), len(self.stages), self.folder)  # fmt: skip
            for stage in self.stages:
                summary = self._run_stage(stage, self.roster.nodes_for(stage))
                log.info("tailgate: %s", summary_line(summary))
                if summary.workers_lost and self.on_worker_loss == "stop":
                    status = RunStatus.STOPPED_AFTER.text(f"{stage.label}: load process(es) lost")
                    log.error("tailgate: %s (--on-worker-loss stop)", status)
                    break
                if s.stop_on_errors and summary.errors >= s.stop_on_errors:
                    status = RunStatus.STOPPED_AFTER.text(f"{stage.label}: {summary.errors} errors")
                    log.error("tailgate: %s (--stop-on-errors %d)", status, s.stop_on_errors)
                    break
                if stage is not self.stages[-1] and s.settle:
                    gevent.sleep(s.settle)
        except gevent.GreenletExit:
            raise  # stop() ends the run
        except (StageDeadline, WorkersLost) as e:
            status = RunStatus.STOPPED_IN_STAGE.text(str(e))
            log.error("tailgate: %s", status)
        except Exception as e:  # surface a clear line, then let the run end
            self.failed = f"{type(e).__name__}: {e}"
            status = RunStatus.FAILED.text()
            log.exception("tailgate run failed")
        self.natural_end = True
        self._end(status)

    def on_done(self, node_id: str, data: object) -> None:
        """A worker's DONE message, checked against its contract."""
        try:
            done = OrderDone.from_dict(data, source=f"load process {self.roster.name(node_id)}")
        except ContractError as e:  # said once; the order is then waited for as if no DONE had come
            self.worker_errors.append(str(e))
            log.error("tailgate: %s", e)
            return
        self._order_done(node_id, done)

    def _order_done(self, node_id: str, done: OrderDone) -> None:
        if done.run_id not in (None, self.run_id):
            return  # a cancelled order of an earlier run
        if done.records:  # one process: the order's records come with its DONE (several: streamed)
            self.tally.add_many(done.records)
        if node_id in self.roster.lost:
            return  # its share was closed already: written as worker_lost or never sent
        worker = done.worker or node_id
        if done.error:
            line = f"load process {worker} failed: {done.error}"
            self.worker_errors.append(line)
            log.error("tailgate: %s", line)
        if done.stage is not None:
            self.summaries.add_dropped(done.stage, done.dropped)
        if done.stamp_note:
            self.stamp_notes[worker] = done.stamp_note
        self.roster.stamped(node_id, done.stamp, done.stamp_note)
        self._done[node_id] = done
        # exact counters at the end of each order, so a stage's baseline is never stale
        self._counts[node_id] = (done.sent, done.ended)
        if self._waiting_for <= set(self._done):
            self._done_event.set()

    def on_progress(self, node_id: str, data: JsonMapping) -> None:
        """A load process's counters (``PROGRESS_MESSAGE``), read once per message."""
        where = f"progress of {self.roster.name(node_id)}"
        self._counts[node_id] = (json_int(data, "sent", where=where), json_int(data, "ended", where=where))

    def _sent_ended(self) -> tuple[int, int]:
        """Requests sent and ended so far by every load process, from their in-memory counters."""
        return self.links.sent_ended(self._counts)

    def _run_stage(self, stage: Stage, nodes: list[str]) -> StageSummary:
        s = self.settings
        self.summaries.begin(stage)
        self.current = stage
        baseline = self._sent_ended()
        self.summaries.split_over(stage.index, nodes)
        lost_here: list[str] = []
        for group in stage.groups:
            t0 = time.time() + (START_LEAD_S if len(nodes) > 1 or group is stage.groups[0] else 0.0)
            self._done.clear()
            self._done_event.clear()
            self._waiting_for = set(nodes)
            orders: dict[str, Order] = {}
            self._orders = orders
            config = self._order_config()
            for index, node in enumerate(nodes):
                mine = share(group, index, len(nodes))
                order = Order(
                    order_id=f"{stage.index}:{mine[0].batch if mine else 0}:{index}",
                    run_id=self.run_id, stage=stage.index, stage_label=stage.label, arm=stage.arm,
                    rate_or_batch=stage.rate_or_batch, t0_wall=t0 + self.clock.offset(node), t0_master=t0,
                    max_in_flight=s.max_in_flight if arm_of(stage.arm).open_loop else 0,
                    items=[order_item(a) for a in mine], config=config, arrivals=stage_arrivals(s, stage),
                )  # fmt: skip
                orders[node] = order
                self.links.send_order(node, order)
            last = max((a.offset_s for a in group), default=0.0)
            deadline = t0 + last + s.timeouts.request_s + s.timeouts.connect_s + DEADLINE_MARGIN_S
            lost_here += self._wait_group(stage, orders, deadline, baseline)
            nodes = [n for n in nodes if n not in self.roster.lost]
            if not nodes and group is not stage.groups[-1]:
                break  # nobody left for the next batches: they stay never sent
        records = self.tally.records(stage.index)
        after = scrape(s.metrics_url) if s.metrics_url else None
        summary = self.summaries.summarize(stage, records, after, partial=False, lost=lost_here)
        if not nodes:
            raise WorkersLost(f"every load process was lost in {stage.label}")
        return summary

    def _wait_group(
        self, stage: Stage, orders: dict[str, Order], deadline: float, baseline: tuple[int, int]
    ) -> list[str]:
        """Wait for every order's DONE, but never past the deadline and never for a worker that is gone.

        Returns the lines saying which processes were lost; their share is closed by :meth:`_lose`."""
        pending = set(orders)
        lost: list[str] = []
        next_progress = time.monotonic() + 5.0
        while True:
            pending -= set(self._done)
            for node in sorted(pending):
                reason = self.roster.lost_reason(node)
                if reason:
                    lost.append(self._lose(node, orders[node], reason))
                    pending.discard(node)
            if not pending:
                return lost
            if time.time() > deadline:
                if not self.links.can_lose:  # the one process stops with the run
                    self.links.cancel(pending, self.run_id)
                    self._wait_recorded()
                    raise StageDeadline(f"{stage.label} passed its deadline; streams in flight were cancelled")
                for node in sorted(pending):
                    lost.append(self._lose(node, orders[node], "did not finish its share by the stage deadline"))
                return lost
            self._done_event.clear()
            self._done_event.wait(timeout=0.5)
            if time.monotonic() > next_progress:
                self._progress(stage, baseline)
                next_progress = time.monotonic() + 5.0

    def _lose(self, node: str, order: Order, reason: str) -> str:
        """Close a lost worker's share from what it announced: in flight -> worker_lost, the rest never sent."""
        assert self.sink is not None
        in_flight, never = self.sink.lose(node, order, reason)
        self.roster.write_off(node, reason, at=order.stage_label)
        self.summaries.mark_lost(node, order.stage)
        name = self.roster.name(node)
        line = (f"load process {name} lost in {order.stage_label} ({reason}): {in_flight} request(s) in flight "
                f"recorded as {WORKER_LOST}, {never} arrival(s) never sent; "
                + ("the run goes on with the others" if self.on_worker_loss == "continue" else
                   "the run stops after this stage (--on-worker-loss stop)"))  # fmt: skip
        log.error("tailgate: %s", line)
        try:  # alive but late: it must not keep sending what was already accounted for
            self.links.cancel([node], self.run_id)
        except Exception:
            pass
        return line

    def _progress(self, stage: Stage, baseline: tuple[int, int]) -> None:
        """Requests sent and ended so far in this stage, counted in memory by the load processes."""
        sent_now, ended_now = self._sent_ended()
        sent, ended = sent_now - baseline[0], ended_now - baseline[1]
        elapsed = time.time() - self.summaries.stage_started[stage.index]
        eta = f", about {elapsed / ended * (stage.size - ended):.0f} s left" if ended else ""
        cell = f"{self.settings.config_label}_{stage.label}"  # the cell's one name, as in summary_line
        log.info("tailgate: %s: %d/%d ended, %d in flight%s", cell, ended, stage.size, sent - ended, eta)

    def _order_config(self) -> OrderConfig:
        s = self.settings
        return OrderConfig(
            host=s.host, model=s.model, ignore_eos=s.ignore_eos,
            api_key=self.links.key_in_orders(s),
            prompt_word=s.prompt_word, record_chunks=s.record_chunks, results_dir=str(self.folder),
            prompts=s.prompts, endpoint=s.endpoint,
            connect_timeout=s.timeouts.connect_s, request_timeout=s.timeouts.request_s,
            stall_timeout=s.timeouts.stall_s, chunk_stamp=s.chunk_stamp,
        )  # fmt: skip

    # -- helper processes -------------------------------------------------------------------------
    def _start_sampler(self) -> subprocess.Popen[bytes] | None:
        return start_sampler(self.settings, self.folder)

    def _stop_sampler(self) -> None:
        sampler, self._sampler = self._sampler, None
        stop_helper(sampler)

    def launch_report(self) -> None:
        """Build the HTML report in another process: pandas and matplotlib would hold this event loop,
        which stamps the chunks of the next run, for seconds."""
        if self.report is None:
            self.report = launch_report(self.folder)

    @property
    def report_html(self) -> Path:
        return report_html(self.folder)

    def report_state(self) -> str:
        """``none``, ``building``, ``ready``, ``failed`` or ``interrupted``."""
        return report_state(self.report, self.folder)

    def report_error(self) -> str | None:
        return report_error(self.report, self.folder)

    def end_report(self) -> None:
        """The process is quitting while the report builds: end the build and say so where the report would be."""
        if self.report is not None and self.report.poll() is None:
            self.report.terminate()
            try:
                self.report.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.report.kill()
            note = (f"report interrupted while building (the web UI was shut down); build it with: "
                    f"tailgate report {self.folder}")  # fmt: skip
            with open(self.folder / REPORT_LOG, "a", encoding="utf-8") as out:
                out.write(f"\n{REPORT_INTERRUPTED}: {note}\n")
            log.warning("tailgate: run %s: %s", self.run_id, note)
