"""The load path inside each Locust process: executes the schedule the shape hands out.

One dispatcher walks the absolute intended send times of an order and spawns each request as
its own greenlet, so a slow server never delays the next arrival (open loop). The dispatcher
never waits on a response; it only waits for the whole order to end before reporting back,
which is what lets the shape start the next stage or the next gated batch.
"""

from __future__ import annotations

import gevent
from gevent.event import Event
from gevent.pool import Group
from gevent.queue import Queue
from locust import User, task
from locust.runners import WorkerRunner

import logging
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from tailgate import arms
from tailgate.contracts import Order, OrderConfig, OrderDone
from tailgate.jsontypes import JsonMapping
from tailgate.load import distributed
from tailgate.load.batch import BatchGate
from tailgate.load.capturelink import StampSource
from tailgate.load.client import (
    StreamTiming,
    Target,
    Timeouts,
    build_request,
    chunk_stamp_mode,
    stream_completion,
)
from tailgate.load.clock import mono_ns
from tailgate.load.orderrequests import Plan, request_body, request_id, request_record
from tailgate.load.payloads import DEFAULT_ENDPOINT
from tailgate.load.prompts import Prompt
from tailgate.load.rxstamp import STAMP_AGREE_MS, kernel_clock_disagreement_ms
from tailgate.load.sendclock import SendClock
from tailgate.load.stagegc import QuietCollector
from tailgate.load.workload import build_prompt
from tailgate.records import RecordSink, RecordWriter, RequestRecord, SendJournal, SendSink, worker_name

log = logging.getLogger("tailgate")

ORDER_MESSAGE = "tailgate_order"
DONE_MESSAGE = "tailgate_done"
READY_MESSAGE = "tailgate_ready"
CANCEL_MESSAGE = "tailgate_cancel"

RECORD_YIELD_S = 0.002
"""The most a finished request's record waits for the loop to go idle before it is built and written.

Building, writing and reporting a record holds the loop for a few hundred microseconds; chunks that already
arrived for other streams should be stamped first. An unbounded ``gevent.idle()`` never returns while the
loop stays busy, and no wait at all stamps those chunks late: this bound measured 2-4x better at 80-150 req/s.
"""
PROGRESS_S = 5.0
"""How often a load process in a distributed run tells the shape how many requests it sent and ended."""
PROGRESS_MESSAGE = "tailgate_progress"


class Finished(NamedTuple):
    """A request whose stream ended, waiting for the sink to build, write and report its record."""

    order: Order
    plan: Plan
    timing: StreamTiming
    in_flight: int
    """Streams open when it was sent."""
    cfg: OrderConfig
    writer: RecordSink
    finished: list[RequestRecord] | None
    """One process: the order's records for its DONE (None: several processes, the master has them)."""


