"""Verdicts on one probe: distribution-free bounds on each tail, a steady-state test, three outcomes.

A probe passes only when (1) the server sustained the offered rate over it: completions kept up with
arrivals in an attempt long enough to tell, and neither TTFT from the intended send nor the waiting queue trends
upward in any attempt (Mann-Kendall on batch means, after an MSER-5 cut of the start-up transient), and (2) every
percentile limit holds at the stated confidence by a one-sided bound on the share of requests over it, with the
counts shrunk by the design effect of time blocks and runs (see :mod:`tailgate.tailbounds`). A probe whose data
cannot support either answer is ``not_enough_data``, never a pass; a burst the server absorbed shows up as a trend
or as completions lagging arrivals, never as a pass. Falling behind fails a probe on its own only in two samples of
the workload: one sample's queue may be an episode a stable server drains after the window.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

from tailgate.jsontypes import (
    JsonMapping,
    JsonObject,
    json_extra,
    json_int,
    json_number,
    json_opt_int,
    json_opt_number,
    json_str,
)
from tailgate.records import RequestRecord
from tailgate.slo.attempt import ProbeAttempt
from tailgate.slo.spec import METRIC_FIELDS, Limit
from tailgate.stats import tail
from tailgate.tailbounds import FAIL, NOT_ENOUGH, PASS, Trend, check_tail, share_lower, share_upper, upward_trend

TREND_ALPHA = 0.01
"""Level of the upward-trend tests: a false trend fails a probe that held, so it is kept strict."""
TREND_MATERIAL = 0.5
"""Share of the tightest TTFT or total limit a TTFT trend must rise by within an attempt to fail it."""
KEEP_UP = 0.9
"""Completions inside the arrival window over arrivals inside it, below which the server fell behind."""
SAMPLES_BEHIND = 2
"""Samples of the workload (attempts of different seeds) that must fall behind for the server to be shown not to
keep up: re-runs of one sample repeat its arrivals, so its queue episodes too, and count once."""
BLOCKS = 20
"""Time blocks per attempt for the design effect: requests within one block may share a stall."""


@dataclass
class Check:
    """One limit checked on one probe: point estimate, bounds at the confidence level, verdict and why."""

    key: str
    limit: float
    point: float | None
    low: float | None
    high: float | None
    n: int
    verdict: str
    """``pass``, ``fail`` or ``not_enough_data``."""
    reason: str = ""
    n_effective: float | None = None
    """n divided by the design effect of time blocks and runs (correlated requests count less)."""
    excluded: int = 0
    """Requests left out of this check (client-coalesced streams for gap limits)."""
    over: int | None = None
    """Requests over the limit: with ``n`` and ``n_effective``, what pooling across rates adds up. On the
    ``sustained`` row: the samples of the workload in which the server fell behind (None: not counted)."""
    extra: JsonObject = field(default_factory=dict, compare=False)
    """Keys another version wrote into ``slo.json``: kept, so a resumed search writes them back unchanged."""

    KEYS: ClassVar[frozenset[str]] = frozenset(
        ("key", "limit", "point", "low", "high", "n", "verdict", "reason", "n_effective", "excluded", "over")
    )

    def to_json(self) -> JsonObject:
        return {
            "key": self.key, "limit": self.limit, "point": self.point, "low": self.low, "high": self.high,
            "n": self.n, "verdict": self.verdict, "reason": self.reason, "n_effective": self.n_effective,
            "excluded": self.excluded, "over": self.over, **self.extra,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: JsonMapping, *, where: str = "") -> Check:
        return cls(
            key=json_str(data, "key", where=where), limit=json_number(data, "limit", where=where),
            point=json_opt_number(data, "point", where=where), low=json_opt_number(data, "low", where=where),
            high=json_opt_number(data, "high", where=where), n=json_int(data, "n", where=where),
            verdict=json_str(data, "verdict", where=where), reason=json_str(data, "reason", "", where=where),
            n_effective=json_opt_number(data, "n_effective", where=where),
            excluded=json_int(data, "excluded", 0, where=where), over=json_opt_int(data, "over", where=where),
            extra=json_extra(data, cls.KEYS),
        )  # fmt: skip

    @property
    def over_by(self) -> float:
        """How far the point lies over the limit, relative to it (inf: no point to tell)."""
        if self.point is None:
            return math.inf
        return (self.point - self.limit) / self.limit if self.limit > 0 else self.point


@dataclass(frozen=True, slots=True)
class AttemptSustain:
    """One attempt's evidence of keeping up, or why it cannot tell: the probe's ``sustained`` check takes its
    verdict from these and reports the lowest ``keep_up``."""

    n: int
    """Measured requests of the attempt."""
    verdict: str
    reason: str
    window_s: float | None = None
    """First to last intended send; None, like every figure below, with fewer than 20 timed requests."""
    offered_rate: float | None = None
    arrival_rate: float | None = None
    completion_rate: float | None = None
    completed_in_window: int | None = None
    arrived_in_window: int | None = None
    keep_up: float | None = None
    """Completions inside the arrival window over arrivals inside it."""
    due_keep_up: float | None = None
    """Of the requests due to end inside the window (:func:`due_keep_up`), the share that did."""
    transient_cut: int | None = None
    """Leading requests MSER-5 dropped as start-up transient before the trend tests."""
    ttft_trend: Trend | None = None
    queue_trend: Trend | None = None
    """None with fewer than 10 queue readings after the cut."""
    queue_source: str = ""
    """What the queue was read from: the server's waiting gauge, or the requests in flight in the records."""


