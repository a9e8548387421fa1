"""The search's state as it runs: typed from the first probe to ``slo.json`` and back on a resume.

``slo.json`` is saved after every step, so an interrupted search resumes where it stopped and the report
reads what the terminal printed. The runner keeps the state in these classes; a dict exists only where the
file is written and read (:meth:`SloState.to_dict`, :meth:`SloState.from_meta`) and where the analysis
shared with the report takes a probe as the file holds it (:meth:`ProbeEntry.to_dict`). Keys a later or
earlier version wrote and this one does not declare are kept in ``extra`` and written back unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from tailgate.jsontypes import (
    JsonMapping,
    JsonObject,
    json_extra,
    json_int,
    json_list,
    json_number,
    json_object,
    json_objects,
    json_opt_number,
    json_opt_object,
    json_opt_str,
    json_str,
    json_strs,
)
from tailgate.runmeta import SloMeta
from tailgate.slo.result import NotRun, SearchResult
from tailgate.slo.spec import SLO_FILE, ServerConfig
from tailgate.slo.verdict import Check
from tailgate.stagewarmup import StageWarmup
from tailgate.tailbounds import NOT_ENOUGH


@dataclass(frozen=True)
class AttemptRow:
    """One attempt as ``slo.json`` keeps it: what the report's mechanism and tables read
    (:func:`tailgate.slo.answer.attempt_row`). Its figures are read back as the file wrote them (an integer
    stays one), so a resume writes the rows it did not touch back unchanged."""

    dir: str
    seed: int
    seconds: float | None = None
    stopped_early: str | None = None
    waiting_max: float | None = None
    sent: int = 0
    cancelled: int = 0
    errors: int = 0
    n_measured: int = 0
    achieved_rate: float | None = None
    ttft_p99_from_send: float | None = None
    preemptions_delta: float | None = None
    schedule_lag_p99: float | None = None
    waiting_samples: int = 0
    waiting_share: float | None = None
    client_coalesced: int = 0
    queue_slope_per_s: float | None = None
    others_busy_cores: float | None = None
    """CPU other processes of the machine took during the attempt (None: not measured)."""
    extra: JsonObject = field(default_factory=dict, compare=False)

    KEYS: ClassVar[frozenset[str]] = frozenset((
        "dir", "seed", "seconds", "stopped_early", "waiting_max", "sent", "cancelled", "errors", "n_measured",
        "achieved_rate", "ttft_p99_from_send", "preemptions_delta", "schedule_lag_p99", "waiting_samples",
        "waiting_share", "client_coalesced", "queue_slope_per_s", "others_busy_cores",
    ))  # fmt: skip

    def to_dict(self) -> JsonObject:
        return {
            "dir": self.dir, "seed": self.seed, "seconds": self.seconds, "stopped_early": self.stopped_early,
            "waiting_max": self.waiting_max, "sent": self.sent, "cancelled": self.cancelled, "errors": self.errors,
            "n_measured": self.n_measured, "achieved_rate": self.achieved_rate,
            "ttft_p99_from_send": self.ttft_p99_from_send, "preemptions_delta": self.preemptions_delta,
            "schedule_lag_p99": self.schedule_lag_p99, "waiting_samples": self.waiting_samples,
            "waiting_share": self.waiting_share, "client_coalesced": self.client_coalesced,
            "queue_slope_per_s": self.queue_slope_per_s, "others_busy_cores": self.others_busy_cores,
            **self.extra,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: JsonMapping, *, where: str = "") -> AttemptRow:
        def count(key: str) -> int:
            return json_int(data, key, 0, where=where)

        def figure(key: str) -> float | None:
            return json_opt_number(data, key, where=where)

        return cls(
            dir=json_str(data, "dir", where=where), seed=json_int(data, "seed", where=where),
            seconds=figure("seconds"), stopped_early=json_opt_str(data, "stopped_early", where=where),
            waiting_max=figure("waiting_max"), sent=count("sent"), cancelled=count("cancelled"),
            errors=count("errors"), n_measured=count("n_measured"), achieved_rate=figure("achieved_rate"),
            ttft_p99_from_send=figure("ttft_p99_from_send"), preemptions_delta=figure("preemptions_delta"),
            schedule_lag_p99=figure("schedule_lag_p99"), waiting_samples=count("waiting_samples"),
            waiting_share=figure("waiting_share"), client_coalesced=count("client_coalesced"),
            queue_slope_per_s=figure("queue_slope_per_s"), others_busy_cores=figure("others_busy_cores"),
            extra=json_extra(data, cls.KEYS),
        )  # fmt: skip


@dataclass
class ProbeEntry:
    """One call of a probe at one rate: its attempts, and the verdict on all attempts at that rate so far."""

    index: int
    rate: float
    phase: str
    attempts: list[AttemptRow] = field(default_factory=list)
    """One row per attempt run in this call."""
    verdict: str = NOT_ENOUGH
    checks: list[Check] = field(default_factory=list)
    """Each limit's check on the attempts at this rate so far."""
    pooled_attempts: int = 0
    binding: str | None = None
    p99: dict[str, float | None] = field(default_factory=dict)
    undecided_reason: str | None = None
    extra: JsonObject = field(default_factory=dict)

    KEYS: ClassVar[frozenset[str]] = frozenset(
        ("index", "rate", "phase", "attempts", "verdict", "checks", "pooled_attempts", "binding", "p99",
         "undecided_reason")
    )  # fmt: skip

    def check(self, key: str) -> Check | None:
        return next((c for c in self.checks if c.key == key), None)

    def to_dict(self) -> JsonObject:
        return {
            "index": self.index, "rate": self.rate, "phase": self.phase,
            "attempts": [a.to_dict() for a in self.attempts], "verdict": self.verdict,
            "checks": [c.to_json() for c in self.checks], "pooled_attempts": self.pooled_attempts,
            "binding": self.binding, "p99": self.p99, "undecided_reason": self.undecided_reason, **self.extra,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: JsonMapping, *, where: str = "") -> ProbeEntry:
        p99 = json_object(data, "p99", {}, where=where)
        return cls(
            index=json_int(data, "index", where=where), rate=json_number(data, "rate", where=where),
            phase=json_str(data, "phase", where=where),
            attempts=[AttemptRow.from_dict(a, where=f"{where} attempts[{i}]".strip())
                      for i, a in enumerate(json_objects(data, "attempts", where=where))],
            verdict=json_str(data, "verdict", NOT_ENOUGH, where=where),
            checks=[Check.from_json(c, where=f"{where} checks[{i}]".strip())
                    for i, c in enumerate(json_objects(data, "checks", where=where))],
            pooled_attempts=json_int(data, "pooled_attempts", 0, where=where),
            binding=json_opt_str(data, "binding", where=where),
            p99={k: json_opt_number(p99, k, where=f"{where} p99".strip()) for k in p99},
            undecided_reason=json_opt_str(data, "undecided_reason", where=where),
            extra=json_extra(data, cls.KEYS),
        )  # fmt: skip


