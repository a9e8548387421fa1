"""Predict, then test: a fitted capacity stands only once probes it was not fitted to fail to contradict it.

A model checked only against the probes it was fitted to cannot see its own bias: the replay of those probes is
close by construction, and on an engine outside the model's family (FIFO slots, a prefill that pairs long
prompts, KV-cache pressure) the narrow interval it gives can lie wholly on one side of the truth. So, after the
fit, the search runs *confirmation probes* where the model is most exposed: just under its interval's lower end
(the model says the SLO holds there) and just over its upper end (the model says it fails). They are chosen after
the fit and never fed to it, and they are longer than the search's probes, so that an error larger than the
interval's width shows.

Each confirmation probe can contradict the model two ways, each at the confidence of the search's verdicts:

- its measured verdict is the opposite of the model's (a decided *fail* under the interval, a decided *pass*
  over it): the capacity is outside the interval;
- the model, given the probe's own arrivals and requests, gives a percentile outside the probe's
  distribution-free interval for it (the same requests, so no window-to-window spread to hide behind).

A probe that decides as the model said *confirms* that end. A probe that decides nothing and whose percentile
the model replays inside the measured interval leaves that end *not contradicted*: the answer says so. A
contradicted model is refitted once on everything measured (the confirmation probes included) and confirmed
again at new rates; a second contradiction refuses it, and the answer is the measured bracket alone.

Pure: the probe's data come in, the judgement goes out, so the rule is tested against servers whose answer is
known (``tests/test_slo_confirm.py``) without a server.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from tailgate.jsontypes import JsonObject
from tailgate.slo.replay import ModelAnswer
from tailgate.slo.search import SearchStopped
from tailgate.slo.servicefit import METRIC_OF_OUTCOME, Probe, replay
from tailgate.slo.stepfit import Stream
from tailgate.verify.groundtruth.engine import EngineModel, quantile

MARGIN = 0.03
"""How far outside the model's interval a confirmation probe is placed, relative to the end it tests: close
enough that a model off by more than its width is contradicted, far enough that a right one is rarely."""
LENGTH = 1.5
"""A confirmation probe's measured requests, as a multiple of a search probe's."""
ROUNDS = 2
"""Fits confirmed at most: the first, and one refit after a contradiction."""

Side = Literal["below", "above"]
Outcome = Literal["confirmed", "not_contradicted", "contradicted", "not_run"]


def confirmation_rates(low: float, high: float, margin: float = MARGIN) -> tuple[float, float]:
    """Where to test an interval [low, high]: just under its lower end and just over its upper end (req/s)."""
    return round(low * (1.0 - margin), 3), round(high * (1.0 + margin), 3)


def reserve_seconds(time_budget: float, *, duration: float, n: int, warmup: int, rate: float,
                    overhead: float, rounds: int = ROUNDS) -> float:  # fmt: skip
    """Seconds of the time budget the search keeps for its confirmation probes, if they were at ``rate`` (a
    probe's length is ``max(n, rate * duration)`` requests, so the lowest rate costs the most): two probes of
    :data:`LENGTH` for the first fit, and two of one search probe's length for each refit after it (the
    shortest :func:`length_within` allows), so that a contradicted model can still be tested; 0 without a
    budget, never more than half of it."""
    if not time_budget:
        return 0.0
    per_request_s = 1.0 / rate
    first = LENGTH * max(n, rate * duration) + warmup
    later = max(n, rate * duration) + warmup
    seconds = 2 * (first * per_request_s + overhead) + (rounds - 1) * 2 * (later * per_request_s + overhead)
    return min(time_budget / 2, seconds * 1.05)


def reserve_rate(low: float | None, high: float | None, next_rate: float) -> float:
    """The rate the confirmation probes are budgeted at before the model is fitted: the highest rate shown to
    pass (they run near the capacity, above it); with only a failure, half the next probe's rate (the capacity
    may lie well under it); with nothing decided, the next probe's own rate. A search that decides nothing
    answers by its model alone, so that is when the model's confirmation matters most: a CPU vLLM search that
    extended one undecided rate five times left 39 s for the refit's test (issue #40)."""
    if low is not None:
        return low
    return next_rate / 2 if high is not None else next_rate


