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
    """``double``, ``halve`` or ``bisect``."""
    verdict: str


@dataclass
class SearchOutcome:
    best: float | None
    """Highest rate that passed (None: none did)."""
    first_fail: float | None
    """Lowest rate above ``best`` that did not pass (None: every probe up to the maximum passed)."""
    status: str
    """``bracketed`` (to the resolution), ``max_rate`` (passed at the cap), ``below_min`` (nothing passed),
    ``probe_limit`` (the probe budget ran out before the resolution)."""
    steps: list[SearchStep] = field(default_factory=list)


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

    ``probe(rate, phase)`` returns ``pass``, ``fail`` or ``uncertain``. When the start rate already fails
    the rate halves until one passes or ``min_rate`` is reached. Rates are rounded to 1/1000 req/s.
    """
    steps: list[SearchStep] = []
    lo: float | None = None
    hi: float | None = None

    def run(rate: float, phase: str) -> bool:
        v = probe(rate, phase)
        steps.append(SearchStep(rate, phase, v))
        return v == "pass"

    rate = round(min(start, max_rate), 3)
    while len(steps) < max_probes:  # doubling
        if run(rate, "double"):
            lo = rate
            if rate >= max_rate:
                return SearchOutcome(lo, None, "max_rate", steps)
            rate = round(min(rate * 2, max_rate), 3)
        else:
            hi = rate
            break
    if hi is None:
        return SearchOutcome(lo, None, "probe_limit", steps)
    while lo is None and len(steps) < max_probes:  # the start failed: halve
        rate = round(hi / 2, 3)
        if rate < min_rate:
            return SearchOutcome(None, hi, "below_min", steps)
        if run(rate, "halve"):
            lo = rate
        else:
            hi = rate
    if lo is None:
        return SearchOutcome(None, hi, "probe_limit", steps)
    while not resolution.narrow(lo, hi):  # bisection
        if len(steps) >= max_probes:
            return SearchOutcome(lo, hi, "probe_limit", steps)
        mid = round((lo + hi) / 2, 3)
        if mid in (lo, hi):
            break
        if run(mid, "bisect"):
            lo = mid
        else:
            hi = mid
    return SearchOutcome(lo, hi, "bracketed", steps)


def _outcome_so_far(probes: Sequence[Mapping[str, Any]]) -> SearchOutcome:
    """The answer the probes run so far give, when the search is cut short."""
    passed = [p["rate"] for p in probes if p["verdict"] == "pass"]
    best = max(passed) if passed else None
    above = [p["rate"] for p in probes if p["verdict"] != "pass" and (best is None or p["rate"] > best)]
    steps = [SearchStep(p["rate"], p["phase"], p["verdict"]) for p in probes]
    return SearchOutcome(best, min(above) if above else None, "time_budget", steps)
