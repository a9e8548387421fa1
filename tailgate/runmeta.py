"""The run's, the suite's and the SLO search's own files, as contracts: ``run.json``, ``suite.json``, ``slo.json``.

What each says of how its run stands (:class:`RunStatus`) is asked, not matched as text; like every contract
(:mod:`tailgate.contracts`), a damaged or wrong-typed file is one line naming the file and the key.
Standard library only: the load path (gevent) and the analysis (pandas) both import it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

from tailgate.contracts import Contract


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
    trace: dict[str, Any] | None = None
    stages_planned: list[str] | None = None
    ignore_eos: bool | None = None
    options: dict[str, Any] | None = None
    load_processes: int | None = None
    versions: dict[str, Any] | None = None
    load_host: str | None = None
    pid: int | None = None
    server: dict[str, Any] | None = None
    stages: list[Any] | None = None
    workers: dict[str, Any] | None = None

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
    servers: dict[str, Any] = field(default_factory=dict)
    started: str | None = None
    ended: str | None = None
    plan: dict[str, Any] | None = None
    prometheus_url: str | None = None
    environment: dict[str, Any] | None = None
    server_kind: str | None = None
    embedded: bool | None = None
    host: str | None = None
    cells: list[Any] | None = None
    knee: str | None = None
    stage_warmup: dict[str, Any] | None = None
    """Per server configuration: the stage warm-up's rounds of its latest start and whether it settled."""


@dataclass(frozen=True)
class SloMeta(Contract):
    """``slo.json``: the SLO search's plan and every configuration's probes and verdicts."""

    KIND: ClassVar[str] = "slo metadata"

    created: str | None = None
    started: str | None = None
    ended: str | None = None
    plan: dict[str, Any] | None = None
    environment: dict[str, Any] | None = None
    server_kind: str | None = None
    embedded: bool | None = None
    configs: list[Any] = field(default_factory=list)