@dataclass
class Sustain:
    """Did the server keep up with the offered rate over every attempt? With the evidence."""

    verdict: str
    reason: str
    attempts: list[AttemptSustain] = field(default_factory=list)
    samples_behind: int = 0
    """Samples of the workload (distinct seeds) in which the server fell behind."""


def error_check(errors: int, sent: int, limit: float, level: float, key: str = "errors") -> Check:
    """Errors against their limit: pass when the observed share is within it, fail when even the lower bound
    is over it, otherwise not enough data. Zero errors in n bound the rate only near 3/n, so an upper-bound
    rule would leave every probe under a 0.5% limit undecided below ~600 requests; the bounds are reported."""
    if sent <= 0:
        return Check(key, limit, None, None, None, 0, FAIL, "no requests were sent")
    alpha = 1.0 - level
    frac = errors / sent
    lo, hi = share_lower(errors, sent, alpha), share_upper(errors, sent, alpha)
    if lo > limit:
        verdict, why = FAIL, f"{errors} of {sent} errored: at least {lo:.2%} at {level:.0%}"
    elif frac > limit:
        verdict, why = NOT_ENOUGH, f"{errors} of {sent} errored: over the limit, but not beyond doubt at this n"
    else:
        verdict, why = PASS, f"{errors} of {sent} errored"
    return Check(key, limit, round(frac, 5), round(lo, 5), round(hi, 5), sent, verdict, why)


