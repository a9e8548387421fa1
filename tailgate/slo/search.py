"""The capacity search: double from a start rate until a probe fails, halve when the start does not pass,
then narrow the bracket [highest pass, lowest fail] until it meets the resolution or the probes or the time
run out. Pure: the probe is a callable, so the rules are testable without a server.

Verdicts are anytime-valid (see :mod:`tailgate.tailbounds`), so a rate whose probe could not decide may be
probed again (``extend``): its attempts are pooled and the verdict keeps its confidence. The search spends
what it was given: a rate with not enough data never ends it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from tailgate.policies import drive
from tailgate.slo.spec import SloError

if TYPE_CHECKING:
    from tailgate.slo.verdict import Check


@dataclass(frozen=True)
class Resolution:
    """The search stops when the bracket is this narrow: req/s, or a fraction of the passing rate."""

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

    def step(self, rate: float) -> float:
        return self.value * rate if self.relative else self.value

    def __str__(self) -> str:
        return f"{self.value * 100:g}%" if self.relative else f"{self.value:g} req/s"


@dataclass
class SearchStep:
    rate: float
    phase: str
    """``double``, ``halve``, ``bisect``, ``above`` (past a rate with not enough data) or ``extend`` (more
    data at a rate probed before, pooled with it)."""
    verdict: str


SearchStatus = Literal["bracketed", "settled", "max_rate", "below_min", "probe_limit", "time_budget"]
"""How a search ends (:attr:`SearchOutcome.status` says what each means)."""


@dataclass(frozen=True)
class ProbeNext:
    """Probe ``rate`` next, in this phase of the search."""

    rate: float
    phase: str
    """``double``, ``halve``, ``bisect``, ``above`` or ``extend`` (:class:`SearchStep`)."""


@dataclass(frozen=True)
class SearchEnds:
    """No probe is needed: the search ends with ``status``."""

    status: SearchStatus


Decision = ProbeNext | SearchEnds
"""What :func:`next_probe` decides from the verdicts so far."""


@dataclass
class SearchOutcome:
    best: float | None
    """Highest rate that passed (None: none did)."""
    first_fail: float | None
    """Lowest rate above ``best`` that *failed* (None: none did). Rates with not enough data above ``best``
    do not close the bracket: the capacity may lie above them."""
    status: SearchStatus
    """``bracketed`` (to the resolution), ``settled`` (a checked model estimate met the resolution first: the
    measured bracket is what the probes so far gave), ``max_rate`` (passed at the cap), ``below_min`` (nothing passed),
    ``probe_limit`` or ``time_budget`` (spent before the bracket met the resolution: the bracket so far)."""
    steps: list[SearchStep] = field(default_factory=list)
    verdicts: dict[float, str] = field(default_factory=dict)
    """The verdict each rate ended with (its attempts pooled, and the monotone order applied)."""

    @property
    def undecided(self) -> list[float]:
        """Rates inside the bracket whose probes could not decide."""
        lo = self.best if self.best is not None else 0.0
        hi = self.first_fail if self.first_fail is not None else float("inf")
        return sorted(r for r, v in self.verdicts.items() if v not in ("pass", "fail") and lo < r < hi)

    @property
    def width(self) -> float | None:
        """Upper end less lower end, req/s (None: the bracket is open)."""
        if self.best is None or self.first_fail is None:
            return None
        return self.first_fail - self.best


class SearchStopped(Exception):
    """Raised by a probe callable when no probe may start (the time budget): the search returns what it has."""

    status: SearchStatus = "time_budget"


def bracket(verdicts: Mapping[float, str]) -> tuple[float | None, float | None]:
    """[highest pass, lowest fail above it] of a set of verdicts."""
    passed = [r for r, v in verdicts.items() if v == "pass"]
    lo = max(passed) if passed else None
    fails = [r for r, v in verdicts.items() if v == "fail" and (lo is None or r > lo)]
    return lo, (min(fails) if fails else None)


AIM = 0.75
"""With a model's capacity ``c``, the ends of the bracket are aimed at ``c * (1 -/+ AIM * resolution)``: close
enough that the bracket meets about the resolution, far enough from ``c`` that a probe there can decide."""


def next_probe(
    verdicts: Mapping[float, str],
    *,
    start: float,
    max_rate: float,
    min_rate: float,
    resolution: Resolution,
    guess: float | None = None,
    on_track: Collection[float] = (),
    over_limit: Collection[float] = (),
) -> Decision:
    """The next rate to probe and its phase given the verdicts so far, or the status the search ends with.

    ``guess`` is a model's capacity (a model statement, never a verdict): it only places probes, aiming the
    ends of the bracket around it; without it the search doubles, steps and bisects. ``on_track``: undecided
    rates whose measured points already meet every limit and whose server kept up, so that only more data is
    missing; with no lower end yet, the highest of them is extended (a second there holds more requests than
    at any lower rate, and its pass is the higher lower end), else the lowest undecided rate. ``over_limit``:
    undecided rates whose measured point of some limited percentile is already over its limit."""
    if not verdicts:
        return ProbeNext(round(min(start, max_rate), 3), "double")
    lo, hi = bracket(verdicts)
    undecided = sorted(r for r, v in verdicts.items() if v not in ("pass", "fail")
                       and (lo is None or r > lo) and (hi is None or r < hi))  # fmt: skip
    if lo is None and hi is None and max(verdicts) < max_rate:
        # nothing passed and nothing failed: undecided is not "too fast", so go on up until a rate fails
        return ProbeNext(round(min(max(verdicts) * 2, max_rate), 3), "double")
    if lo is None:
        low = min(verdicts)
        if verdicts[low] == "fail":  # the lowest rate probed fails: halve below it
            rate = round(low / 2, 3)
            return ProbeNext(rate, "halve") if rate >= min_rate else SearchEnds("below_min")
        # undecided rates under the lowest fail: narrow the upper end while it is wide, else more data at the
        # lowest undecided rate, the likeliest to pass. Where the highest undecided rate already measured a point
        # over a limit and a lower one is on track, the capacity is most likely under the former: a rate between it
        # and the failure narrows nothing the answer needs (a lent H100 spent 92 s at 16.25 req/s between 15, over
        # its TTFT limit, and the failure at 17.5, with the lower end open and 10 req/s on track), so more data at
        # the highest rate on track goes first, the one probe that can close the lower end. A top rate merely too
        # slow to decide in the time left (not on track, yet under every limit) is no such sign: the gap over it
        # is still bisected (a CPU vLLM search extended 4 req/s where 12, between 8 and the failure at 16, was
        # where that day's truth passed)
        tracking = [r for r in undecided if r in on_track]
        leans_fail = bool(tracking) and undecided[-1] in over_limit
        if hi is not None and not resolution.narrow(undecided[-1], hi) and not leans_fail:
            return ProbeNext(round((undecided[-1] + hi) / 2, 3), "bisect")
        return ProbeNext(tracking[-1] if tracking else undecided[0], "extend")
    aim_hi = None if guess is None else guess + AIM * resolution.step(guess)
    if hi is None:  # open above: close it by probing higher
        if not undecided:
            if lo >= max_rate:
                return SearchEnds("max_rate")
            rate = lo * 2 if aim_hi is None or not lo < aim_hi < lo * 2 else aim_hi
            return ProbeNext(round(min(rate, max_rate), 3), "double")
        top = undecided[-1]
        # each step above the undecided rates twice the last: a server past its capacity fails fast
        rate = top + resolution.step(top) * 2 ** (len(undecided) - 1)
        if aim_hi is not None and aim_hi > top:
            rate = max(rate, aim_hi)
        rate = round(min(rate, max_rate), 3)
        return ProbeNext(rate, "above") if rate > top else ProbeNext(top, "extend")
    if resolution.narrow(lo, hi):
        return SearchEnds("bracketed")
    points = [lo, *undecided, hi]
    gaps = [(b - a, (a + b) / 2) for a, b in itertools.pairwise(points) if not resolution.narrow(a, b)]
    if guess is not None and gaps:
        aimed = _aimed(points, guess, resolution)
        if aimed is not None and aimed not in verdicts:
            return ProbeNext(aimed, "bisect")
    if gaps:
        rate = round(max(gaps)[1], 3)
        if rate not in verdicts:
            return ProbeNext(rate, "bisect")
    # every gap within the resolution: only more data at an undecided rate can narrow the bracket; the one
    # nearest the middle splits it most evenly whichever way it goes
    mid = (lo + hi) / 2
    return ProbeNext(min(undecided, key=lambda r: abs(r - mid)), "extend")


def tail_checks(checks: Sequence[Check]) -> list[Check]:
    """The checks of limited percentiles (every check but the error share and whether the server kept up)."""
    return [c for k, c in {c.key: c for c in checks}.items() if k not in ("errors", "sustained")]


def over_a_limit(verdict: str, checks: Sequence[Check]) -> bool:
    """An undecided rate whose measured point of some limited percentile is already over its limit (what
    ``over_limit`` of :func:`next_probe` holds)."""
    over = any(c.point is not None and c.point > c.limit for c in tail_checks(checks))
    return over and verdict not in ("pass", "fail")


def lacks_only_data(verdict: str, checks: Sequence[Check]) -> bool:
    """An undecided rate whose every limited point is under its limit, whose server was not shown to fall behind
    and whose errors did not fail: only more data is missing for a pass (what ``on_track`` of :func:`next_probe`
    holds).

    A sustained check that is only undecided (the window too short for the requests still running at its end)
    does not take a rate off the track: a longer attempt there is what decides it, and the highest such rate is
    where more data narrows the bracket most. A sample that fell behind does (the check counts it in ``over``):
    such a rate can fail or stay undecided, never pass."""
    if verdict in ("pass", "fail"):
        return False
    by_key = {c.key: c for c in checks}
    tails = tail_checks(checks)
    under = all(c.point is not None and c.point <= c.limit for c in tails)
    sustained, errors = by_key.get("sustained"), by_key.get("errors")
    not_behind = sustained is not None and sustained.verdict != "fail" and not sustained.over
    return bool(tails) and under and not_behind and (errors is None or errors.verdict != "fail")


def worth_extending(seconds_to_decide: Mapping[float, float | None], left_s: float | None) -> list[float]:
    """Of the rates lacking only data (each with its estimated seconds to a decision, None: beyond estimate), the
    ones more data should go to: those expected to decide in the ``left_s`` seconds left (the search takes the
    highest), else the one nearest to deciding. The highest rate buys the highest lower end, but only if it can
    be decided in time: a lower rate that can beats a higher one that cannot."""
    if left_s is None:
        return sorted(seconds_to_decide)
    fits = sorted(r for r, s in seconds_to_decide.items() if s is not None and s <= left_s)
    if fits:
        return fits
    known = {r: s for r, s in seconds_to_decide.items() if s is not None}
    if known:
        return [min(known, key=lambda r: (known[r], -r))]
    return sorted(seconds_to_decide)


def _aimed(points: list[float], guess: float, resolution: Resolution) -> float | None:
    """A rate aimed at the model's capacity: just under it when the lower end is further from it than the upper
    (relative to it), else just over it; inside a gap that is wider than the resolution, not at its edges."""
    lo, hi = points[0], points[-1]
    d = AIM * (resolution.step(guess) if resolution.relative else resolution.value)
    target = guess - d if (guess - lo) >= (hi - guess) else guess + d
    for a, b in itertools.pairwise(points):
        if a < target < b and not resolution.narrow(a, b):
            margin = 0.15 * (b - a)
            return round(min(max(target, a + margin), b - margin), 3)
    return None


class RateSearch:
    """The capacity search as a cell policy (:class:`tailgate.policies.CellPolicy`): its cells are the rates to
    probe (:class:`ProbeNext`), its results their verdicts, each next rate :func:`next_probe`'s decision.

    ``pooled()``, when given, returns every rate's verdict after pooling across rates under the monotone order,
    which may decide rates their own data did not. ``guess()``, when given, returns a model's capacity from the
    probes so far, used only to place probes (:func:`next_probe`), as is ``on_track()``. ``settled()``, when
    given, is asked after each probe whether a model checked against the probes has met the resolution: the
    search then ends early."""

    def __init__(
        self,
        *,
        start: float,
        max_rate: float,
        min_rate: float,
        resolution: Resolution,
        max_probes: int,
        pooled: Callable[[], Mapping[float, str]] | None = None,
        guess: Callable[[], float | None] | None = None,
        settled: Callable[[], bool] | None = None,
        on_track: Callable[[], Collection[float]] | None = None,
        over_limit: Callable[[], Collection[float]] | None = None,
    ) -> None:
        self.start, self.max_rate, self.min_rate = start, max_rate, min_rate
        self.resolution = resolution
        self.max_probes = max_probes
        self._pooled, self._guess, self._settled, self._on_track = pooled, guess, settled, on_track
        self._over_limit = over_limit
        self.steps: list[SearchStep] = []
        self._own: dict[float, str] = {}
        self.status: SearchStatus = "probe_limit"
        """How the search ended so far: the probe limit unless a decision or a stop says otherwise."""
        self._ended = False

    def verdicts(self) -> dict[float, str]:
        return dict(self._pooled()) if self._pooled is not None else dict(self._own)

    def next_cell(self) -> ProbeNext | None:
        if self._ended:
            return None
        decision = next_probe(
            self.verdicts(), start=self.start, max_rate=self.max_rate, min_rate=self.min_rate,
            resolution=self.resolution, guess=self._guess() if self._guess is not None else None,
            on_track=self._on_track() if self._on_track is not None else (),
            over_limit=self._over_limit() if self._over_limit is not None else (),
        )  # fmt: skip
        if isinstance(decision, SearchEnds):
            self.end(decision.status)
            return None
        if len(self.steps) >= self.max_probes:
            self._ended = True
            return None
        return decision

    def record(self, cell: ProbeNext, result: str) -> None:
        self.steps.append(SearchStep(cell.rate, cell.phase, result))
        self._own[cell.rate] = result
        if self._settled is not None and self._settled():
            self.end("settled")

    def end(self, status: SearchStatus) -> None:
        """No more probes: the search ends with ``status``."""
        self.status, self._ended = status, True

    def outcome(self) -> SearchOutcome:
        """The bracket and verdicts as they stand; "bracketed" only where the bracket meets the resolution."""
        verdicts = self.verdicts()
        lo, hi = bracket(verdicts)
        status = self.status
        if status == "bracketed" and (lo is None or hi is None or not self.resolution.narrow(lo, hi)):
            status = "probe_limit"
        return SearchOutcome(lo, hi, status, list(self.steps), verdicts)


def search(
    probe: Callable[[float, str], str],
    *,
    start: float,
    max_rate: float,
    min_rate: float,
    resolution: Resolution,
    max_probes: int,
    pooled: Callable[[], Mapping[float, str]] | None = None,
    guess: Callable[[], float | None] | None = None,
    settled: Callable[[], bool] | None = None,
    on_track: Callable[[], Collection[float]] | None = None,
    over_limit: Callable[[], Collection[float]] | None = None,
) -> SearchOutcome:
    """Probe until the bracket meets the resolution, the cap or floor is reached, or the probes run out.

    ``probe(rate, phase)`` returns ``pass``, ``fail`` or ``not_enough_data`` for the rate's data so far
    (a rate probed again pools its attempts); it may raise :class:`SearchStopped`. The other arguments are
    :class:`RateSearch`'s. Only ``pass`` counts as meeting the SLO; the reported upper end is the lowest rate
    that *failed*, so the bracket holds the capacity whenever the verdicts do.
    """
    policy = RateSearch(
        start=start, max_rate=max_rate, min_rate=min_rate, resolution=resolution, max_probes=max_probes,
        pooled=pooled, guess=guess, settled=settled, on_track=on_track, over_limit=over_limit,
    )  # fmt: skip
    try:
        drive(policy, lambda cell: probe(cell.rate, cell.phase))
    except SearchStopped as e:
        policy.end(e.status)
    return policy.outcome()