def length_within(remaining_s: float, probes_left: int, n: int, warmup: int, rate: float,
                  overhead: float) -> float | None:  # fmt: skip
    """The length (a multiple of a search probe's ``n``) a confirmation probe may have so that it and the
    ``probes_left - 1`` after it fit in ``remaining_s``: :data:`LENGTH` when it fits, less when not, never under
    one search probe (None: not even that fits; inf remaining: no budget)."""
    if math.isinf(remaining_s):
        return LENGTH
    per_probe = remaining_s / max(1, probes_left) - overhead
    fits = 0.98 * (per_probe * rate - warmup) / n  # a margin for the rounding of the probe's request count
    if fits < 1.0:
        return None
    return min(LENGTH, fits)


SCALES = tuple(round(0.7 + 0.025 * k, 3) for k in range(25))
"""Time scales of the probe's arrivals the model is replayed at (0.7 to 1.3 times the rate)."""
BLOCKS = 10
"""Time blocks per window, each resampled whole: a queue build-up near the capacity lasts many seconds, and
stays inside its block (a 1.5x probe of 120 s makes blocks of 18 s). Worst gaps are blocked by when they ended,
so a 60-s window's 6-s blocks keep one stall's victims together too."""
RESAMPLES = 400
LEVEL = 0.975
"""Two-sided level of each window's interval: 95% over the two confirmation probes of a round (Bonferroni)."""
MIN_STREAMS = 100
"""Measured streams a window needs before its p99 can be matched (a p99 of fewer rests on one request)."""
LOAD_SENSITIVE = 1.5
"""A window's percentile is matched, far under its limit too, when the model's replay of it rises at least this
many times from the scan's sparsest arrivals to its densest: the queue is in sight, so where the model's and the
window's tails meet says how far its capacity is off. A capacity set by a queue that runs away (a cliff, as on a
CPU server whose TTFT p99 jumps from 2 s to 80 s between two rates) is tested this way, where the tail near the
capacity is never near its limit in a window of a minute or two."""


@dataclass(frozen=True, slots=True)
class WindowMatch:
    """What one confirmation window says of the model's speed on one limited percentile.

    The model is replayed on the window's own arrivals and requests, the arrival times scaled by each of
    :data:`SCALES`; ``scale`` is where its percentile meets the measured one. A model whose capacity is right
    matches near 1: the queue build-ups of the window are the same in both. A model 10% too slow matches the
    measured tail only with its arrivals ~10% sparser, so the window implies a capacity ``ratio = 1 / scale``
    times the model's. The interval is a block bootstrap of the pairs (measured, replayed) per request, time
    blocks resampled whole, so a stall that hit many streams at once counts once."""

    metric: str
    measured: float
    """The window's percentile, ms (the measured streams past the warm-up)."""
    model: float
    """The model's percentile on the same requests at the window's own rate, ms."""
    ratio: float
    """True capacity over the model's, as this window implies it."""
    low: float
    high: float
    open_low: bool = False
    """The ratio lies at or under the scan's lowest end (the model is far too fast)."""
    open_high: bool = False
    load_spread: float = 1.0
    """The model's percentile on these requests at the scan's densest arrivals over its sparsest."""

    def to_json(self) -> JsonObject:
        return {"metric": self.metric, "measured": round(self.measured, 1), "model": round(self.model, 1),
                "ratio": round(self.ratio, 4), "interval": [round(self.low, 4), round(self.high, 4)],
                "open_low": self.open_low, "open_high": self.open_high,
                "load_spread": round(self.load_spread, 3)}  # fmt: skip

    def text(self) -> str:
        lo = f"<={self.low:.3f}" if self.open_low else f"{self.low:.3f}"
        hi = f">={self.high:.3f}" if self.open_high else f"{self.high:.3f}"
        return (f"{self.metric} p99 measured {self.measured:.1f} ms, model {self.model:.1f} ms on the same requests: "
                f"true capacity / model's {self.ratio:.3f} [{lo}, {hi}]")  # fmt: skip


