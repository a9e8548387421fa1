"""The search's state as it runs: typed from the first probe to ``slo.json`` and back on a resume.

``slo.json`` is saved after every step, so an interrupted search resumes where it stopped and the report
reads what the terminal printed. The runner keeps the state in these classes; a dict exists only where the
file is written and read (:meth:`SloState.to_dict`, :meth:`SloState.from_meta`) and where the analysis
shared with the report takes a probe as the file holds it (:meth:`ProbeEntry.to_dict`). Keys a later or
earlier version wrote and this one does not declare are kept in ``extra`` and written back unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from tailgate.contracts import known_and_extra, with_extra
from tailgate.runmeta import SloMeta
from tailgate.slo.result import SearchResult
from tailgate.slo.spec import ServerConfig
from tailgate.slo.verdict import Check
from tailgate.stagewarmup import StageWarmup
from tailgate.tailbounds import NOT_ENOUGH


@dataclass(frozen=True)
class AttemptRow:
    """One attempt as ``slo.json`` keeps it: what the report's mechanism and tables read
    (:func:`tailgate.slo.answer.attempt_row`)."""

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
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return with_extra(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AttemptRow:
        known, extra = known_and_extra(cls, data)
        return cls(**known, extra=extra)


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
    extra: dict[str, Any] = field(default_factory=dict)

    def check(self, key: str) -> Check | None:
        return next((c for c in self.checks if c.key == key), None)

    def to_dict(self) -> dict[str, Any]:
        out = with_extra(self)
        out["attempts"] = [a.to_dict() for a in self.attempts]  # the keys keep their places
        out["checks"] = [c.to_json() for c in self.checks]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeEntry:
        known, extra = known_and_extra(cls, data)
        known["attempts"] = [AttemptRow.from_dict(a) for a in known.get("attempts") or []]
        known["checks"] = [Check.from_json(c) for c in known.get("checks") or []]
        return cls(**known, extra=extra)


@dataclass
class ConfigSearch:
    """One server configuration's search: its server, warm-up, probes in the order run, and its answer."""

    name: str
    knobs: dict[str, str] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)
    status: str = "pending"
    """pending, running, done, interrupted or failed."""
    probes: list[ProbeEntry] = field(default_factory=list)
    server: dict[str, Any] | None = None
    stage_warmup: StageWarmup | None = None
    result: SearchResult | None = None
    """Both ends of the bracket, its width, the undecided rates and the models (``result_of`` in answer.py)."""
    error: str | None = None
    """Why a search that did not finish ended (with status interrupted or failed)."""
    extra: dict[str, Any] = field(default_factory=dict)

    OPTIONAL = ("stage_warmup", "result", "error")
    """Written only once set, as the file always had them."""

    @classmethod
    def of(cls, config: ServerConfig) -> ConfigSearch:
        return cls(config.name, dict(config.knobs), list(config.flags))

    def latest(self) -> dict[float, ProbeEntry]:
        """The last probe of each rate: it carries the verdict on every attempt at that rate."""
        return {float(p.rate): p for p in self.probes}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or (f.name in self.OPTIONAL and value is None):
                continue
            if f.name == "probes":
                value = [p.to_dict() for p in self.probes]
            elif f.name in ("stage_warmup", "result"):
                value = value.to_json()
            out[f.name] = value
        return {**out, **self.extra}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConfigSearch:
        known, extra = known_and_extra(cls, data)
        known["probes"] = [ProbeEntry.from_dict(p) for p in known.get("probes") or []]
        if isinstance(known.get("stage_warmup"), dict):
            known["stage_warmup"] = StageWarmup.from_json(known["stage_warmup"])
        if isinstance(known.get("result"), dict):
            known["result"] = SearchResult.from_json(known["result"])
        return cls(**known, extra=extra)


@dataclass
class SloState:
    """``slo.json``: when it was made and run, the plan, and every configuration searched in this folder
    (earlier invocations' configurations stay: one device call per configuration adds up in one file)."""

    created: str | None = None
    started: str | None = None
    ended: str | None = None
    plan: dict[str, Any] | None = None
    configs: list[ConfigSearch] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    """The environment, the server kind and whatever else the command records beside the plan."""

    def config(self, config: ServerConfig) -> ConfigSearch:
        """The configuration's search, added (pending) the first time it is asked for."""
        for c in self.configs:
            if c.name == config.name:
                return c
        found = ConfigSearch.of(config)
        self.configs.append(found)
        return found

    def to_dict(self) -> dict[str, Any]:
        head = {"created": self.created, "started": self.started, "plan": self.plan, **self.extra}
        out = {k: v for k, v in head.items() if v is not None or k in self.extra}
        out["configs"] = [c.to_dict() for c in self.configs]
        if self.ended is not None:
            out["ended"] = self.ended
        return out

    @classmethod
    def from_meta(cls, meta: SloMeta) -> SloState:
        data = meta.to_dict()
        known, extra = known_and_extra(cls, data)
        known["configs"] = [ConfigSearch.from_dict(c) for c in known.get("configs") or [] if isinstance(c, dict)]
        return cls(**known, extra=extra)


__all__ = ["AttemptRow", "ConfigSearch", "ProbeEntry", "SloState"]
