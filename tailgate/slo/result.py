"""A configuration's answer as the search leaves it: ``slo.json``'s ``result``, typed from creation to the file
and back (a resumed search, the report and the benchmarks read the same object).

The fitted models' own answers (``model``, ``fitted``) stay JSON objects here: they are model estimates with
their own writers (:class:`tailgate.slo.model.RateModel`, :class:`tailgate.slo.replay.ModelAnswer`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tailgate.contracts import known_and_extra, with_extra
from tailgate.slo.verdict import Check


@dataclass
class Undecided:
    """A rate inside the bracket whose probes could not decide, with why and what more data would take."""

    rate: float
    reason: str | None = None
    n_effective: float | None = None
    n: int | None = None
    more_data_factor: float | None = None
    """How many times its data an anytime-valid bound would need to decide it (None: more than the cap)."""
    more_seconds_estimate: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return with_extra(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Undecided:
        known, extra = known_and_extra(cls, data)
        return cls(**known, extra=extra)


@dataclass
class NotRun:
    """A probe attempt that could not run, tried twice: the search went on without that rate."""

    rate: float
    phase: str | None = None
    attempt: int | None = None
    why: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return with_extra(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NotRun:
        known, extra = known_and_extra(cls, data)
        return cls(**known, extra=extra)


@dataclass
class SearchResult:
    """Both ends of the measured bracket, its width and status, the limit that binds, the undecided rates, and
    the models beside them (labelled model estimates wherever they are shown)."""

    best_rate: float | None
    """Highest rate that passed (None: none did)."""
    first_fail_rate: float | None
    """Lowest rate above it that failed (None: the bracket is open above)."""
    status: str
    width: float | None = None
    width_relative: float | None = None
    resolution: str | None = None
    binding: str | None = None
    at_best: dict[str, Check] | None = None
    """Every limit's check at the lower end."""
    p99_at_best: dict[str, float | None] | None = None
    verdicts: dict[float, str] = field(default_factory=dict)
    pooled_decided: list[float] = field(default_factory=list)
    """Rates whose verdict came from the evidence pooled across rates, not their own data."""
    undecided: list[Undecided] = field(default_factory=list)
    probes: int = 0
    attempts: int = 0
    not_run: list[NotRun] = field(default_factory=list)
    model: dict[str, Any] | None = None
    fitted: dict[str, Any] | None = None
    busy_attempts: int = 0
    """Attempts during which the machine's other processes took CPU from a server on it (:mod:`.busy`)."""
    others_busy_cores_max: float | None = None
    """The most CPU, in cores, the machine's other processes took during any attempt (None: not measured)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def not_enough_data_rates(self) -> list[float]:
        return [u.rate for u in self.undecided]

    @property
    def met(self) -> bool:
        """Some rate was shown to meet the SLO."""
        return self.best_rate is not None

    def to_json(self) -> dict[str, Any]:
        """``slo.json``'s object, key for key as the file has always had it."""
        out: dict[str, Any] = {
            "best_rate": self.best_rate, "first_fail_rate": self.first_fail_rate, "status": self.status,
            "width": self.width, "width_relative": self.width_relative, "resolution": self.resolution,
            "binding": self.binding,
            "at_best": None if self.at_best is None else {k: c.to_json() for k, c in self.at_best.items()},
            "p99_at_best": self.p99_at_best,
            "verdicts": {f"{r:g}": v for r, v in sorted(self.verdicts.items())},
            "pooled_decided": list(self.pooled_decided), "not_enough_data_rates": self.not_enough_data_rates,
            "undecided": [u.to_json() for u in self.undecided], "probes": self.probes, "attempts": self.attempts,
            "not_run": [n.to_json() for n in self.not_run], "model": self.model, "fitted": self.fitted,
            "busy_attempts": self.busy_attempts, "others_busy_cores_max": self.others_busy_cores_max,
        }  # fmt: skip
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SearchResult:
        known, extra = known_and_extra(cls, data)
        extra.pop("not_enough_data_rates", None)  # derived from the undecided rates
        at_best = known.get("at_best")
        known.update(
            best_rate=known.get("best_rate"), first_fail_rate=known.get("first_fail_rate"),
            status=str(known.get("status")),
            at_best=None if at_best is None else {k: Check.from_json(c) for k, c in at_best.items()},
            verdicts={float(r): str(v) for r, v in (known.get("verdicts") or {}).items()},
            undecided=[Undecided.from_json(u) for u in known.get("undecided") or []],
            not_run=[NotRun.from_json(n) for n in known.get("not_run") or []],
        )  # fmt: skip
        return cls(**known, extra=extra)


__all__ = ["NotRun", "SearchResult", "Undecided"]
