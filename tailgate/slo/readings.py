"""Telling apart the readings of a cost the probes never measured, with one probe where they disagree.

Where the simulation prefills steps larger than any the probes saw, the fitted square prefill terms are read
several ways (as fitted, flat past the largest step measured, per prompt instead of per step:
:func:`tailgate.slo.replay._extrapolations`), and the model's interval spans them all. On a lent H100 that was
6.83 [6.45, 14.83] req/s: honest, and 117% wide. Probes at the union's two ends cannot narrow it, since every
reading says the same there. A probe *between* two readings' intervals can: each reading replays the probe's own
requests (:mod:`tailgate.slo.windowmatch`), and one whose implied capacity ratio lies wholly outside its own
interval, or whose verdict the probe's decided verdict opposes, is ruled out. The probe sits where near-capacity
steps are large, so it also measures the steps that were extrapolated: when every reading is ruled out, the refit
on everything measured (:func:`tailgate.slo.confirm.confirm_answer`) prices them from data.

Pure: the probe's data come in, the readings left go out.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from tailgate.jsontypes import JsonObject
from tailgate.slo.replay import ModelAnswer
from tailgate.slo.servicefit import Probe
from tailgate.slo.windowmatch import WindowMatch, matches_at
from tailgate.verify.groundtruth.engine import EngineModel

FITTED = "as fitted"


@dataclass(frozen=True, slots=True)
class Reading:
    """One reading of the fitted engine and the capacity interval it gives."""

    name: str
    engine: EngineModel
    capacity: float
    low: float
    high: float

    @property
    def claim(self) -> tuple[float, float]:
        """The interval relative to the capacity, as a window's ratio is."""
        return self.low / self.capacity, self.high / self.capacity

    def text(self) -> str:
        return f"{self.name} {self.capacity:.3g} [{self.low:.3g}, {self.high:.3g}]"


@dataclass(frozen=True, slots=True)
class ReadingVerdict:
    """What the probe between the readings says of one of them."""

    reading: Reading
    matches: tuple[WindowMatch, ...]
    ruled_out: str = ""
    """Why the probe rules this reading out (empty: it stays)."""

    def to_json(self) -> JsonObject:
        r = self.reading
        return {"reading": r.name, "capacity": round(r.capacity, 3), "interval": [round(r.low, 3), round(r.high, 3)],
                "ruled_out": self.ruled_out, "windows": [m.to_json() for m in self.matches]}  # fmt: skip


def readings_of(answer: ModelAnswer) -> list[Reading]:
    """The fitted reading and its others, each with its own interval (empty: the answer has only one reading)."""
    fit, cap = answer.fit, answer.capacity
    if fit is None or cap is None or answer.own is None:
        return []
    others = [Reading(e.reading, e.engine, e.capacity, e.low, e.high) for e in answer.extrapolated if e.engine]
    return [Reading(FITTED, fit.engine, cap, *answer.own), *others] if others else []


def between_rate(readings: Sequence[Reading]) -> float | None:
    """Where the readings disagree most: the geometric middle of the widest gap between the intervals of two
    readings next in capacity (None: the intervals overlap into one, so the union's ends test them all). Every
    reading under the gap says the SLO fails there and every one over it says it holds."""
    ordered = sorted(readings, key=lambda r: r.capacity)
    gaps = [(b.low / a.high, math.sqrt(a.high * b.low)) for a, b in itertools.pairwise(ordered) if b.low > a.high]
    return round(max(gaps)[1], 3) if gaps else None


def judge_readings(readings: Sequence[Reading], rate: float, verdict: str, probe: Probe | None, q: float,
                   limits: Mapping[str, float]) -> list[ReadingVerdict]:  # fmt: skip
    """Each reading against the probe at ``rate``: ruled out by a decided verdict its interval opposes (a pass
    over it, a failure under it) or by a window whose implied capacity ratio lies wholly outside its claim."""
    out = []
    for r in readings:
        matches = () if probe is None else matches_at(r.engine, [probe], q, list(limits), limits)
        lo_c, hi_c = r.claim
        off = [m for m in matches if m.high < lo_c or m.low > hi_c]
        if verdict == "pass" and rate > r.high:
            why = f"{rate:g} req/s measured PASS, over its interval"
        elif verdict == "fail" and rate < r.low:
            why = f"{rate:g} req/s measured FAIL, under its interval"
        elif off:
            why = f"{off[0].text()}, outside its own [{lo_c:.3f}, {hi_c:.3f}]"
        else:
            why = ""
        out.append(ReadingVerdict(r, tuple(matches), why))
    return out


def kept_answer(answer: ModelAnswer, kept: Sequence[Reading]) -> ModelAnswer:
    """The answer narrowed to the readings a probe left: their union is its interval, and when the fitted reading
    was ruled out, the kept reading nearest the union's middle answers (its engine is the one the end probes
    test)."""
    low, high = min(r.low for r in kept), max(r.high for r in kept)
    mid = math.sqrt(low * high)
    lead = next((r for r in kept if r.name == FITTED), None) or min(kept, key=lambda r: abs(math.log(r.capacity / mid)))
    names = {r.name for r in kept} - {lead.name}
    fit = answer.fit if answer.fit is None or lead.name == FITTED else replace(answer.fit, engine=lead.engine)
    bracket = answer.bracket and (max(low, answer.bracket[0]), min(high, answer.bracket[1]))
    return replace(answer, capacity=lead.capacity, low=low, high=high, fit=fit, bracket=bracket,
                   own=(lead.low, lead.high) if names else None,
                   extrapolated=[e for e in answer.extrapolated if e.reading in names])  # fmt: skip


@dataclass(frozen=True, slots=True)
class ReadingsTest:
    """One probe between the readings and what it left."""

    round: int
    rate: float
    verdict: str
    judged: tuple[ReadingVerdict, ...]

    @property
    def kept(self) -> list[Reading]:
        return [j.reading for j in self.judged if not j.ruled_out]

    def text(self) -> str:
        out = [f"{j.reading.name} ruled out ({j.ruled_out})" for j in self.judged if j.ruled_out]
        kept = ", ".join(r.text() for r in self.kept) or "none"
        return f"at {self.rate:g} req/s ({self.verdict.replace('_', ' ')}): " + "; ".join([*out, f"kept: {kept}"])

    def to_json(self) -> JsonObject:
        return {"round": self.round, "rate": self.rate, "verdict": self.verdict,
                "readings": [j.to_json() for j in self.judged]}  # fmt: skip
