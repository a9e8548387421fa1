"""The server one command measures, from its (re)start to the command's end: one lifecycle for suite and slo.

Both commands restart the server per configuration, warm a fresh engine up before its first measured run,
run one Locust child at a time against it and stop that child on the way out; they differ in what they
measure (a suite cell, an SLO probe) and in the file they keep (``suite.json``, ``slo.json``), never in how
the server is brought up, warmed or left. So that lives here once, and each command hands in only what is
its own: the flags, where a started server and its warm-up are recorded, and how one round of its load runs.

Not :mod:`tailgate.load.session`: that is one run inside the Locust process; this is the command's side.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from tailgate.cell import CellResult, CellSpec, run_cell
from tailgate.jsontypes import JsonObject
from tailgate.records import RequestRecord
from tailgate.resultfiles import RUN_META
from tailgate.runmeta import RunMeta, RunStatus, utc_stamp
from tailgate.runner import ChildRunner, prepare_server
from tailgate.servers.base import ServerController
from tailgate.stagewarmup import (
    STAGE_WARMUP_DIR,
    STAGE_WARMUP_SEED,
    StageWarmup,
    WarmupRound,
    warm_up,
    warmup_line,
    worst_gap_ms,
)

Log = Callable[[str], None]


@dataclass(frozen=True)
class RoundRun:
    """What one warm-up round left: its records (the worst gap is read from them) and how long it took."""

    records: Iterable[RequestRecord]
    seconds: float | None


@dataclass(frozen=True)
class StageLoad:
    """The heaviest load a command will put on a server, and how that command runs one warm-up round of it.

    Each command runs a round its own way (a suite cell; a search probe, with its early stop and a resume that
    reads a round already on disk), but how many rounds, in which folders, with which seeds, when they stop
    and how they are kept is one rule for both."""

    seed: int
    """The plan's seed; round ``k`` runs with ``seed + STAGE_WARMUP_SEED + k``."""
    run: Callable[[int, Path, int], RoundRun]
    """Runs round ``k`` into its folder with its seed."""
    arm: str | None = None
    value: float | None = None
    requests: int | None = None
    rate: float | None = None
    """The load as each round is recorded: the suite's arm, value and requests, or the search's rate."""
    at: str | None = None
    """The load as the console's closing line names it (``8 req/s``), with the rounds and their requests; None:
    the line names no load (the search says it as each round starts)."""


class ServerSession:
    """The server under test and the one Locust child run against it at a time.

    A configuration's server is (re)started the first time a run needs it and warmed up once per start (a
    restarted server is a fresh engine); an interrupt stops the child with its whole process tree, so no
    command ends with load still running at a server it is about to stop."""

    def __init__(
        self,
        controller: ServerController,
        root: Path,
        child: ChildRunner,
        *,
        log: Log = print,
        tag: str,
        tell_kills: bool = False,
    ) -> None:
        self.controller = controller
        self.root = root
        self.child = child
        """The one Locust child at a time: its own session, stopped with its whole process tree."""
        self.log = log
        self.tag = tag
        """What the command's own console lines start with (``[suite] ``, ``[slo] ``)."""
        self.tell_kills = tell_kills
        """Whether an interrupt says on the console when a child had to be killed (the suite does; the search
        does not)."""
        self.config: str | None = None
        """The configuration the server now runs (None: not started by this command yet)."""
        self._in_progress: Path | None = None
        """The folder of the run whose ``run.json`` an interrupt rewrites; kept when a run ends by an exception,
        which is how an interrupt finds it."""

    def ensure(
        self,
        config: str,
        flags: Sequence[str],
        *,
        declared: Sequence[str] | None,
        record: Callable[[JsonObject], None],
        warmup: Callable[[], StageLoad | None],
        record_warmup: Callable[[StageWarmup], None],
    ) -> bool:
        """Have the server run ``config``: restart it unless it already does, record what is true of it, and
        warm the fresh engine up; whether it was (re)started.

        ``record`` is called before the warm-up, so a command stopped during the warm-up has its server on file;
        ``warmup`` is only asked when the server started (None: no warm-up); ``record_warmup`` keeps the
        finished warm-up in the command's own file."""
        if self.config == config:
            return False
        entry = prepare_server(self.controller, config, flags, declared=declared, log=self.log, tag=self.tag)
        self.config = config
        record(entry)
        load = warmup()
        if load is not None:
            record_warmup(self._warm_up(config, load))
        return True

    def _warm_up(self, config: str, load: StageLoad) -> StageWarmup:
        """Rounds at the heaviest load the command will put on the server until a round's worst gap is no
        longer well below the round before's: a fresh engine's first-time pauses (kernel compilation, graph
        capture, allocator growth at a new batch size) then fall here, not in the first measured run's tail.
        Kept under ``stage-warmup/``, never a cell."""

        def one_round(k: int) -> WarmupRound:
            out = self.root / STAGE_WARMUP_DIR / f"{config}_w{k}"
            ran = load.run(k, out, load.seed + STAGE_WARMUP_SEED + k)
            return WarmupRound(
                k, f"{STAGE_WARMUP_DIR}/{out.name}", round(worst_gap_ms(ran.records), 1), ran.seconds,
                arm=load.arm, value=load.value, requests=load.requests, rate=load.rate,
            )  # fmt: skip

        warm = warm_up(one_round)
        tally = f" ({len(warm.rounds)} x {load.requests} requests at {load.at})" if load.at is not None else ""
        self.log(f"{self.tag}{config}: {warmup_line(warm)}{tally}")
        return warm

    def run(
        self,
        spec: CellSpec,
        *,
        on_line: Callable[[str], None] | None = None,
        watch: Callable[[], str | None] | None = None,
        on_start: Callable[[int], None] | None = None,
        kept: bool = False,
    ) -> CellResult:
        """Run one cell against the server through the session's child, the one an interrupt stops.

        ``kept``: an interrupt during this run rewrites its ``run.json`` to say how it ended: a suite cell is
        kept as a result, where a warm-up round is removed and a probe attempt set aside when run again."""
        self._in_progress = spec.folder if kept else None
        done = run_cell(spec, self.child, on_line=on_line, watch=watch, on_start=on_start)
        self._in_progress = None
        return done

    def interrupt(self, why: str = "interrupted") -> None:
        """Stop the Locust child and all its processes; a run kept as a result says in its run.json how it ended.

        SIGINT first: Locust writes the requests in flight as ``cancelled`` records. A run.json
        Locust had no time to finish still says ``running``; it is rewritten to ``interrupted`` so
        no folder claims a run that is still going.
        """
        if self.child.child is None:
            return
        killed = self.child.stop(grace_s=20.0)
        if killed and self.tell_kills:
            self.log(f"{self.tag}Locust did not stop on SIGINT; killed {len(killed)} process(es)")
        if self._in_progress is not None:
            mark_run_ended(self._in_progress / RUN_META, why)