class OrderRunner:
    """Executes orders in this process and writes one record per request as it ends."""

    def __init__(self, environment: Any) -> None:
        self.environment = environment
        self.orders: Queue = Queue()
        self.worker = worker_name()
        self.in_flight = 0
        self.cancelled = False
        """Set by a stop: the dispatcher sends nothing more until the next run resets it."""
        self.sent = 0
        """Requests started by this process, all orders together (the progress line reads these counters)."""
        self.ended = 0
        self.stamp = chunk_stamp_mode()
        """The in-process stamp (``kernel`` or ``recv``); with capture, what a stream it missed keeps."""
        self.stamp_note: str | None = None
        """Why kernel stamps were given up in this process (its clock disagrees with the kernel's), if so."""
        self.stamps = StampSource()
        self.orphaned = False
        """This worker lost the master mid-run and stopped its load itself."""
        self.busy = False
        """An order is being run (sent or in flight)."""
        self.master_silence: Any = None
        """In a worker: seconds since the master was last heard if over ``MASTER_SILENCE_S``, else 0."""
        self._writers: dict[str, tuple[RecordSink, SendSink]] = {}
        self._group = Group()
        self._loop: gevent.Greenlet | None = None
        self._finished: deque[Finished] = deque()
        self._wake = Event()
        self._sink: gevent.Greenlet | None = None
        self._rows: list[RequestRecord] | None = None
        """One process: the running order's records as its stage summary needs them, reported with its DONE
        (several: the master has each record already, from the stream it writes to the files)."""

    def submit(self, order: Order | JsonMapping, reply: Callable[[OrderDone], None] | None = None) -> None:
        """Queue an order for this process's own order loop; its DONE goes to ``reply`` (a run in this one
        process: typed, in memory) or, without one, to the master as a message.

        The loop is not a Locust user's task: Locust stops and starts users when workers join or leave
        (rebalancing), and a stage in flight must not be cancelled by that."""
        if self.orphaned:  # the master is back and counts on this process again
            self.orphaned = False
            self.cancelled = False
        self.orders.put((order, reply))
        if self._loop is None or self._loop.dead:
            self._loop = gevent.spawn(self._order_loop)

    def _order_loop(self) -> None:
        send = self.environment.runner.send_message
        while True:
            order, reply = self.orders.get()
            self._rows = None
            try:
                self.busy = True
                result = self.run(order)
            except Exception as e:  # the master must hear of it, or it waits for this order until its deadline
                message: JsonMapping = order.to_dict() if isinstance(order, Order) else order
                log.exception("tailgate: order %s failed in %s", message.get("order_id"), self.worker)
                self.cancel()
                self.cancelled = False
                result = self._failed(message, f"{type(e).__name__}: {e}")
            finally:
                self.busy = False
            self.flush()
            if reply is not None:
                reply(result)
            else:
                send(DONE_MESSAGE, result.to_dict())

    def _failed(self, message: JsonMapping, error: str) -> OrderDone:
        """The DONE of an order that failed, named by what its message held (it may have failed its contract);
        what it recorded before failing still counts in the summary."""
        order_id, run_id, stage = (message.get(k) for k in ("order_id", "run_id", "stage"))
        return OrderDone(
            order_id=order_id if isinstance(order_id, str) else None,
            run_id=run_id if isinstance(run_id, str) else None,
            stage=stage if type(stage) is int else None,
            worker=self.worker, error=error, sent=self.sent, ended=self.ended, records=self._rows,
        )  # fmt: skip

    def _writer(self, results_dir: str) -> tuple[RecordSink, SendSink]:
        """A record file and send journal here, or, in a Locust worker, the stream to the master (the
        single writer of a distributed run)."""
        if results_dir not in self._writers:
            from locust.runners import WorkerRunner

            if isinstance(self.environment.runner, WorkerRunner):
                stream = distributed.WorkerStream(self.environment.runner, self.worker, results_dir)
                self._writers[results_dir] = (stream, stream)
            else:
                self._writers[results_dir] = (
                    RecordWriter(results_dir, self.worker),
                    SendJournal(results_dir, self.worker),
                )
        return self._writers[results_dir]

    def check_stamps(self) -> None:
        """Before each order: kernel stamps only while the kernel's clock agrees with this process's (it drifts
        apart under a sped-up libfaketime, so once at start would not do). A disagreement switches this process
        to ``recv`` stamps for good, with one line; a latency is then never computed across the two clocks."""
        if self.stamp != "kernel":
            return
        diff = kernel_clock_disagreement_ms()
        if diff is not None and abs(diff) > STAMP_AGREE_MS:
            self.stamp = "recv"
            self.stamp_note = (f"this process's wall clock is {diff:+.1f} ms off the kernel's (faked or stepped?): "
                               "chunks stamped when read (recv), not with kernel receive stamps")  # fmt: skip
            log.warning("tailgate: %s: %s", self.worker, self.stamp_note)

    def master_lost(self, silent_s: float) -> None:
        """No heartbeat from the master: send nothing more, cancel the streams (each ends as a ``cancelled``
        record) and leave this order's journal and records in the results folder, once."""
        if self.orphaned or not self.busy:
            return
        self.orphaned = True
        log.error("tailgate: %s: no word from the master for %.1f s: load stopped, streams cancelled",
                  self.worker, silent_s)  # fmt: skip
        self.cancel()
        for writer, _ in self._writers.values():
            if isinstance(writer, distributed.WorkerStream):
                folder = writer.spool()
                if folder is not None:
                    log.error("tailgate: %s: this stage's journal and records left in %s (%s files)",
                              self.worker, folder, distributed.UNREPORTED)  # fmt: skip

    def flush(self) -> None:
        """Records still batched go out before the DONE that follows them (one socket keeps the order)."""
        self.drain()
        for writer, _ in self._writers.values():
            if isinstance(writer, distributed.WorkerStream):
                writer.flush()

    def run(self, message: Order | JsonMapping) -> OrderDone:
        """Dispatch one order open-loop, wait for all its requests, return its DONE reply (a message from the
        master is checked against the order's contract first)."""
        order = message if isinstance(message, Order) else Order.from_dict(message)
        cfg = order.config
        target = Target.parse(cfg.host)
        timeouts = Timeouts(cfg.connect_timeout, cfg.request_timeout, cfg.stall_timeout)
        writer, journal = self._writer(cfg.results_dir)
        if isinstance(writer, distributed.WorkerStream):
            writer.begin_order(order)
        requested = cfg.chunk_stamp or chunk_stamp_mode()
        if self.stamp_note is None:  # not given up for good
            self.stamp = "recv" if requested == "recv" else "kernel"
        self.check_stamps()
        self.stamps.prepare(requested if self.stamp == "kernel" else self.stamp, target)
        capture = self.stamps.capture
        cap = order.max_in_flight
        t0_ns = mono_ns(order.t0_wall)
        stage = order.stage
        streamed = isinstance(writer, distributed.WorkerStream)
        finished: list[RequestRecord] | None = None if streamed else []
        self._rows = finished
        dropped = 0
        items = order.items
        # every request's bytes exist before the stage starts: nothing is built between a send time and its send
        bodies: dict[tuple[int, int], bytes] = {}
        requests: list[bytes] = []
        endpoint = cfg.endpoint or DEFAULT_ENDPOINT
        for item in items:
            trace_id, prompt_tokens, max_tokens, given = item.trace_id, item.prompt_tokens, item.max_tokens, item.prompt
            if given is not None:  # a built prompt (unique, dataset, prefix, trace blocks): one body per request
                body = request_body(cfg, Prompt.from_order(given), max_tokens, endpoint)
            else:
                cached = bodies.get((prompt_tokens, max_tokens))
                if cached is None:
                    cached = request_body(cfg, Prompt(text=build_prompt(prompt_tokens, cfg.prompt_word)),
                                          max_tokens, endpoint)  # fmt: skip
                    bodies[prompt_tokens, max_tokens] = cached
                body = cached
            rid = request_id(order.run_id, stage, trace_id)
            key = cfg.api_key or distributed.api_key()
            requests.append(build_request(target, body, key, rid, endpoint))
        progress = self._start_progress()
        gate = BatchGate(len(items)) if arms.arm(order.arm).starts_together else None
        # A local journal is written ahead of the send time, so the write never delays the send (a kill in
        # between counts at most one arrival, or one batch, as lost). A worker of a distributed run announces
        # each send to the master as it goes out instead: the master's count of what a lost worker had in
        # flight must not include an arrival it never sent.
        ahead = not isinstance(journal, distributed.WorkerStream)
        if gate is not None and ahead:
            journal.sent_many(stage, [item[0] for item in items])  # one write, before the batch's send time
        silent = self.master_silence
        send_clock = SendClock()
        wait_until = send_clock.wait_until
        spawn = self._group.spawn
        one = self._one
        quiet = QuietCollector()
        quiet.start()  # from the first send until every stream of the order has ended
        try:
            for index, (trace_id, prompt_tokens, max_tokens, offset_s, batch, *given) in enumerate(items):
                intended_ns = t0_ns + int(offset_s * 1e9)
                if gate is None and ahead:
                    journal.sent(stage, trace_id)
                wait_until(intended_ns)
                if not self.cancelled and silent is not None and silent():
                    # a thawed freeze: the timers fire before the master watch can run, and every overdue
                    # arrival would go out at once to a master that has written this share off
                    self.master_lost(silent())
                if self.cancelled:  # a stop: what was journaled ahead but not sent is taken back
                    if ahead:
                        for rest in items[index:] if gate is not None else items[index : index + 1]:
                            journal.dropped(stage, rest[0])
                    if gate is not None:
                        for unsent in range(index, len(items)):
                            gate.leave(unsent)
                    break
                if cap and self.in_flight >= cap:
                    if ahead:
                        journal.dropped(stage, trace_id)
                    dropped += 1
                    continue
                if not ahead:
                    journal.sent(stage, trace_id)
                tokenized = given[0][2] if given and given[0] is not None else None
                plan = (trace_id, prompt_tokens, max_tokens, intended_ns, batch, tokenized)
                spawn(one, order, plan, requests[index], target, timeouts, cfg, writer, finished, gate, index)
            if gate is not None:
                gate.flush()
            self._group.join()
            self.drain()
        finally:
            send_clock.close()
            quiet.end()
            if progress is not None:
                progress.kill(block=False)
        return OrderDone(
            order_id=order.order_id, run_id=order.run_id, stage=order.stage, worker=self.worker,
            dropped=dropped, sent=self.sent, ended=self.ended,
            stamp="capture" if capture else self.stamp, stamp_note=self.stamp_note or self.stamps.note,
            capture=self.stamps.stats(),
            records=finished,  # one process: the summary's records go with the DONE, in memory
        )  # fmt: skip

    def _one(
        self,
        order: Order,
        plan: Plan,
        request: bytes,
        target: Target,
        timeouts: Timeouts,
        cfg: OrderConfig,
        writer: RecordSink,
        finished: list[RequestRecord] | None,
        gate: BatchGate | None,
        index: int,
    ) -> None:
        timing = StreamTiming()
        in_flight = self.in_flight
        self.in_flight += 1
        self.sent += 1
        live = True
        try:
            stream_completion(
                target, b"", timing, timeouts=timeouts, api_key=cfg.api_key,
                record_chunks=cfg.record_chunks, request=request,
                write=None if gate is None else gate.writer(index), stamp=self.stamp,
                capture=self.stamps.capture,
            )  # fmt: skip
            self.in_flight -= 1  # the moment the stream ended, not when its record is written
            live = False
        finally:
            if live:
                self.in_flight -= 1
            if gate is not None:
                gate.leave(index)
            self.ended += 1
            # the record is built, written and reported by the sink, away from the path that stamps chunks;
            # a kill here still queues it, and close() writes whatever is queued
            self._finished.append(Finished(order, plan, timing, in_flight, cfg, writer, finished))
            self._wake.set()
            if self._sink is None or self._sink.dead:
                self._sink = gevent.spawn(self._sink_loop)

    def _sink_loop(self) -> None:
        """Writes finished requests one at a time, each after the loop went idle (or ``RECORD_YIELD_S``)."""
        while True:
            self._wake.wait()
            self._wake.clear()
            while self._finished:
                with gevent.Timeout(RECORD_YIELD_S, False):
                    gevent.idle()
                self._write_one()

    def _write_one(self) -> None:
        if not self._finished:
            return
        order, plan, timing, in_flight, cfg, writer, finished = self._finished.popleft()
        self.stamps.apply(timing, self.stamp)
        record = request_record(order, plan, timing, in_flight, cfg, self.worker)
        writer.write(record)
        if finished is not None:
            finished.append(record.for_summary())
        try:
            self._fire(record)
        except Exception:  # a listener's bug must not lose the records queued behind this one
            log.exception("tailgate: a request event listener failed")

    def drain(self) -> None:
        """Write every queued record now (end of an order, or shutting down)."""
        while self._finished:
            self._write_one()

    def _start_progress(self) -> gevent.Greenlet | None:
        """In a distributed run, report this process's counters to the shape every ``PROGRESS_S``."""
        runner = self.environment.runner
        if not isinstance(runner, WorkerRunner):
            return None

        def report() -> None:
            while True:
                gevent.sleep(PROGRESS_S)
                runner.send_message(PROGRESS_MESSAGE, {"sent": self.sent, "ended": self.ended})

        return gevent.spawn(report)

    def _fire(self, r: RequestRecord) -> None:
        """One request event per stream that ran its course, so Locust's RPS is the real request rate; a
        ``cancelled`` stream fires none (it is in the records, never a Locust failure).

        Its response time is the whole stream (send to last chunk, or to the failure); Locust rounds it
        into histogram buckets, so the tail figures are the exact ones of the Tail latency tab and the
        stage summaries, computed from the records."""
        if r.error_class == "cancelled":
            return  # a stream ended by a stop (or a lost master) is no failure of the server: no request event
        if r.error_class is None:
            elapsed, exception = r.total_ms or 0.0, None
        else:
            elapsed = round(((r.end_s or r.sent_s) - r.sent_s) * 1000, 3)
            exception = RuntimeError(f"{r.error_class}: {r.error}")
        self.environment.events.request.fire(
            request_type="STREAM", name=r.stage_label, response_time=elapsed,
            response_length=r.completion_tokens or r.chunks, exception=exception, context={"trace_id": r.trace_id},
        )  # fmt: skip

    def cancel(self) -> None:
        """Send nothing more and kill in-flight requests; each still writes a ``cancelled`` record on the way out."""
        self.cancelled = True
        self._group.kill(block=True, timeout=10)
        self.drain()

    def reset(self) -> None:
        """A new run starts in this process: forget the last one's orders, stop flag and files."""
        while not self.orders.empty():
            self.orders.get_nowait()
        self._group.kill(block=True, timeout=10)
        self.cancelled = False
        self.orphaned = False
        self.close()

    def close(self) -> None:
        self.drain()
        if self._sink is not None:
            self._sink.kill(block=False)
        for writer, journal in self._writers.values():
            writer.close()
            journal.close()
        self._writers.clear()


_RUNNERS: weakref.WeakKeyDictionary[Any, OrderRunner] = weakref.WeakKeyDictionary()
"""Each Locust environment's order runner: the hooks, the user and the coordinator's links reach the same one
through the environment they are handed, and a test's second environment in one process gets its own."""


def order_runner(environment: Any) -> OrderRunner:
    """The order runner of ``environment``, made on first use."""
    runner = _RUNNERS.get(environment)
    if runner is None:
        runner = _RUNNERS[environment] = OrderRunner(environment)
    return runner


class StreamingUser(User):
    """The one user per load-generator process: it runs whatever orders the shape sends.

    Arrivals are not Locust users. The shape keeps exactly one of these per process, and the
    dispatcher inside it spawns a greenlet per request, so in-flight requests are unbounded
    and independent of the user count.
    """

    fixed_count = 0
    wait_time = staticmethod(lambda: 0)

    def on_start(self) -> None:
        self.environment.runner.send_message(READY_MESSAGE, {"worker": order_runner(self.environment).worker})

    @task
    def idle(self) -> None:
        """Orders run in the process's own loop (:meth:`OrderRunner.submit`), which outlives this user."""
        gevent.sleep(1.0)
