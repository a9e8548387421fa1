"""Narrowing the bracket that the readings of a never-measured cost make, with one probe where they disagree.

Where the simulation prefills steps larger than any the probes saw, the fitted square prefill terms are read
several ways (as fitted, flat past the largest step measured, per prompt instead of per step), and where the probes
replay a front end that tokenizes one prompt at a time as well as one that tokenizes side by side, both are read
(:func:`tailgate.slo.replay._extrapolations`): the model's interval spans them all. On a lent H100 that was
6.83 [6.45, 14.83] req/s: honest, and 117% wide. Probes at the union's two ends cannot narrow it, since every
reading says the same there. A probe *between* two readings' intervals can: each reading replays the probe's own
requests (:mod:`tailgate.slo.windowmatch`), and one whose implied capacity ratio lies wholly outside its own
interval, or whose verdict the probe's decided verdict opposes, is ruled out.

The readings are the extreme forms of the unmeasured cost, not candidates for it: on that H100 a full step cost
~186 ms, between the square's ~211 and the flat rate's ~179, and the capacity (9 req/s passing, 10.5 failing by
points over 4,000 requests each) lay between the readings' 6.8 and 13. So a probe does not pick a reading: the
readings' bracket stays, and each ruled-out reading moves one end of it by what ruled it out (a window that finds
a reading too slow puts the capacity over that reading's capacity times the window's lowest ratio). A reading the
window cannot tell apart is kept and moves nothing. The probe also measures the steps that were extrapolated: when
no reading is left, the refit on everything measured (:func:`tailgate.slo.confirm.confirm_answer`) prices them.

Pure: the probe's data come in, the bracket goes out.
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
MOVING_SPREAD = 1.2
"""A window's ratio moves a bracket end only where the reading's replayed percentile rises at least this many
times across the scan of arrival rates. A percentile flat in the load (a worst gap set by one step's cost) is met
by no rescaling of the arrivals: its crossing sits at the scan's end whatever the size of the error, and on a
simulated engine it put a capacity of 15.3 req/s under 12.8. Such a window still rules the reading out."""


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
    """What the probe between the readings says of one of them, and the end of the bracket it moves."""

    reading: Reading
    matches: tuple[WindowMatch, ...]
    ruled_out: str = ""
    """Why the probe rules this reading out (empty: it stays)."""
    above: float = 0.0
    """The capacity lies above this (0: no such evidence): a pass at the probe's rate, or this reading's window
    says it is too slow (its capacity times the window's lowest ratio, on a percentile that moves with the load:
    :data:`MOVING_SPREAD`)."""
    below: float = math.inf
    """The capacity lies under this (inf: no such evidence): a failure, or the window says it is too fast."""

    def to_json(self) -> JsonObject:
        r = self.reading
        return {"reading": r.name, "capacity": round(r.capacity, 3), "interval": [round(r.low, 3), round(r.high, 3)],
                "ruled_out": self.ruled_out, "above": round(self.above, 3),
                "below": None if math.isinf(self.below) else round(self.below, 3),
                "windows": [m.to_json() for m in self.matches]}  # fmt: skip


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
    over it, a failure under it) or by a window whose implied capacity ratio lies wholly outside its claim, and
    the bound on the capacity that says (a window open at the scan's end bounds it at that end)."""
    out = []
    for r in readings:
        matches = () if probe is None else matches_at(r.engine, [probe], q, list(limits), limits)
        lo_c, hi_c = r.claim
        slow = [m for m in matches if m.low > hi_c]
        fast = [m for m in matches if m.high < lo_c]
        above = max([r.capacity * m.low for m in slow if m.load_spread >= MOVING_SPREAD], default=0.0)
        below = min([r.capacity * m.high for m in fast if m.load_spread >= MOVING_SPREAD], default=math.inf)
        if verdict == "pass" and rate > r.high:
            why, above = f"{rate:g} req/s measured PASS, over its interval", max(above, rate)
        elif verdict == "fail" and rate < r.low:
            why, below = f"{rate:g} req/s measured FAIL, under its interval", min(below, rate)
        elif slow or fast:
            why = f"{(slow or fast)[0].text()}, outside its own [{lo_c:.3f}, {hi_c:.3f}]"
        else:
            why = ""
        out.append(ReadingVerdict(r, tuple(matches), why, above, below))
    return out


def narrowed_answer(answer: ModelAnswer, test: ReadingsTest) -> ModelAnswer:
    """The answer after the probe between its readings: the bracket the readings made, its ends moved by what
    ruled readings out (:attr:`ReadingsTest.bounds`); the kept reading nearest its middle answers (its engine is
    the one the end probes test), the fitted one when it is kept."""
    low, high = test.bounds
    kept = test.kept
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

    @property
    def bounds(self) -> tuple[float, float]:
        """The readings' bracket (the lowest reading's lower end to the highest's upper end: the cost the probes
        never measured lies between its readings, and so does the capacity), each end moved in by the evidence
        that ruled a reading out. Kept readings move nothing: a window that cannot tell is no evidence."""
        low = min(j.reading.low for j in self.judged)
        high = max(j.reading.high for j in self.judged)
        return max([low, *(j.above for j in self.judged)]), min([high, *(j.below for j in self.judged)])

    @property
    def stands(self) -> bool:
        """A reading is kept and the evidence is consistent (its bounds do not cross)."""
        low, high = self.bounds
        return bool(self.kept) and low <= high

    def text(self) -> str:
        out = [f"{j.reading.name} ruled out ({j.ruled_out})" for j in self.judged if j.ruled_out]
        kept = ", ".join(r.text() for r in self.kept) or "none"
        low, high = self.bounds
        return (f"at {self.rate:g} req/s ({self.verdict.replace('_', ' ')}): " + "; ".join([*out, f"kept: {kept}"])
                + f"; the readings' bracket is now [{low:.3g}, {high:.3g}]")  # fmt: skip

    def to_json(self) -> JsonObject:
        low, high = self.bounds
        return {"round": self.round, "rate": self.rate, "verdict": self.verdict,
                "bounds": [round(low, 3), round(high, 3)], "readings": [j.to_json() for j in self.judged]}  # fmt: skip
