"""Window matching: what one probe's own requests say of a model's speed, free of window-to-window spread.

A model's capacity is tested on a probe it was not fitted to by replaying that probe's own arrivals and requests
through the model, the arrival times scaled from 0.7 to 1.3 times the rate, and finding where the replayed
percentile meets the measured one: a model whose capacity is right meets it near the probe's own rate; one 10% too
slow meets it only with arrivals ~10% sparser. The same requests on both sides leave no window-to-window spread to
hide behind, and a block bootstrap over time (one stall's victims kept together) gives the ratio its interval.
Used by the confirmation probes (:mod:`tailgate.slo.confirm`) and by the probe that tells the readings of an
extrapolated cost apart (:mod:`tailgate.slo.readings`).

A window's p99 rests on its tail events (a queue episode, a stall), and a bootstrap of three events cannot say how
the model does on the next one: on the CPU vLLM in float32 a 300-request window put the capacity ratio at 1.009
[1.007, 1.371], and a 4,000-request run of the same engine at 1.9 req/s found the model 15% low on its own
requests. So the ratio's interval also holds a sign-test interval of the ratios each tail event implies on its own
(distribution-free, one event one draw), and a window with too few events for that interval is open both ways.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from tailgate.jsontypes import JsonObject
from tailgate.slo.servicefit import METRIC_OF_OUTCOME, Probe, replay
from tailgate.slo.stepfit import Stream
from tailgate.verify.groundtruth.engine import EngineModel, quantile

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
TAIL_SHARE = 5.0
"""The tail whose events are counted, in units of the share over the percentile (5% for a p99): the requests in
the measured top 5% or the model's. A p99's own top 1% is a handful of requests; the next few percent came from the
same kind of episode and tell the model's error on more of them."""
EVENT_GAP_S = 1.0
"""Tail requests whose moments (the first token for TTFT, the end of the worst gap, the end for total time) are
closer than this, chained, are one event: one stall or one queue episode (``benchmarks/slo_truth_real.py``)."""


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
    events: int = 0
    """Independent tail events the interval rests on (fewer than :func:`sign_ranks` needs: open both ways)."""

    @property
    def bounds(self) -> bool:
        """The window bounds the ratio on at least one side (an interval open both ways says nothing)."""
        return not (self.open_low and self.open_high)

    def to_json(self) -> JsonObject:
        return {"metric": self.metric, "measured": round(self.measured, 1), "model": round(self.model, 1),
                "ratio": round(self.ratio, 4), "interval": [round(self.low, 4), round(self.high, 4)],
                "open_low": self.open_low, "open_high": self.open_high,
                "load_spread": round(self.load_spread, 3), "events": self.events}  # fmt: skip

    def text(self) -> str:
        head = f"{self.metric} p99 measured {self.measured:.1f} ms, model {self.model:.1f} ms on the same requests"
        need = sign_ranks_needed(LEVEL)
        if self.open_low and self.open_high and self.events < need:
            return (
                f"{head}: true capacity / model's {self.ratio:.3f}, unbounded: its tail came in {self.events} "
                f"event{'s' if self.events != 1 else ''}, {need} needed to bound the model's error on the next"
            )
        low, high = f"{self.low:.3f}", f"{self.high:.3f}"
        # an interval wholly at one end of the scan is no interval: the ratio lies there or beyond, no nearer known
        if self.open_low and high == low:
            return f"{head}: true capacity / model's <={high} (the scan's lowest end, or under it)"
        if self.open_high and high == low:
            return f"{head}: true capacity / model's >={low} (the scan's highest end, or over it)"
        lo = f"<={low}" if self.open_low else low
        hi = f">={high}" if self.open_high else high
        return f"{head}: true capacity / model's {self.ratio:.3f} [{lo}, {hi}]"


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


