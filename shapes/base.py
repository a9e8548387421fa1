"""The shape owns the admission policy: which requests go out when, stage by stage.

Locust calls ``tick()`` about once a second and only understands user counts, so the shape
asks for exactly one :class:`~tailgate.load.worker.StreamingUser` per load-generator process and
drives the experiment from a coordinator greenlet instead (:mod:`tailgate.load.session`): it sends
each process its share of the schedule, waits until every request of a group has ended, reads the
preemption counter around each stage, and writes the stage summary. ``tick()`` returns ``None``
when the last stage is summarized, which ends a headless run.

Locust keeps this object for the whole process while the web UI may start many runs, so the
shape itself holds no run state: the first ``tick()`` after a Start opens a fresh
:class:`~tailgate.load.session.RunSession` from the settings validated for that Start, and the
end of the run (natural, Stop, or quitting) closes it.
"""

from __future__ import annotations

import gevent
from locust import LoadTestShape, events
from locust.runners import MasterRunner

import logging
from typing import Any, ClassVar

from tailgate.exitcodes import run_exit_code
from tailgate.load.options import Settings
from tailgate.load.peers import PeerGate
from tailgate.load.session import RunSession
from tailgate.optiontable import OptionError

log = logging.getLogger("tailgate")


class SuiteShape(LoadTestShape):
    """Base for the two admission arms; subclasses only name their arm."""

    arm: ClassVar[str] = ""
    abstract = True

    def __init__(self) -> None:
        super().__init__()
        self.pending: Settings | None = None
        """Settings validated for the next Start (command line when headless, the form in the web UI)."""
        self.session: RunSession | None = None
        """The run in progress, from its first tick until the end of the run is handled."""
        self.runs: list[RunSession] = []
        """Every run this process started, oldest first (the live tab shows the newest)."""
        self.own_folders = False
        """Web UI: each run gets its own folder under ``--results-dir`` instead of the folder itself."""
        self.quitting = False
        self.gate: PeerGate | None = None
        """The master's admission of peers (set when this process is a master)."""
        self.signum: int | None = None
        """The signal that ends this process (SIGINT, SIGTERM, SIGHUP), for its exit code."""

    # -- Locust hooks ---------------------------------------------------------------------
    def workers_expected(self) -> int:
        runner = self.runner
        if isinstance(runner, MasterRunner):
            return max(1, runner.worker_count)
        return 1

    def tick(self) -> tuple[int, float] | None:
        session = self.session
        if session is None:
            if self.pending is None:
                log.error("tailgate: Start without validated settings; nothing to run")
                return None
            session = self.begin()
        if session.natural_end and session.ended:
            return None
        users = self.workers_expected()
        return users, float(users)

    def on_ready(self, environment: Any, msg: Any, **_: Any) -> None:
        if self.session is not None:
            self.session.roster.on_ready(msg.node_id, msg.data.get("worker", msg.node_id))

    def on_done(self, environment: Any, msg: Any, **_: Any) -> None:
        if self.session is not None:
            self.session.on_done(msg.node_id, msg.data)

    def on_progress(self, environment: Any, msg: Any, **_: Any) -> None:
        if self.session is not None:
            self.session.on_progress(msg.node_id, msg.data)

    def on_sent(self, environment: Any, msg: Any, **_: Any) -> None:
        if self.session is not None and self.session.sink is not None:
            self.session.sink.on_sent(msg.node_id, msg.data)

    def on_records(self, environment: Any, msg: Any, **_: Any) -> None:
        if self.session is not None and self.session.sink is not None:
            self.session.sink.on_records(msg.node_id, msg.data)

    def on_pong(self, environment: Any, msg: Any, **_: Any) -> None:
        if self.session is not None:
            self.session.clock.on_pong(msg.node_id, msg.data)

    # -- runs -------------------------------------------------------------------------------
    @property
    def settings(self) -> Settings | None:
        if self.pending is not None:
            return self.pending
        return None if self.session is None else self.session.settings

    @property
    def failed(self) -> str | None:
        """The newest run's failure, for the process exit code."""
        return self.runs[-1].failed if self.runs else None

    @property
    def cut_short(self) -> bool:
        """The newest run ended itself before its last stage (a loss under ``stop``, errors, no worker left)."""
        run = self.runs[-1] if self.runs else None
        return bool(run and run.natural_end and str(run.status).startswith("stopped"))

    def exit_code(self, *, defect: bool = False) -> int:
        """This process's exit code under the one rule (:mod:`tailgate.exitcodes`), from its newest run."""
        run = self.latest
        return run_exit_code(
            signum=self.signum, failed=defect or bool(self.failed), cut_short=self.cut_short,
            lost=bool(run and run.roster.lost), stopped=bool(run and run.status == "stopped"),
        )  # fmt: skip

    @property
    def latest(self) -> RunSession | None:
        return self.runs[-1] if self.runs else None

    def configure(self, settings: Settings) -> None:
        self.pending = settings

    def begin(self) -> RunSession:
        settings, self.pending = self.pending, None
        assert settings is not None
        session = RunSession(
            self.runner, settings, nodes_expected=self.workers_expected, own_folder=self.own_folders,
            local=not isinstance(self.runner, MasterRunner), gate=self.gate,
        )  # fmt: skip
        self.session = session
        self.runs.append(session)
        session.start()
        return session

    def busy(self) -> bool:
        """A run is going (or being stopped): a new Start must wait."""
        return self.session is not None

    def stop_run(self, reason: str) -> None:
        """Locust is stopping the test (Stop, --run-time, quitting): finish the run before it says so."""
        if self.session is not None:
            self.session.stop(reason)

    def close_run(self) -> None:
        """After Locust stopped: the run is finished on disk; build its report when someone can open it."""
        session, self.session = self.session, None
        if session is None:
            return
        if not session.ended:
            session.stop("stop")
        if self.own_folders and not self.quitting:
            session.launch_report()

    def quit(self) -> None:
        self.quitting = True
        self.stop_run("quit")
        for run in self.runs:
            run.end_report()


__all__ = ["OptionError", "SuiteShape"]


# -- how a Locust process ends ------------------------------------------------------------------
# Headless, Ctrl-C, SIGTERM and SIGHUP all end through Locust's Ctrl-C path (the quitting event, where the
# run session finishes the run on disk: cancelled records, partial summary, run.json), and quietly: Python's
# own SIGINT handler would raise inside gevent's hub, which prints the KeyboardInterrupt before passing it
# on. With the web UI, Locust's own SIGTERM handling already finishes the run from its quitting path; the
# handler only notes the signal there, for the exit code (128 + its number, as every tailgate command).


def _interrupt_main() -> None:
    """Raise KeyboardInterrupt in the main greenlet, as gevent does for Ctrl-C: Locust then shuts down
    through its Ctrl-C path (quitting event, stats, exit code)."""
    gevent.get_hub().parent.throw(KeyboardInterrupt())


def _signals_as_interrupt(environment: Any, **_: Any) -> None:
    import signal

    web = getattr(environment, "web_ui", None) is not None

    def handler(sig: int) -> Any:
        def on_signal() -> None:
            shape = environment.shape_class
            if isinstance(shape, SuiteShape) and shape.signum is None:
                shape.signum = sig  # the exit code says which signal ended the process
            if not (web and sig == signal.SIGTERM):  # the web UI's SIGTERM: Locust's own handler shuts down
                _interrupt_main()

        return on_signal

    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        gevent.signal_handler(sig, handler(sig))


events.init.add_listener(_signals_as_interrupt)