def mser5_cut(series: Sequence[float]) -> int:
    """How many leading values MSER-5 drops as start-up transient (batches of 5; at most a fifth of the series).

    Capped at a fifth: a transient longer than that is not a warm-up but a server that never settled,
    which the trend test must see rather than have cut away."""
    n5 = len(series) // 5
    if n5 < 4:
        return 0
    means = [sum(series[i * 5 : i * 5 + 5]) / 5 for i in range(n5)]
    best, best_d = math.inf, 0
    for d in range(n5 // 5 + 1):
        rest = means[d:]
        m = sum(rest) / len(rest)
        score = sum((x - m) ** 2 for x in rest) / len(rest) ** 2
        if score < best:
            best, best_d = score, d
    return best_d * 5


def _time_ordered(measured: Sequence[RequestRecord]) -> list[RequestRecord]:
    return sorted(measured, key=lambda r: r.intended_s)


def steady_part(attempt: ProbeAttempt) -> tuple[list[RequestRecord], int]:
    """The attempt's measured records in intended-send order, less the MSER-5 start-up cut; and the cut."""
    recs = _time_ordered(attempt.measured)
    cut = mser5_cut([r.ttft_from_intended_ms or 0.0 for r in recs])
    return recs[cut:], cut


def in_flight(sends: Sequence[float], ends: Sequence[float]) -> list[float]:
    """Requests in flight (sent, not yet ended) at each send, in send order: the queue a client sees."""
    order = sorted(ends)
    out = []
    for i, t in enumerate(sends):  # sends are in time order: i + 1 sent so far, of which those ended by t left
        out.append(float(i + 1 - bisect.bisect_right(order, t)))
    return out


def due_keep_up(recs: Sequence[RequestRecord], t0: float, t1: float) -> float | None:
    """Of the requests a server that keeps up would have finished inside the window, the share it did: those sent
    before its end less the time nine in ten of the first half's requests took (0: fewer than half of those ever
    ended; None: no request to tell by).

    The share of a window's arrivals that end inside it falls with the streams' length whether or not the
    server keeps up: a CPU vLLM whose 600-token streams took seconds ended 85% of a 60-s window's arrivals at 16
    req/s (94% of those due) and kept up with 17 over 4,000 requests; on another day the same 60 s looked the
    same (87%, 94% due) and 16 did not keep up. The requests that were due show a server falling far behind,
    not the window's length; a slow fall behind shows only in a longer window."""
    half = [r for r in recs if r.intended_s <= (t0 + t1) / 2]
    took = sorted(r.end_s - r.intended_s for r in half if r.end_s is not None)
    if not half:
        return None
    if len(took) < len(half) / 2:
        return 0.0
    p90 = took[min(len(took) - 1, int(0.9 * len(took)))]
    due = [r for r in recs if r.intended_s <= t1 - p90]
    if not due:
        return None
    return sum(1 for r in due if r.end_s is not None and r.end_s <= t1) / len(due)


def sustain_check(attempts: Sequence[ProbeAttempt], rate: float | None, material_ms: float = 0.0) -> Sustain:
    """Every attempt must have kept up: completions tracked arrivals, no upward trend in TTFT or the queue.

    ``material_ms``: a TTFT trend fails the probe only when its rise over the attempt is at least this much
    (half the tightest TTFT or total limit), or when completions also fell behind arrivals: near its capacity
    a queue wanders up for tens of seconds, which the rank test reads as a trend even where the tail stays far
    under the limit and completions keep up.

    A rate fails here only once :data:`SAMPLES_BEHIND` samples of the workload fell behind: a trend in one is a
    fact about its window (the queue grew), not yet about the rate; it is never a pass either, so the rate waits
    for another sample or for its percentiles to decide."""
    rows: list[AttemptSustain] = []
    for a in attempts:
        recs = _time_ordered(a.measured)
        sends = [r.intended_s for r in recs]
        ends = [r.end_s for r in recs if r.end_s is not None]
        if len(sends) < 20:
            rows.append(AttemptSustain(len(recs), NOT_ENOUGH, "fewer than 20 timed requests"))
            continue
        t0, t1 = sends[0], sends[-1]
        arrived = len(sends)
        done = sum(1 for e in ends if e <= t1)
        keep = done / arrived
        due = due_keep_up(recs, t0, t1)
        behind = due is not None and due < KEEP_UP
        ttft = [r.ttft_from_intended_ms or 0.0 for r in recs]
        cut = mser5_cut(ttft)
        trend = upward_trend(ttft[cut:], alpha=TREND_ALPHA)
        # a rise short of material counts only with completions falling behind arrivals: both together are
        # a server that does not keep up; either alone near capacity is a queue's excursion
        trend = replace(trend, trend=bool(trend.trend and (trend.rise >= material_ms or behind)))
        # the queue: the server's own waiting gauge when it was sampled, else the requests in flight at each
        # arrival, from the records themselves (waiting plus running: it grows as the waiting queue does)
        waiting = [float(w) for w in a.waiting_series if isinstance(w, (int, float))]
        source = "the waiting queue"
        if len(waiting) < 10 and len(ends) == len(sends):
            waiting, source = in_flight(sends, ends), "requests in flight"
        queue = waiting[len(waiting) * cut // max(1, len(ttft)) :]
        qtrend = upward_trend(queue, alpha=TREND_ALPHA) if len(queue) >= 10 else None
        if qtrend is not None:  # Little's law: a TTFT rise of material_ms is about rate * material_ms / 1000 more
            qmaterial = (rate or 0.0) * material_ms / 1000.0
            qtrend = replace(qtrend, trend=bool(qtrend.trend and (qtrend.rise >= qmaterial or behind)))
        rising = next((t for t in (trend, qtrend) if t is not None and t.trend), None)
        if rising is not None:
            what = "TTFT from intended" if rising is trend else source
            verdict, reason = FAIL, f"{what} trends upward (Mann-Kendall p={rising.p:g}): not sustained"
        elif keep < KEEP_UP:
            verdict = NOT_ENOUGH
            reason = (f"only {done} of {arrived} requests completed inside the arrival window ({keep:.0%}): too "
                      "short to tell a sustained rate from an absorbed burst")  # fmt: skip
        else:
            verdict, reason = PASS, f"{keep:.0%} completed inside the arrival window, no upward trend"
        span = t1 - t0
        rows.append(AttemptSustain(
            len(recs), verdict, reason, window_s=round(span, 2), offered_rate=rate,
            arrival_rate=round((arrived - 1) / span, 3) if span > 0 else None,
            completion_rate=round(done / span, 3) if span > 0 else None, completed_in_window=done,
            arrived_in_window=arrived, keep_up=round(keep, 3),
            due_keep_up=None if due is None else round(due, 3), transient_cut=cut, ttft_trend=trend,
            queue_trend=qtrend, queue_source=source,
        ))  # fmt: skip
    verdicts = [r.verdict for r in rows]
    samples_behind = {a.workload for a, r in zip(attempts, rows, strict=True) if r.verdict == FAIL}
    if len(samples_behind) >= SAMPLES_BEHIND:
        return Sustain(FAIL, next(r.reason for r in rows if r.verdict == FAIL), rows, len(samples_behind))
    if samples_behind:
        # one window of one sample cannot tell a server past its capacity from a queue episode a stable server
        # drains after the window: a CPU vLLM failed 14 req/s this way on a minute whose long prompts came close
        # together (twice, on a fresh server too), and passed 4,000 requests of another sample at 14 the same hour
        first = next(r.reason for r in rows if r.verdict == FAIL)
        return Sustain(NOT_ENOUGH, f"{first} in one sample of the workload: a second sample that falls behind too "
                                   "fails the rate (one may be an episode the server drains)", rows, 1)  # fmt: skip
    short = verdicts.count(NOT_ENOUGH)
    if PASS in verdicts:
        # an attempt too short to tell is no evidence either way (its window ended while requests the server was
        # keeping up with were still running): a longer one at the same rate that kept up settles it, where
        # requiring every attempt to pass would leave a rate whose requests outlast a tenth of the window
        # undecided however often it was extended
        if short:
            return Sustain(PASS, f"every attempt long enough to tell kept up ({short} of {len(rows)} too short)", rows)
        return Sustain(PASS, "every attempt kept up with its arrivals", rows)
    reason = next((r.reason for r in rows if r.verdict == NOT_ENOUGH), "no attempts")
    return Sustain(NOT_ENOUGH, reason, rows)


def check_probe(
    attempts: Sequence[ProbeAttempt],
    limits: Sequence[Limit],
    *,
    level: float = 0.95,
    rate: float | None = None,
    sustained: bool = True,
    sequential: bool = True,
) -> tuple[str, list[Check]]:
    """Pool the attempts of one probe and check every limit; the probe's verdict and the checks.

    Requests are grouped by (workload, time block) for the design effect: stalls that hit many requests in one
    block count once, and so does a block that every re-run of the same workload repeats. A probe stopped
    early (queue without bound, error budget spent) fails whatever its percentiles say. With ``sustained``
    the steady-state check is a ``sustained`` row of the checks. ``sequential`` (the search's way): percentile
    limits are decided by anytime-valid confidence sequences, so a probe extended until its data decide
    holds at ``level`` whatever the number of looks; False: fixed-n Clopper-Pearson.
    """
    checks: list[Check] = []
    sent = sum(a.sent - a.cancelled for a in attempts)
    errors = sum(a.errors for a in attempts)
    steady: list[tuple[int, RequestRecord]] = []
    for i, a in enumerate(attempts):
        part, _ = steady_part(a)
        steady += [(i, r) for r in part]
    spans = _spans(attempts)
    # Re-runs of one workload send the same requests at the same offsets, so the same queue build-ups
    # recur in the same blocks: a block of every run of a workload is one cluster, and a re-run adds
    # evidence only as far as the server behaved differently. Another workload's blocks are their own.
    workloads = [a.workload for a in attempts]
    for lim in limits:
        if lim.metric == "errors":
            if sent <= 0 < sum(a.sent for a in attempts):
                why = "every request sent was cut off by the early stop: none ended to count"
                checks.append(Check(lim.key, lim.limit, None, None, None, 0, NOT_ENOUGH, why))
            else:
                checks.append(error_check(errors, sent, lim.limit, level, lim.key))
            continue
        fld = METRIC_FIELDS[lim.metric]
        values: list[float] = []
        groups: list[tuple[int, int]] = []
        excluded = 0
        for i, r in steady:
            v = getattr(r, fld)
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            if lim.metric == "gap" and r.client_coalesced:
                excluded += 1  # the client merged chunks: its gaps are not a measurement of the server
                continue
            values.append(float(v))
            groups.append((workloads[i], _block(r, spans[i], lim.metric)))
        assert lim.p is not None
        c = check_tail(values, lim.p / 100.0, lim.limit, confidence=level, groups=groups, key=lim.key,
                       sequential=sequential)  # fmt: skip
        checks.append(Check(lim.key, lim.limit, _round1(c.point), _round1(c.low), _round1(c.high), c.n, c.verdict,
                            c.reason, c.n_effective, excluded, c.over))  # fmt: skip
    stopped = next((a.stopped_early for a in attempts if a.stopped_early), None)
    if stopped:
        checks.append(Check("sustained", KEEP_UP, None, None, None, sum(len(a.measured) for a in attempts),
                            FAIL, f"stopped early: {stopped}"))  # fmt: skip
    elif sustained:
        material = [lim.limit for lim in limits if lim.metric in ("ttft", "total")]
        sus = sustain_check(attempts, rate, TREND_MATERIAL * min(material) if material else 0.0)
        keep = [r.keep_up for r in sus.attempts if r.keep_up is not None]
        checks.append(Check("sustained", KEEP_UP, min(keep) if keep else None, None, None,
                            sum(r.n for r in sus.attempts), sus.verdict, sus.reason,
                            over=sus.samples_behind))  # fmt: skip
    verdicts = {c.verdict for c in checks}
    if any(a.stopped_early for a in attempts) or FAIL in verdicts:
        return FAIL, checks
    return (NOT_ENOUGH if NOT_ENOUGH in verdicts else PASS), checks


def _round1(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def _spans(attempts: Sequence[ProbeAttempt]) -> list[tuple[float, float]]:
    out = []
    for a in attempts:
        ts = [r.intended_s for r in a.measured]
        out.append((min(ts), max(ts)) if ts else (0.0, 0.0))
    return out


def _block(r: RequestRecord, span: tuple[float, float], metric: str = "ttft") -> int:
    """The time block of one request: one of :data:`BLOCKS` parts of its attempt's span of sends.

    A worst gap is placed by when it ended, not by when its request was sent: one stall sets the worst gap of
    every stream alive at that moment, and those streams were sent over a whole stream lifetime before it
    (seconds), so blocks of sends split one stall's victims over several blocks and count them as independent.
    Measured on the kept long runs (``benchmarks/results/tail-clustering.md``), the gaps' design effect by send
    with a 60-s probe's 3-s blocks was a half to a quarter of what blocks a stream long show; by the gap's end, 3-s
    blocks show it all. Blocks keep their length past the span (a gap may end after the last send)."""
    if span[1] <= span[0]:
        return 0
    t = r.worst_gap_end_s if metric == "gap" and r.worst_gap_end_s is not None else r.intended_s
    index = int((t - span[0]) / (span[1] - span[0]) * BLOCKS)
    return min(BLOCKS - 1, index) if t <= span[1] else index


def p99s(measured: Sequence[RequestRecord]) -> dict[str, float | None]:
    """TTFT, worst-gap and total p99 from the intended send, whatever the SLO limits: the table shows all three."""
    out: dict[str, float | None] = {}
    for metric, fld in METRIC_FIELDS.items():
        out[metric] = tail(measured, fld, 99)
    return out


def binding_limit(checks: Sequence[Check]) -> str | None:
    """The limit that binds: the failing (else undecided) check furthest above its limit, relative to it.

    The steady-state row binds only when no limit does: a server that fell behind names the queue."""
    for verdict in (FAIL, NOT_ENOUGH):
        cands = [c for c in checks if c.verdict == verdict and c.key != "sustained"] or [
            c for c in checks if c.verdict == verdict
        ]
        if cands:
            return max(cands, key=lambda c: c.over_by).key
    return None