@dataclass
class ConfigSearch:
    """One server configuration's search: its server, warm-up, probes in the order run, and its answer."""

    name: str
    knobs: dict[str, str] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)
    status: str = "pending"
    """pending, running, done, interrupted or failed."""
    probes: list[ProbeEntry] = field(default_factory=list)
    server: JsonObject | None = None
    """What is true of the started server, as the server session recorded it (:meth:`SloRunner.record_server`)."""
    stage_warmup: StageWarmup | None = None
    result: SearchResult | None = None
    """Both ends of the bracket, its width, the undecided rates and the models (``result_of`` in answer.py)."""
    error: str | None = None
    """Why a search that did not finish ended (with status interrupted or failed)."""
    not_run: list[NotRun] = field(default_factory=list)
    """Probe attempts that could not run (tried twice), carried into the answer; written after the other keys,
    and only once there is one, as the file always had them."""
    extra: JsonObject = field(default_factory=dict)

    KEYS: ClassVar[frozenset[str]] = frozenset(
        ("name", "knobs", "flags", "status", "probes", "server", "stage_warmup", "result", "error", "not_run")
    )

    @classmethod
    def of(cls, config: ServerConfig) -> ConfigSearch:
        return cls(config.name, dict(config.knobs), list(config.flags))

    def latest(self) -> dict[float, ProbeEntry]:
        """The last probe of each rate: it carries the verdict on every attempt at that rate."""
        return {float(p.rate): p for p in self.probes}

    def to_dict(self) -> JsonObject:
        out: JsonObject = {
            "name": self.name, "knobs": self.knobs, "flags": self.flags, "status": self.status,
            "probes": [p.to_dict() for p in self.probes], "server": self.server,
        }  # fmt: skip
        if self.stage_warmup is not None:  # stage_warmup, result and error: written only once set
            out["stage_warmup"] = self.stage_warmup.to_json()
        if self.result is not None:
            out["result"] = self.result.to_json()
        if self.error is not None:
            out["error"] = self.error
        out.update(self.extra)
        if self.not_run:
            out["not_run"] = [n.to_json() for n in self.not_run]
        return out

    @classmethod
    def from_dict(cls, data: JsonMapping, *, where: str = "") -> ConfigSearch:
        knobs = json_object(data, "knobs", {}, where=where)
        warmup = json_opt_object(data, "stage_warmup", where=where)
        result = json_opt_object(data, "result", where=where)
        server = json_opt_object(data, "server", where=where)
        return cls(
            name=json_str(data, "name", where=where),
            knobs={k: json_str(knobs, k, where=f"{where} knobs".strip()) for k in knobs},
            flags=json_strs(data, "flags", where=where), status=json_str(data, "status", "pending", where=where),
            probes=[ProbeEntry.from_dict(p, where=f"{where} probes[{i}]".strip())
                    for i, p in enumerate(json_objects(data, "probes", where=where))],
            server=None if server is None else json_extra(server, frozenset()),
            stage_warmup=None if warmup is None else StageWarmup.from_json(warmup),
            result=None if result is None else SearchResult.from_json(result, where=f"{where} result".strip()),
            error=json_opt_str(data, "error", where=where),
            not_run=[NotRun.from_json(n, where=f"{where} not_run[{i}]".strip())
                     for i, n in enumerate(json_objects(data, "not_run", where=where))],
            extra=json_extra(data, cls.KEYS),
        )  # fmt: skip