ConfigT = TypeVar("ConfigT")


class ConfigRunner(ABC, Generic[ConfigT]):
    """A command that measures cells against one server per configuration: what ``suite`` and ``slo`` share.

    The server session (restart per configuration, warm-up, the one Locust child, interrupt) and the exit
    codes of the runs it made are here; a command adds its configurations' flags, the file it keeps (where a
    started server and its warm-up are recorded), its warm-up load and the policy that picks its cells."""

    tag = ""
    """What the command's console lines start with (``[suite] ``)."""

    def __init__(
        self,
        controller: ServerController,
        root: Path,
        child: ChildRunner,
        *,
        prometheus_url: str | None,
        log: Log,
        extra_metadata: JsonObject | None,
        tell_kills: bool = False,
    ) -> None:
        self.controller = controller
        self.root = root
        self.prometheus_url = prometheus_url
        self.log = log
        self.extra_metadata = dict(extra_metadata or {})
        """Facts about the host and the server kind that the command's file carries."""
        self.server = ServerSession(controller, root, child, log=log, tag=self.tag, tell_kills=tell_kills)
        self.exit_codes: list[int] = []
        """Each run's Locust exit code this invocation made: the command's own exit code combines them."""

    @abstractmethod
    def config_name(self, config: ConfigT) -> str: ...

    @abstractmethod
    def server_flags(self, config: ConfigT) -> tuple[list[str], list[str] | None]:
        """The server's flags for ``config``, and the flags it is declared to run with (None: not declared)."""

    @abstractmethod
    def record_server(self, config: ConfigT, entry: JsonObject) -> None:
        """Keep what is true of a (re)started server in the command's file."""

    @abstractmethod
    def record_warmup(self, config: ConfigT, warm: StageWarmup) -> None:
        """Keep a finished warm-up in the command's file."""

    @abstractmethod
    def stage_load(self, config: ConfigT) -> StageLoad | None:
        """The warm-up load of a (re)started server (None: no warm-up)."""

    def serve(self, config: ConfigT) -> bool:
        """The configuration's server up and warmed, restarted only when the command moves to another one;
        whether it was (re)started."""
        flags, declared = self.server_flags(config)
        return self.server.ensure(
            self.config_name(config), flags, declared=declared, record=lambda entry: self.record_server(config, entry),
            warmup=lambda: self.stage_load(config), record_warmup=lambda warm: self.record_warmup(config, warm),
        )  # fmt: skip

    def interrupt(self, why: str = "interrupted") -> None:
        """Stop the Locust child and every process it started (in-flight requests are written as cancelled); a
        run kept as a result says in its run.json how it ended."""
        self.server.interrupt(why)


def mark_run_ended(path: Path, why: str, status: RunStatus = RunStatus.INTERRUPTED) -> None:
    """Rewrite a run.json left at ``running`` (its Locust was stopped before it could) to ``status``."""
    meta = RunMeta.read_or_none(path)
    if meta is not None:
        end_run_meta(meta, path, why, status)


def end_run_meta(meta: RunMeta, path: Path, why: str, status: RunStatus) -> None:
    """:func:`mark_run_ended` for a run.json already read (a cell's result carries it)."""
    if meta.state is not RunStatus.RUNNING:
        return
    meta.with_(status=status.text(), ended=meta.ended or utc_stamp(), ended_by=why).write(path)


__all__ = ["ConfigRunner", "RoundRun", "ServerSession", "StageLoad", "end_run_meta", "mark_run_ended"]
