"""The run's, the suite's and the SLO search's own files, as contracts: ``run.json``, ``suite.json``, ``slo.json``.

What each says of how its run stands (:class:`RunStatus`) is asked, not matched as text; like every contract
(:mod:`tailgate.contracts`), a damaged or wrong-typed file is one line naming the file and the key.
Standard library only: the load path (gevent) and the analysis (pandas) both import it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import ClassVar

from tailgate.contracts import Contract
from tailgate.jsontypes import JsonMapping


class RunStatus(Enum):
    """How a run stands, as ``run.json``'s ``status`` says it: a word, and for a run that stopped itself the
    stage or the reason after it (``stopped after cont_r4: 12 errors``, ``stopped: stage deadline ...``).

    Readers ask the status what it means (:attr:`summarized`) instead of matching its text.
    """

    RUNNING = "running"
    COMPLETED = "completed"
    STOPPED = "stopped"
    """Stopped from outside (the web UI's Stop, the end of ``--run-time``): the stage in progress as partial."""
    STOPPED_AFTER = "stopped after "
    """The run stopped itself at a stage's end (``--stop-on-errors``, a lost load process)."""
    STOPPED_IN_STAGE = "stopped: "
    """The run gave up inside a stage (its deadline, every load process lost): that stage has no summary."""
    INTERRUPTED = "interrupted"
    FAILED = "failed"

    def text(self, detail: str = "") -> str:
        """The status as written: the word, then what the two self-stopped kinds carry after it."""
        return self.value + detail if self in _WITH_DETAIL else self.value

    @property
    def summarized(self) -> bool:
        """Every stage that ran has its summary (a stopped run's last one as partial)."""
        return self in (RunStatus.COMPLETED, RunStatus.STOPPED, RunStatus.STOPPED_AFTER)

    @classmethod
    def of(cls, text: object) -> RunStatus | None:
        """The status a written one is; None for none, or one this version does not know."""
        if not isinstance(text, str):
            return None
        for status in cls:
            if text == status.value or (status in _WITH_DETAIL and text.startswith(status.value)):
                return status
        return None


_WITH_DETAIL = frozenset({RunStatus.STOPPED_AFTER, RunStatus.STOPPED_IN_STAGE})


def utc_stamp(t: float | None = None) -> str:
    """A moment (now by default) as every results file stamps it: UTC to the second, so stamps compare as text."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


@dataclass(frozen=True)
class RunTrace(Contract):
    """``run.json``'s ``trace``: the seeded trace the run drew its requests from, and its mix of sizes."""

    KIND: ClassVar[str] = "run trace"

    seed: int | None = None
    warmup: int | None = None
    n: int | None = None
    source: str | None = None
    mix: dict[str, int] | None = None
    """Requests per size class (``prompt/max``), the warm-up left out."""
    mix_with_warmup: dict[str, int] | None = None


@dataclass(frozen=True)
class RunVersions(Contract):
    """``run.json``'s ``versions``: what generated the load."""

    KIND: ClassVar[str] = "run versions"

    tailgate: str | None = None
    locust: str | None = None
    python: str | None = None


@dataclass(frozen=True)
class ServerInfo(Contract):
    """``run.json``'s ``server``: what the server said of itself as the run started (None: it did not say)."""

    KIND: ClassVar[str] = "server info"

    version: str | None = None
    models: list[str | None] | None = None


@dataclass(frozen=True)
class GpuFacts(Contract):
    """The machine's GPUs as ``nvidia-smi`` names them: ``name``, ``driver`` and ``memory``, all text."""

    KIND: ClassVar[str] = "gpu facts"

    gpus: list[dict[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class HostFacts(Contract):
    """``environment`` of ``suite.json`` and ``slo.json``: the machine and the versions that ran the command."""

    KIND: ClassVar[str] = "environment"

    host: str | None = None
    python: str | None = None
    locust: str | None = None
    tailgate: str | None = None
    cpus: int | None = None
    gpu: GpuFacts | None = None
    argv: list[str] | None = None
    """The command line, secrets redacted."""


@dataclass(frozen=True)
class RunMeta(Contract):
    """``run.json``: one run's identity, options, trace, server and how it ended (``status``)."""

    KIND: ClassVar[str] = "run metadata"

    run_id: str | None = None
    arm: str | None = None
    config: str | None = None
    host: str | None = None
    model: str | None = None
    prometheus_url: str | None = None
    metrics_url: str | None = None
    started: str | None = None
    ended: str | None = None
    status: str | None = None
    stop_reason: str | None = None
    trace: RunTrace | None = None
    stages_planned: list[str] | None = None
    ignore_eos: bool | None = None
    options: JsonMapping | None = None
    """Every option as the run used it, by name: the option table decides the keys, readers take the few they
    need through the ``json_*`` readers."""
    load_processes: int | None = None
    versions: RunVersions | None = None
    load_host: str | None = None
    pid: int | None = None
    server: ServerInfo | None = None
    stages: list[str] | None = None
    """The stages that ended, by label."""
    workers: dict[str, JsonMapping] | None = None
    """Every load process that took a stage, by node id (``tailgate.load.roster``)."""

    @property
    def state(self) -> RunStatus | None:
        return RunStatus.of(self.status)

    @property
    def completed(self) -> bool:
        return self.state is RunStatus.COMPLETED


@dataclass(frozen=True)
class SuiteMeta(Contract):
    """``suite.json``: the plan, every server configuration as described after its restart, and the cells."""

    KIND: ClassVar[str] = "suite metadata"

    created: str | None = None
    servers: dict[str, JsonMapping] = field(default_factory=dict)
    """Per server configuration, what was true of it after its latest start: its flags and whatever its
    controller describes (keys of each server kind's own)."""
    started: str | None = None
    ended: str | None = None
    plan: JsonMapping | None = None
    """The suite's plan as it ran (``tailgate.suite.SuitePlan``'s fields)."""
    prometheus_url: str | None = None
    environment: HostFacts | None = None
    server_kind: str | None = None
    embedded: bool | None = None
    host: str | None = None
    cells: list[str] | None = None
    knee: str | None = None
    stage_warmup: dict[str, JsonMapping] | None = None
    """Per server configuration: the stage warm-up's rounds of its latest start and whether it settled."""


@dataclass(frozen=True)
class SloMeta(Contract):
    """``slo.json``: the SLO search's plan and every configuration's probes and verdicts."""

    KIND: ClassVar[str] = "slo metadata"

    created: str | None = None
    started: str | None = None
    ended: str | None = None
    plan: JsonMapping | None = None
    """The search's plan as it ran (``tailgate.slo``'s own description)."""
    environment: HostFacts | None = None
    server_kind: str | None = None
    embedded: bool | None = None
    configs: list[JsonMapping] = field(default_factory=list)
    """Every configuration searched, as :class:`tailgate.slo.state.ConfigSearch` reads it."""
