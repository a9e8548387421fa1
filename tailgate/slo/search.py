"""The capacity search: double from a start rate until a probe does not pass, halve when the start fails,
then bisect to a resolution. Pure: the probe is a callable, so the rules are testable without a server.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tailgate.slo.spec import SloError


@dataclass(frozen=True)
class Resolution:
    """Bisection stops when the bracket is this narrow: req/s, or a fraction of the passing rate."""

    value: float
    relative: bool

    @classmethod
    def parse(cls, text: str) -> Resolution:
        t = text.strip()
        try:
            res = cls(float(t[:-1]) / 100.0, True) if t.endswith("%") else cls(float(t), False)
        except ValueError:
            raise SloError(f"--resolution: expected req/s (e.g. 2) or a percentage (e.g. 10%), got {text!r}") from None
        if not res.value > 0 or (res.relative and res.value >= 1):
            raise SloError(f"--resolution: must be above 0 (and a percentage below 100%), got {text!r}")
        return res

    def narrow(self, lo: float, hi: float) -> bool:
        return hi - lo <= (self.value * lo if self.relative else self.value) + 1e-9

    def __str__(self) -> str:
        return f"{self.value * 100:g}%" if self.relative else f"{self.value:g} req/s"


@dataclass
class SearchStep:
    rate: float
    phase: str
    """``double``, ``halve``, ``bisect`` or ``above`` (past a rate with not enough data)."""
    verdict: str


@dataclass
class SearchOutcome:
    best: float | None
    """Highest rate that passed (None: none did)."""
    first_fail: float | None
    """Lowest rate above ``best`` that *failed* (None: none did). Rates with not enough data above ``best``
    do not close the bracket: the capacity may lie above them."""
    status: str
    """``bracketed`` (to the resolution), ``max_rate`` (passed at the cap), ``below_min`` (nothing passed),
    ``probe_limit`` (the probe budget ran out before the resolution), ``unresolved`` (the rates that would
    narrow the bracket had not enough data: run longer)."""
    steps: list[SearchStep] = field(default_factory=list)

    @property
    def unresolved(self) -> list[float]:
        """Rates inside the bracket whose probes could not decide."""
        lo = self.best if self.best is not None else 0.0
        hi = self.first_fail if self.first_fail is not None else float("inf")
        return sorted({s.rate for s in self.steps if s.verdict not in ("pass", "fail") and lo < s.rate < hi})


def search(
    probe: Callable[[float, str], str],
    *,
    start: float,
    max_rate: float,
    min_rate: float,
    resolution: Resolution,
    max_probes: int,
) -> SearchOutcome:
    """Double from ``start`` until a probe does not pass, then bisect; only ``pass`` counts as meeting the SLO.

    ``probe(rate, phase)`` returns ``pass``, ``fail`` or ``not_enough_data``. When the start rate already
    fails the rate halves until one passes or ``min_rate`` is reached. Rates are rounded to 1/1000 req/s.
    A rate with not enough data steers the bisection down (it is not a pass) but does not end the bracket:
    the reported upper end is the lowest rate that *failed*, so the bracket holds the capacity whenever the
    verdicts do.
    """
    steps: list[SearchStep] = []
    lo: float | None = None
    hi: float | None = None

    def first_failed(best: float | None) -> float | None:
        fails = [s.rate for s in steps if s.verdict == "fail" and (best is None or s.rate > best)]
        return min(fails) if fails else None

    def outcome(best: float | None, status: str) -> SearchOutcome:
        ff = first_failed(best)
        if status == "bracketed" and best is not None and (ff is None or not resolution.narrow(best, ff)):
            status = "unresolved"
        return SearchOutcome(best, ff, status, steps)

    def run(rate: float, phase: str) -> bool:
        v = probe(rate, phase)
        steps.append(SearchStep(rate, phase, v))
        return v == "pass"

    rate = round(min(start, max_rate), 3)
    while len(steps) < max_probes:  # doubling
        if run(rate, "double"):
            lo = rate
            if rate >= max_rate:
                return outcome(lo, "max_rate")
            rate = round(min(rate * 2, max_rate), 3)
        else:
            hi = rate
            break
    if hi is None:
        return outcome(lo, "probe_limit")
    while lo is None and len(steps) < max_probes:  # the start failed: halve
        rate = round(hi / 2, 3)
        if rate < min_rate:
            return outcome(None, "below_min")
        if run(rate, "halve"):
            lo = rate
        else:
            hi = rate
    if lo is None:
        return outcome(None, "probe_limit")
    # Narrow the bracket [highest pass, lowest fail]. A rate with not enough data cannot end it, but the
    # capacity is probably near it (undecided means "close to a limit"): probe the wider of the gaps on
    # either side of the undecided rates, or, while nothing above them has failed, step above the highest
    # by the resolution, so the bracket gets a failing upper end.
    while len(steps) < max_probes:
        ff = first_failed(lo)
        if ff is not None and resolution.narrow(lo, ff):
            break
        undecided = sorted({s.rate for s in steps if s.verdict not in ("pass", "fail") and s.rate > lo
                            and (ff is None or s.rate < ff)})  # fmt: skip
        if not undecided:
            if ff is None:
                break
            rate, phase = round((lo + ff) / 2, 3), "bisect"
        elif ff is None:
            top = undecided[-1]
            rate, phase = round(min(top + _step(resolution, top), max_rate), 3), "above"
            if rate <= top:
                break
        else:
            gaps = []
            if not resolution.narrow(lo, undecided[0]):
                gaps.append((undecided[0] - lo, (lo + undecided[0]) / 2))
            if not resolution.narrow(undecided[-1], ff):
                gaps.append((ff - undecided[-1], (undecided[-1] + ff) / 2))
            if not gaps:
                break  # every gap is within the resolution: only longer probes can narrow it further
            rate, phase = round(max(gaps)[1], 3), "bisect"
        if any(s.rate == rate for s in steps):
            break
        if run(rate, phase):
            lo = rate
    else:
        ff = first_failed(lo)
        if ff is None or not resolution.narrow(lo, ff):
            return outcome(lo, "probe_limit")
    return outcome(lo, "bracketed")


def _step(resolution: Resolution, rate: float) -> float:
    return resolution.value * rate if resolution.relative else resolution.value


def _outcome_so_far(probes: Sequence[Mapping[str, Any]]) -> SearchOutcome:
    """The answer the probes run so far give, when the search is cut short."""
    passed = [p["rate"] for p in probes if p["verdict"] == "pass"]
    best = max(passed) if passed else None
    above = [p["rate"] for p in probes if p["verdict"] == "fail" and (best is None or p["rate"] > best)]
    steps = [SearchStep(p["rate"], p["phase"], p["verdict"]) for p in probes]
    return SearchOutcome(best, min(above) if above else None, "time_budget", steps)