@dataclass
class SloState:
    """``slo.json``: when it was made and run, the plan, and every configuration searched in this folder
    (earlier invocations' configurations stay: one device call per configuration adds up in one file)."""

    created: str | None = None
    started: str | None = None
    ended: str | None = None
    plan: JsonObject | None = None
    """The plan as :meth:`tailgate.slo.plan.SloPlan.describe` wrote it (a resume compares it key by key)."""
    configs: list[ConfigSearch] = field(default_factory=list)
    extra: JsonObject = field(default_factory=dict)
    """The environment, the server kind and whatever else the command records beside the plan."""

    KEYS: ClassVar[frozenset[str]] = frozenset(("created", "started", "ended", "plan", "configs"))

    def config(self, config: ServerConfig) -> ConfigSearch:
        """The configuration's search, added (pending) the first time it is asked for."""
        for c in self.configs:
            if c.name == config.name:
                return c
        found = ConfigSearch.of(config)
        self.configs.append(found)
        return found

    def to_dict(self) -> JsonObject:
        head: JsonObject = {"created": self.created, "started": self.started, "plan": self.plan, **self.extra}
        out = {k: v for k, v in head.items() if v is not None or k in self.extra}
        out["configs"] = [c.to_dict() for c in self.configs]
        if self.ended is not None:
            out["ended"] = self.ended
        return out

    @classmethod
    def from_meta(cls, meta: SloMeta, *, where: str = SLO_FILE) -> SloState:
        """The state a resumed search goes on from; a damaged configuration raises one
        :class:`~tailgate.jsontypes.JsonShapeError` line naming the file, the place and the key."""
        data = meta.to_dict()
        plan = json_opt_object(data, "plan", where=where)
        configs = json_list(data, "configs", (), where=where)
        return cls(
            created=json_opt_str(data, "created", where=where), started=json_opt_str(data, "started", where=where),
            ended=json_opt_str(data, "ended", where=where),
            plan=None if plan is None else json_extra(plan, frozenset()),
            configs=[ConfigSearch.from_dict(c, where=f"{where} configs[{i}]")
                     for i, c in enumerate(configs) if isinstance(c, Mapping)],  # another kind of entry: dropped
            extra=json_extra(data, cls.KEYS),
        )  # fmt: skip


__all__ = ["AttemptRow", "ConfigSearch", "ProbeEntry", "SloState"]