def _scaled(streams: Sequence[Stream], scale: float) -> list[Stream]:
    t0 = min(s.intended for s in streams)
    return [replace(s, intended=t0 + (s.intended - t0) / scale) for s in streams]


def _crossing(measured: Sequence[float], replayed: Sequence[Sequence[float]], idx: Sequence[int], q: float) -> float:
    """The scale where the replayed percentile of these requests meets the measured one (clamped to the scan)."""
    m = quantile([measured[i] for i in idx], q)
    f = [quantile([r[i] for i in idx], q) - m for r in replayed]
    for k in range(1, len(SCALES)):
        if f[k - 1] <= 0 < f[k]:
            return SCALES[k - 1] + (SCALES[k] - SCALES[k - 1]) * (-f[k - 1]) / (f[k] - f[k - 1])
    return SCALES[0] if f[0] > 0 else SCALES[-1]


def window_blocks(streams: Sequence[Stream], metric: str) -> list[list[int]]:
    """:data:`BLOCKS` groups of indices into ``streams``, of equal count, in the order each value was set: a worst
    gap by when it ended (one stall sets the worst gap of every stream alive then, and those were sent over a
    stream's lifetime before it: by send they would scatter over several blocks and count as independent),
    anything else by its intended send. The verdict's blocks follow the same rule (``verdict._block``)."""

    def when(i: int) -> float:
        s = streams[i]
        return s.gap_end if metric == "gap" and s.gap_end > 0 else s.intended

    order, n = sorted(range(len(streams)), key=when), len(streams)
    return [order[b * n // BLOCKS : (b + 1) * n // BLOCKS] for b in range(BLOCKS)]


def window_match(engine: EngineModel, attempts: Sequence[Sequence[Stream]], q: float, metric: str,
                 *, seed: int = 1) -> WindowMatch | None:  # fmt: skip
    """The capacity ratio one confirmation probe implies for the model (None: too few measured streams)."""
    measured: list[float] = []
    replayed: list[list[float]] = [[] for _ in SCALES]
    blocks: list[list[int]] = []
    field_name = METRIC_OF_OUTCOME[metric]
    for streams in attempts:
        mine = [streams[i] for i in sorted(range(len(streams)), key=lambda i: streams[i].intended)]
        mine = [s for s in mine if s.measured]
        if len(mine) < BLOCKS:
            continue
        first = len(measured)
        measured.extend(s.value(metric) for s in mine)
        for k, scale in enumerate(SCALES):
            replayed[k].extend(getattr(o, field_name) for o in replay(engine, _scaled(streams, scale)))
        blocks.extend([first + i for i in block] for block in window_blocks(mine, metric))
    if len(measured) < MIN_STREAMS:
        return None
    every = list(range(len(measured)))
    point = _crossing(measured, replayed, every, q)
    rng = random.Random(seed)
    boots = sorted(
        _crossing(measured, replayed, [i for _ in blocks for i in blocks[rng.randrange(len(blocks))]], q)
        for _ in range(RESAMPLES)
    )
    tail = (1.0 - LEVEL) / 2
    s_lo, s_hi = boots[int(tail * RESAMPLES)], boots[min(RESAMPLES - 1, math.ceil((1 - tail) * RESAMPLES) - 1)]
    at_one = replayed[SCALES.index(1.0)]
    sparse, dense = quantile(replayed[0], q), quantile(replayed[-1], q)
    return WindowMatch(metric, quantile(measured, q), quantile(at_one, q), 1.0 / point, 1.0 / s_hi, 1.0 / s_lo,
                       open_low=s_hi >= SCALES[-1], open_high=s_lo <= SCALES[0],
                       load_spread=dense / sparse if sparse > 0 else 1.0)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Confirmation:
    """One confirmation probe and what it says of the model."""

    rate: float
    side: Side
    """``below``: under the interval, where the model says the SLO holds; ``above``: over it, where it fails."""
    verdict: str
    """The probe's measured verdict (``pass``, ``fail``, ``not_enough_data``; ``not_run`` when it could not)."""
    matches: tuple[WindowMatch, ...] = ()
    outcome: Outcome = "not_run"
    why: str = ""
    round: int = 1

    def to_json(self) -> JsonObject:
        return {"rate": self.rate, "side": self.side, "verdict": self.verdict, "outcome": self.outcome,
                "why": self.why, "round": self.round,
                "windows": [m.to_json() for m in self.matches]}  # fmt: skip


def expected_verdict(side: Side) -> str:
    return "pass" if side == "below" else "fail"


def judge(rate: float, side: Side, verdict: str, matches: Sequence[WindowMatch], claimed: tuple[float, float],
          round_: int = 1) -> Confirmation:  # fmt: skip
    """What one confirmation probe says of the model whose capacity interval, relative to its own capacity, is
    ``claimed`` (low / capacity, high / capacity): contradicted by a verdict opposite to the model's, or by a
    window whose implied capacity ratio lies wholly outside the claim; confirmed when neither happens and a
    window could be matched (or the verdict is the model's); not contradicted when nothing could tell."""
    says = "meets" if side == "below" else "fails"
    if verdict == "not_run":
        return Confirmation(rate, side, verdict, tuple(matches), "not_run",
                            f"the probe at {rate:g} req/s could not run", round_)  # fmt: skip
    opposite = "fail" if side == "below" else "pass"
    if verdict == opposite:
        why = f"the model says {rate:g} req/s {says} the SLO; the probe there measured {verdict.upper()}"
        return Confirmation(rate, side, verdict, tuple(matches), "contradicted", why, round_)
    lo_c, hi_c = claimed
    off = [m for m in matches if m.high < lo_c or m.low > hi_c]
    if off:
        m = off[0]
        why = (f"at {rate:g} req/s, {m.text()}, outside the model's own [{lo_c:.3f}, {hi_c:.3f}]")  # fmt: skip
        return Confirmation(rate, side, verdict, tuple(matches), "contradicted", why, round_)
    if matches or verdict == expected_verdict(side):
        held = "; ".join(m.text() for m in matches) or f"measured {verdict.upper()} as the model says"
        why = f"at {rate:g} req/s ({verdict.replace('_', ' ')}): {held}"
        return Confirmation(rate, side, verdict, tuple(matches), "confirmed", why, round_)
    why = (f"the probe at {rate:g} req/s decided nothing and had too few streams to match the model's tail: "
           "that end is not contradicted, not confirmed")  # fmt: skip
    return Confirmation(rate, side, verdict, tuple(matches), "not_contradicted", why, round_)


def matches_at(engine: EngineModel, probes: Sequence[Probe], q: float, metrics: Sequence[str],
               limits: Mapping[str, float]) -> tuple[WindowMatch, ...]:  # fmt: skip
    """The window matches of confirmation probes (their attempts pooled), for every limited metric whose tail is
    near its limit there (measured or modelled p99 at least half the limit) or rises with the load there
    (:data:`LOAD_SENSITIVE`): a percentile far under its limit and flat in the load does not set the capacity,
    and a model need not get it right."""
    out = []
    attempts = [a for p in probes for a in p.attempts]
    for metric in metrics:
        m = window_match(engine, attempts, q, metric)
        if m is not None and (max(m.measured, m.model) >= 0.5 * limits[metric] or m.load_spread >= LOAD_SENSITIVE):
            out.append(m)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Pooled:
    """A round's two confirmation windows matched as one: the ratio that bounds the capacity the answer states."""

    round: int
    claimed: tuple[float, float]
    matches: tuple[WindowMatch, ...]

    @property
    def excludes_claim(self) -> bool:
        lo, hi = self.claimed
        return any(m.high < lo or m.low > hi for m in self.matches)

    @property
    def span(self) -> tuple[float, float] | None:
        """The ratios every matched metric allows, hulled (None: no window matched, or one is open)."""
        if not self.matches or any(m.open_low or m.open_high for m in self.matches):
            return None
        return min(m.low for m in self.matches), max(m.high for m in self.matches)

    def text(self) -> str:
        return "; ".join(m.text() for m in self.matches) or "no limited percentile near its limit to match"

    def to_json(self) -> JsonObject:
        return {"round": self.round, "claimed": [round(c, 4) for c in self.claimed],
                "windows": [m.to_json() for m in self.matches]}  # fmt: skip


@dataclass
class ConfirmationRecord:
    """Every confirmation of one configuration's fitted model, and what they decided."""

    confirmations: list[Confirmation] = field(default_factory=list)
    pooled: list[Pooled] = field(default_factory=list)
    refitted: bool = False

    @property
    def last_pooled(self) -> Pooled | None:
        last = max((c.round for c in self.confirmations), default=0)
        return next((p for p in self.pooled if p.round == last), None)

    @property
    def latest(self) -> list[Confirmation]:
        """The confirmations of the last round run (those of the fit that answers)."""
        last = max((c.round for c in self.confirmations), default=0)
        return [c for c in self.confirmations if c.round == last]

    @property
    def contradicted(self) -> list[Confirmation]:
        """The last round's contradictions: a probe's own, or both windows' together (reported on the upper one)."""
        own = [c for c in self.latest if c.outcome == "contradicted"]
        pooled = self.last_pooled
        if own or pooled is None or not pooled.excludes_claim:
            return own
        top = max(self.latest, key=lambda c: c.rate)
        lo, hi = pooled.claimed
        why = f"both windows together: {pooled.text()}, outside the model's own [{lo:.3f}, {hi:.3f}]"
        return [replace(top, outcome="contradicted", why=why)]

    @property
    def stands(self) -> bool:
        """The model's answer stands: both ends tested in its last round, neither contradicted, and something
        measured bounds it: the windows matched, or both verdicts came out as the model says."""
        latest = self.latest
        sides = {c.side for c in latest if c.outcome in ("confirmed", "not_contradicted")}
        if not latest or self.contradicted or sides != {"below", "above"}:
            return False
        pooled = self.last_pooled
        decided = all(c.verdict == expected_verdict(c.side) for c in latest)
        return decided or (pooled is not None and pooled.span is not None)

    def summary(self) -> str:
        """One sentence: how the model fared against its confirmation probes."""
        if not self.confirmations:
            return "no confirmation probe ran"
        latest = self.latest
        if self.contradicted:
            again = max(c.round for c in self.confirmations) > 1
            lead = "contradicted again after a refit" if again else "contradicted"
            return f"{lead}: {self.contradicted[0].why}"
        not_run = [c for c in latest if c.outcome == "not_run"]
        if not_run:
            return not_run[0].why
        parts = [f"{c.rate:g} req/s {c.outcome.replace('_', ' ')} ({c.verdict.replace('_', ' ')})" for c in latest]
        lead = "after a refit, " if self.refitted else ""
        text = f"{lead}tested outside its interval: " + "; ".join(parts)
        pooled = self.last_pooled
        if pooled is not None and pooled.matches:
            text += f"; both windows: {pooled.text()}"
        if not self.stands:
            text += "; nothing measured bounds it (no window matched, no verdict decided)"
        return text

    def to_json(self) -> JsonObject:
        return {"stands": self.stands, "refitted": self.refitted, "summary": self.summary(),
                "probes": [c.to_json() for c in self.confirmations],
                "pooled": [p.to_json() for p in self.pooled]}  # fmt: skip


ConfirmationRun = Callable[[float, int], tuple[str, Probe | None]]
"""Runs a confirmation probe at a rate, with this many confirmation probes left to run counting it (so that it
can leave them time: :func:`length_within`): its verdict and its data as the model sees them (None: no data);
raises :class:`~tailgate.slo.search.SearchStopped` when no time is left for it."""


def confirm_answer(
    fitted: ModelAnswer,
    run: ConfirmationRun,
    refit: Callable[[], ModelAnswer | None],
    q: float,
    limits: Mapping[str, float],
    log: Callable[[str], None] = lambda line: None,
    rounds: int = ROUNDS,
) -> tuple[ModelAnswer, ConfirmationRecord]:
    """Test a fitted answer just outside its interval (the upper end first: there a too pessimistic model, the
    commoner error, is caught by one probe); after a contradiction refit once on everything measured and test
    the refit at its own ends. Returns the last answer tested and every confirmation; whether the answer stands
    is the record's to say (:func:`settle_confirmed` applies it)."""
    record = ConfirmationRecord()
    for round_ in range(1, rounds + 1):
        if fitted.fit is None or fitted.low is None or fitted.high is None or not fitted.usable:
            break
        below, above = confirmation_rates(fitted.low, fitted.high)
        cap = fitted.capacity or (fitted.low + fitted.high) / 2
        claimed = (fitted.low / cap, fitted.high / cap)
        log(f"testing the fitted model (capacity ~{cap:.3g} req/s, interval [{fitted.low:.3g}, {fitted.high:.3g}]) "
            f"at {above:g} and {below:g} req/s, on probes it was not fitted to")  # fmt: skip
        sides: tuple[tuple[float, Side], ...] = ((above, "above"), (below, "below"))
        windows: list[Probe] = []
        for k, (rate, side) in enumerate(sides):
            try:
                verdict, probe = run(rate, len(sides) - k)
            except SearchStopped as e:
                c = replace(judge(rate, side, "not_run", (), claimed, round_),
                            why=f"no time for a probe at {rate:g} req/s: {e}")  # fmt: skip
            else:
                matches = () if probe is None else matches_at(fitted.fit.engine, [probe], q, list(limits), limits)
                c = judge(rate, side, verdict, matches, claimed, round_)
                windows.extend([probe] if probe is not None else [])
            record.confirmations.append(c)
            log(f"  confirmation at {rate:g} req/s: {c.outcome.replace('_', ' ')}: {c.why}")
            if c.outcome in ("contradicted", "not_run"):
                break
        else:
            if len(windows) > 1:  # both windows at once: twice the blocks for one ratio
                pooled = matches_at(fitted.fit.engine, windows, q, list(limits), limits)
                record.pooled.append(Pooled(round_, claimed, pooled))
                log(f"  both windows: {record.pooled[-1].text()}")
        if not record.contradicted or round_ == rounds:
            break
        again = refit()
        if again is None:
            break
        record.refitted = True
        fitted = again
        log(f"refitted on every probe, the confirmation probes included: capacity "
            f"{'~' + format(fitted.capacity, '.3g') if fitted.capacity else 'none'}"
            f"{'' if fitted.usable else ' (' + fitted.why + ')'}")  # fmt: skip
    return fitted, record


def settle_confirmed(
    answer: ModelAnswer, record: ConfirmationRecord, measured: tuple[float | None, float | None]
) -> ModelAnswer:
    """The fitted answer after its confirmation: it narrows the measured bracket (now with the confirmation
    probes' verdicts) only when it stands, and says why not otherwise; the answer is then the measured bracket."""
    answer.confirmation = record
    lo_m, hi_m = measured
    if not record.stands:
        lead = "refused" if record.contradicted else "not confirmed"
        answer.usable, answer.bracket = False, None
        answer.why = f"{lead}: {record.summary()}; the answer is the measured bracket alone"
        return answer
    low, high = answer.low, answer.high
    if low is None or high is None:
        answer.usable, answer.bracket, answer.why = False, None, "no interval to confirm"
        return answer
    pooled = record.last_pooled
    span = pooled.span if pooled is not None else None
    if span is not None and answer.capacity:
        # the interval stated is what the model claims and what its windows allow together, whichever is wider
        low, high = min(low, answer.capacity * span[0]), max(high, answer.capacity * span[1])
        answer.low, answer.high = low, high
    if lo_m is not None and high < lo_m:
        answer.usable, answer.bracket = False, None
        answer.why = f"its interval ends under the measured pass at {lo_m:g} req/s"
        return answer
    if hi_m is not None and low >= hi_m:
        answer.usable, answer.bracket = False, None
        answer.why = f"its interval starts over the measured failure at {hi_m:g} req/s"
        return answer
    answer.usable = True
    answer.bracket = (max(low, lo_m or 0.0), min(high, hi_m if hi_m is not None else math.inf))
    answer.why = f"every check held; {record.summary()}"
    return answer