def sign_ranks(k: int, level: float = LEVEL) -> int | None:
    """The rank ``l`` of the sign-test interval [x_(l), x_(k+1-l)] for the median of ``k`` independent draws at
    two-sided ``level`` (None: ``k`` draws cannot give one): the largest ``l`` with P(Binomial(k, 1/2) < l) <=
    (1 - level) / 2."""
    tail, best, below = (1.0 - level) / 2.0, None, 0.0
    for rank in range(1, k // 2 + 1):
        below += math.comb(k, rank - 1) / 2.0**k  # P(Binomial(k, 1/2) <= rank - 1)
        if below > tail:
            break
        best = rank
    return best


def sign_ranks_needed(level: float = LEVEL) -> int:
    """The fewest independent draws a sign-test interval at ``level`` needs (7 at 97.5%)."""
    return next(k for k in range(1, 64) if sign_ranks(k, level) is not None)


def tail_events(streams: Sequence[Stream], measured: Sequence[float], model: Sequence[float], metric: str,
                q: float) -> list[list[int]]:  # fmt: skip
    """The tail of one window, measured or modelled (:data:`TAIL_SHARE`), grouped into events by when each request's
    figure was set (:data:`EVENT_GAP_S`): indices into ``streams``, the window's measured streams."""
    n = len(streams)
    keep = max(1, math.ceil(round(TAIL_SHARE * (1.0 - q) * n, 6)))  # 5 x 0.01 x 100 is 5.000000000000004
    top = {i for values in (measured, model) for i in sorted(range(n), key=lambda i: -values[i])[:keep]}

    def when(i: int) -> float:
        s = streams[i]
        if metric == "gap":
            return s.gap_end if s.gap_end > 0 else s.end
        return s.first if metric == "ttft" else s.end

    tail = sorted(top, key=when)
    events: list[list[int]] = []
    for i in tail:
        if not events or when(i) - when(events[-1][-1]) >= EVENT_GAP_S:
            events.append([])
        events[-1].append(i)
    return events


def _event_scales(measured: Sequence[float], replayed: Sequence[Sequence[float]],
                  events: Sequence[Sequence[int]]) -> list[float]:  # fmt: skip
    """Each event's own crossing: the scale where the model's worst figure over the event's requests meets the
    measured worst (clamped to the scan)."""
    return [_crossing(measured, replayed, event, 1.0) for event in events]


def window_match(engine: EngineModel, attempts: Sequence[Sequence[Stream]], q: float, metric: str,
                 *, seed: int = 1) -> WindowMatch | None:  # fmt: skip
    """The capacity ratio one confirmation probe implies for the model (None: too few measured streams).

    The interval is the hull of two: the block bootstrap of the p99's crossing (the requests this window drew) and
    the sign-test interval of its tail events' own crossings (the model's error from one event to the next)."""
    measured: list[float] = []
    replayed: list[list[float]] = [[] for _ in SCALES]
    blocks: list[list[int]] = []
    events: list[list[int]] = []
    field_name = METRIC_OF_OUTCOME[metric]
    one = SCALES.index(1.0)
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
        own = tail_events(mine, measured[first:], replayed[one][first:], metric, q)
        events.extend([first + i for i in event] for event in own)
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
    scales = sorted(_event_scales(measured, replayed, events))
    rank = sign_ranks(len(scales))
    if rank is None:
        s_lo, s_hi = SCALES[0], SCALES[-1]
    else:
        s_lo, s_hi = min(s_lo, scales[rank - 1]), max(s_hi, scales[len(scales) - rank])
    sparse, dense = quantile(replayed[0], q), quantile(replayed[-1], q)
    return WindowMatch(metric, quantile(measured, q), quantile(replayed[one], q), 1.0 / point, 1.0 / s_hi, 1.0 / s_lo,
                       open_low=s_hi >= SCALES[-1], open_high=s_lo <= SCALES[0],
                       load_spread=dense / sparse if sparse > 0 else 1.0, events=len(scales))  # fmt: skip


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
