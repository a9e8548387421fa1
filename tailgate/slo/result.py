"""A configuration's answer as the search leaves it: ``slo.json``'s ``result``, typed from creation to the file
and back (a resumed search, the report and the benchmarks read the same object).

The fitted models' own answers (``model``, ``fitted``) stay JSON objects here: they are model estimates with
their own writers (:class:`tailgate.slo.model.RateModel`, :class:`tailgate.slo.replay.ModelAnswer`), carried
to the file and back as written; a reader takes what it shows through the ``json_*`` readers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from tailgate.jsontypes import (
    JsonMapping,
    JsonObject,
    JsonShapeError,
    json_extra,
    json_floats,
    json_int,
    json_number,
    json_object,
    json_objects,
    json_opt_int,
    json_opt_number,
    json_opt_object,
    json_opt_str,
    json_str,
)
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
    extra: JsonObject = field(default_factory=dict)

    KEYS: ClassVar[frozenset[str]] = frozenset(
        ("rate", "reason", "n_effective", "n", "more_data_factor", "more_seconds_estimate")
    )

    def to_json(self) -> JsonObject:
        return {
            "rate": self.rate, "reason": self.reason, "n_effective": self.n_effective, "n": self.n,
            "more_data_factor": self.more_data_factor, "more_seconds_estimate": self.more_seconds_estimate,
            **self.extra,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: JsonMapping, *, where: str = "") -> Undecided:
        return cls(
            rate=json_number(data, "rate", where=where), reason=json_opt_str(data, "reason", where=where),
            n_effective=json_opt_number(data, "n_effective", where=where), n=json_opt_int(data, "n", where=where),
            more_data_factor=json_opt_number(data, "more_data_factor", where=where),
            more_seconds_estimate=json_opt_number(data, "more_seconds_estimate", where=where),
            extra=json_extra(data, cls.KEYS),
        )  # fmt: skip


@dataclass
class NotRun:
    """A probe attempt that could not run, tried twice: the search went on without that rate."""

    rate: float
    phase: str | None = None
    attempt: int | None = None
    why: str | None = None
    extra: JsonObject = field(default_factory=dict)

    KEYS: ClassVar[frozenset[str]] = frozenset(("rate", "phase", "attempt", "why"))

    def to_json(self) -> JsonObject:
        return {"rate": self.rate, "phase": self.phase, "attempt": self.attempt, "why": self.why, **self.extra}

    @classmethod
    def from_json(cls, data: JsonMapping, *, where: str = "") -> NotRun:
        return cls(
            rate=json_number(data, "rate", where=where), phase=json_opt_str(data, "phase", where=where),
            attempt=json_opt_int(data, "attempt", where=where), why=json_opt_str(data, "why", where=where),
            extra=json_extra(data, cls.KEYS),
        )  # fmt: skip


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
    model: JsonObject | None = None
    """The rate model's answer as :meth:`tailgate.slo.model.RateModel.as_dict` wrote it."""
    fitted: JsonObject | None = None
    """The fitted step loop's answer as :meth:`tailgate.slo.replay.ModelAnswer.as_dict` wrote it."""
    busy_attempts: int = 0
    """Attempts during which the machine's other processes took CPU from a server on it (:mod:`.busy`)."""
    others_busy_cores_max: float | None = None
    """The most CPU, in cores, the machine's other processes took during any attempt (None: not measured)."""
    extra: JsonObject = field(default_factory=dict)

    KEYS: ClassVar[frozenset[str]] = frozenset((
        "best_rate", "first_fail_rate", "status", "width", "width_relative", "resolution", "binding", "at_best",
        "p99_at_best", "verdicts", "pooled_decided", "not_enough_data_rates", "undecided", "probes", "attempts",
        "not_run", "model", "fitted", "busy_attempts", "others_busy_cores_max",
    ))  # fmt: skip
    """``not_enough_data_rates`` is written, never read back: the undecided rates give it."""

    @property
    def not_enough_data_rates(self) -> list[float]:
        return [u.rate for u in self.undecided]

    @property
    def met(self) -> bool:
        """Some rate was shown to meet the SLO."""
        return self.best_rate is not None

    def to_json(self) -> JsonObject:
        """``slo.json``'s object, key for key as the file has always had it."""
        out: JsonObject = {
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
    def from_json(cls, data: JsonMapping, *, where: str = "") -> SearchResult:
        at_best = json_opt_object(data, "at_best", where=where)
        p99 = json_opt_object(data, "p99_at_best", where=where)
        model, fitted = json_opt_object(data, "model", where=where), json_opt_object(data, "fitted", where=where)
        inner = f"{where} at_best".strip()
        return cls(
            best_rate=json_opt_number(data, "best_rate", where=where),
            first_fail_rate=json_opt_number(data, "first_fail_rate", where=where),
            status=str(json_opt_str(data, "status", where=where)),  # absent: "None", as every version read it
            width=json_opt_number(data, "width", where=where),
            width_relative=json_opt_number(data, "width_relative", where=where),
            resolution=json_opt_str(data, "resolution", where=where),
            binding=json_opt_str(data, "binding", where=where),
            at_best=None if at_best is None else {
                k: Check.from_json(json_object(at_best, k, where=inner), where=f"{inner} {k}") for k in at_best
            },
            p99_at_best=None if p99 is None else {
                k: json_opt_number(p99, k, where=f"{where} p99_at_best".strip()) for k in p99
            },
            verdicts=_verdicts(json_opt_object(data, "verdicts", where=where) or {}, where),
            pooled_decided=json_floats(data, "pooled_decided", where=where),
            undecided=[Undecided.from_json(u, where=where) for u in json_objects(data, "undecided", where=where)],
            probes=json_int(data, "probes", 0, where=where), attempts=json_int(data, "attempts", 0, where=where),
            not_run=[NotRun.from_json(n, where=where) for n in json_objects(data, "not_run", where=where)],
            model=None if model is None else json_extra(model, frozenset()),
            fitted=None if fitted is None else json_extra(fitted, frozenset()),
            busy_attempts=json_int(data, "busy_attempts", 0, where=where),
            others_busy_cores_max=json_opt_number(data, "others_busy_cores_max", where=where),
            extra=json_extra(data, cls.KEYS),
        )  # fmt: skip


def _verdicts(data: JsonMapping, where: str) -> dict[float, str]:
    """``verdicts`` as the file keys them (``"4.5": "pass"``), by rate."""
    out: dict[float, str] = {}
    for key in data:
        try:
            rate = float(key)
        except ValueError:
            raise JsonShapeError(f"{where} verdicts: key {key!r} should be a rate".strip()) from None
        out[rate] = json_str(data, key, where=f"{where} verdicts".strip())
    return out


__all__ = ["NotRun", "SearchResult", "Undecided"]
