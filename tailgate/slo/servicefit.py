"""The server's step loop fitted to its probes' own streams, and replayed on their own arrivals.

Each candidate set of costs (:func:`tailgate.slo.stepfit.fit_costs`) is tried with every slot count and prefill
policy worth trying; the one whose replay of every probe comes nearest to what was measured on the same requests
(the body of each limited metric's distribution and its limited percentile, over the probes not overloaded) is
the fitted engine. :mod:`tailgate.slo.replay` simulates it for a capacity and checks it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from tailgate.slo.attempt import ProbeAttempt
from tailgate.slo.stepfit import Costs, Stream, fit_costs, max_concurrency, stall_rows, streams_of
from tailgate.slo.ttftnoise import lone_delays
from tailgate.slo.verdict import Check
from tailgate.verify.groundtruth.engine import EngineModel, Outcome, quantile, simulate

CHUNK_CHOICES = (0, 512, 2048, 8192)
"""Prefill policies tried: whole prompts in one step (0), or chunks of this many prompt tokens a step."""
UNLIMITED_SLOTS = 4096
"""The slot count of a model whose probes never filled the engine: admission never waits."""
SLOTS_MARGIN = 0.0025
"""Per replayed percentile, the squared log error a slot count must save over unlimited admission (5% each)."""
PREFILL_FACTORS = (0.7, 0.8, 0.9, 1.12, 1.25, 1.4)
"""Multiples of the fitted prefill cost tried by replaying the probes."""
REPLAY_TOLERANCE = 0.15
"""A replayed percentile further than this (relative) from the measured one, and outside its interval, fails."""
NOISE_REPLAYS = 5
"""Draws of a noisy engine pooled into each probe's replayed percentile."""
METRIC_OF_OUTCOME = {"ttft": "ttft_ms", "gap": "worst_gap_ms", "total": "total_ms"}


STEP_SUPPORT = 3
"""Steps at least this large the probes must have measured for a step size to count as measured."""


def measured_step_tokens(probes: Sequence[Probe]) -> int:
    """The prompt tokens of the largest step the probes measured, taken as the :data:`STEP_SUPPORT`-th largest of
    the steps that emitted first tokens and stalled a running stream (0: fewer such steps): one outlier is a
    step the fit barely weighs."""
    sizes = sorted(int(t) for p in probes for a in p.attempts for *_, t in stall_rows(a))
    return sizes[-STEP_SUPPORT] if len(sizes) >= STEP_SUPPORT else 0


def prefill_choices(knobs: Mapping[str, str]) -> tuple[int, ...]:
    """The prefill policies (:data:`CHUNK_CHOICES`' terms) a server started with these scheduler knobs can have.

    Below the capacity the probes' streams rarely tell them apart: two long prompts meet in one step too seldom
    for a replay to see it (on an H100 at 5 req/s whole prompts and an 8,192-token budget replayed alike), while
    past it the difference is the capacity itself: a chunked step never prefills more than its budget, an
    unchunked one every prompt waiting. What the server was told is then the better witness: chunked off leaves
    whole prompts; chunked on, the declared budget (and the long-prompt threshold under it), or, undeclared, the
    engines' defaults; nothing declared, every policy, the replay choosing."""
    budget = int(knobs["max-num-batched-tokens"]) if "max-num-batched-tokens" in knobs else None
    chunked = knobs.get("chunked")
    if chunked == "off":
        return (0,)
    if chunked != "on":
        return tuple(sorted({*CHUNK_CHOICES, *([budget] if budget else [])}))
    if budget is None:
        return tuple(c for c in CHUNK_CHOICES if c)
    threshold = int(knobs.get("long-prefill-token-threshold", budget))
    return tuple(sorted({budget, min(budget, threshold)}))


@dataclass
class Probe:
    """One rate's attempts for the model: each attempt's streams, and the measured check of every limit."""

    rate: float
    attempts: list[list[Stream]]
    checks: dict[str, Check] = field(default_factory=dict)
    preempted: bool = False
    kv_capacity_tokens: int | None = None
    """The server's KV pool in tokens as it stated it (None: not stated)."""


def probes_of(
    attempts_by_rate: Mapping[float, Sequence[ProbeAttempt]],
    checks_by_rate: Mapping[float, Sequence[Check]],
) -> list[Probe]:
    """The model's view of a search: every rate's attempts (as :func:`tailgate.slo.check_probe` takes them, with
    ``records``, every record of the attempt) and its latest checks. An attempt the early stop cut short is left
    out: its cancelled streams were running, and neither the fit nor the replay can see them."""
    out = []
    for rate, attempts in sorted(attempts_by_rate.items()):
        if rate not in checks_by_rate:
            continue
        full = [a for a in attempts if not a.stopped_early and a.records]
        preempted = any(a.summary is not None and (a.summary.preemptions_delta or 0) > 0 for a in attempts)
        streams = [streams_of(a.records, {r.trace_id for r in a.measured}) for a in full]
        if streams:
            checks = {c.key: c for c in checks_by_rate[rate]}
            pools = [a.kv_capacity_tokens for a in attempts if a.kv_capacity_tokens]
            out.append(Probe(rate, streams, checks, preempted, min(pools) if pools else None))
    return out


def replay(engine: EngineModel, streams: Sequence[Stream]) -> list[Outcome]:
    """What the engine gives the measured streams when it is sent every stream of the attempt, at its times."""
    if not streams:
        return []
    t0 = min(s.intended for s in streams)
    order = sorted(range(len(streams)), key=lambda i: streams[i].intended)
    arrivals = [
        (round((streams[i].intended - t0) * 1e9) + k, streams[i].prompt, streams[i].tokens) for k, i in enumerate(order)
    ]  # fmt: skip  (+k: distinct times keep the order)
    outs = simulate(engine, arrivals)
    by_arrival = {o.arrival_ns: o for o in outs}
    return [by_arrival[a[0]] for a, i in zip(arrivals, order, strict=True) if streams[i].measured]


@dataclass
class ReplayRow:
    rate: float
    key: str
    measured: float
    model: float
    low: float | None
    high: float | None
    inside: bool


OVERLOADED = 1.5
"""A probe measured past this many times a limit is overloaded: only its limited percentile, not the body of its
distribution, weighs in the choice of costs."""
SCORE_QUANTILES = (0.5, 0.9, 0.95)
"""Quantiles beside the limited one that choose among candidate costs: a p99 of worst gaps or TTFT near a capacity
rests on a few rare events (two long prompts in one step), while the body of the distribution pins the costs of
the common steps (one long prefill beside the decodes) that decide how often the rare ones happen."""


def replay_rows(
    engine: EngineModel, probes: Sequence[Probe], q: float, metrics: Sequence[str] = ("ttft",)
) -> list[ReplayRow]:
    """Each probe's percentile of every limited metric, measured and replayed on the probe's own arrivals: inside
    the probe's interval, or within :data:`REPLAY_TOLERANCE` of the measured value."""
    return replay_fit(engine, probes, q, metrics)[0]


BIAS_PROBES = 5
"""A model on the same side of the measured percentile at this many probes or more, by at least
:data:`BIAS_SHARE` on average, is systematically off (a sign test: 1 in 16 by chance for five)."""
BIAS_SHARE = 0.05


def systematic_bias(replay: Sequence[ReplayRow]) -> tuple[str, float, int] | None:
    """(percentile key, mean relative error, probes) of the first limit whose replay is on one side of the measured
    percentile at every probe, by :data:`BIAS_SHARE` or more on average; None when no limit's is."""
    for key in sorted({r.key for r in replay}):
        errs = [(r.model - r.measured) / r.measured for r in replay if r.key == key and r.measured > 0]
        if len(errs) >= BIAS_PROBES and (all(e < 0 for e in errs) or all(e > 0 for e in errs)):
            mean = statistics.fmean(errs)
            if abs(mean) >= BIAS_SHARE:
                return key, mean, len(errs)
    return None


def replay_fit(
    engine: EngineModel,
    probes: Sequence[Probe],
    q: float,
    metrics: Sequence[str] = ("ttft",),
    limits: Mapping[str, float] | None = None,
) -> tuple[list[ReplayRow], float]:
    """:func:`replay_rows`, and how far the replay is from what was measured: the mean squared log ratio over
    :data:`SCORE_QUANTILES` and ``q``, summed over the rows (one simulation serves both). With ``limits``, a probe
    measured past :data:`OVERLOADED` times a limit counts by its limited percentile alone: the body of an overloaded
    probe is a queue (a front end's as much as the engine's) far from the capacity the costs must answer, while its
    tail still shows where admission waits."""
    rows = []
    scores: list[tuple[float, str, float, float, float]] = []
    # a noisy engine's percentile on the probe's arrivals, not one draw's: a p99 of 200 lies on two requests
    engines = [replace(engine, noise_seed=k) for k in range(NOISE_REPLAYS)] if engine.frontend_noise else [engine]
    levels = (*SCORE_QUANTILES, q)
    for p in probes:
        if sum(1 for a in p.attempts for s in a if s.measured) < 20:
            continue
        model = [o for e in engines for a in p.attempts for o in replay(e, a)]
        for metric in metrics:
            measured = [s.value(metric) for a in p.attempts for s in a if s.measured]
            replayed = [getattr(o, METRIC_OF_OUTCOME[metric]) for o in model]
            m = quantile(measured, q)
            r = quantile(replayed, q)
            key = f"{metric}_p{q * 100:g}"
            chk = p.checks.get(key)
            low, high = (None, None) if chk is None else (chk.low, chk.high)
            within = (low is not None or high is not None) and (low is None or r >= low) and (high is None or r <= high)
            close = abs(r - m) <= REPLAY_TOLERANCE * max(m, 1.0)
            rows.append(ReplayRow(p.rate, key, round(m, 1), round(r, 1), low, high, within or close))
            terms = [math.log(max(quantile(replayed, v), 1.0) / max(quantile(measured, v), 1.0)) ** 2 for v in levels]
            scores.append((p.rate, metric, m, statistics.fmean(terms), terms[-1]))
    overloaded = {
        rate for rate, metric, m, *_ in scores if limits and metric in limits and m > OVERLOADED * limits[metric]
    }
    return rows, sum(tail if rate in overloaded else whole for rate, _, _, whole, tail in scores)


@dataclass
class ServiceFit:
    """The engine fitted to a server's own streams, and how well it replays what was measured."""

    engine: EngineModel
    slots_reached: bool
    """The probes filled the engine (its slot count is measured); else admission is taken as never waiting."""
    streams: int
    replay: list[ReplayRow]

    alternatives: list[tuple[str, EngineModel]] = field(default_factory=list)
    """Engines of another front end that replay the probes about as well (within :data:`SLOTS_MARGIN` a row): the
    probes cannot rule them out, so the answer's interval spans their capacities too."""

    @property
    def consistent(self) -> bool:
        return bool(self.replay) and all(r.inside for r in self.replay)


def fit_service(
    probes: Sequence[Probe],
    q: float = 0.99,
    metrics: Sequence[str] = ("ttft",),
    limits: Mapping[str, float] | None = None,
    chunks: Sequence[int] = CHUNK_CHOICES,
    *,
    unbiased: bool = False,
) -> ServiceFit | None:
    """Fit the step loop to every probe's streams: of the candidate costs (:func:`fit_costs`), each with the slot
    count and prefill policy (of ``chunks``: :func:`prefill_choices`) that replay it best and its prefill cost
    calibrated, the one that replays best. ``unbiased``: of the fits whose replay is not on one side of every
    probe (:func:`systematic_bias`), wherever there is one, each slot count tried as a candidate of its own."""
    streams = sum(len(a) for p in probes for a in p.attempts)
    peak = max((max_concurrency(a) for p in probes for a in p.attempts), default=0)
    pools = [p.kv_capacity_tokens for p in probes if p.kv_capacity_tokens]
    kv = min(pools) if pools else 0
    fits: list[tuple[float, ServiceFit]] = []
    for cost in fit_costs([p.attempts for p in sorted(probes, key=lambda p: p.rate)]):
        found_fits = _policy(cost, peak, probes, q, metrics, streams, kv, limits, chunks)
        for found in found_fits if unbiased else found_fits[:1]:
            tried = _calibrated(found, probes, q, metrics, limits, unbiased=unbiased)
            if tried is not None:
                fits.append(tried)
    if not fits:
        return None
    # a fit whose replay lies on one side of what was measured at every probe is off by more than its noise, however
    # small its score (asked for where the best score's model was refused for it: :func:`replay.model_answer`)
    both_sides = [f for f in fits if systematic_bias(f[1].replay) is None] if unbiased else []
    best = min(both_sides or fits, key=lambda f: f[0])
    noisy = _with_noise(best, probes, q, metrics, limits, unbiased=unbiased)
    return _mechanisms(noisy, probes, q, metrics, limits, unbiased=unbiased)


def _with_noise(
    best: tuple[float, ServiceFit],
    probes: Sequence[Probe],
    q: float,
    metrics: Sequence[str],
    limits: Mapping[str, float] | None,
    *,
    unbiased: bool = False,
) -> tuple[float, ServiceFit]:
    """The fitted engine with the spread of lone requests' TTFT (:mod:`tailgate.slo.ttftnoise`), where replaying
    the probes with it comes nearer to what was measured; else as it was."""
    score, fit = best
    delays = lone_delays(fit.engine, probes)
    if not delays:
        return best
    engine = replace(fit.engine, frontend_noise=delays)
    rep, fit_score = replay_fit(engine, probes, q, metrics, limits)
    tried = fit_score + SLOTS_MARGIN * len(rep)
    # a lower score is not worth a replay that is off to one side at every probe
    biased = unbiased and systematic_bias(rep) is not None and systematic_bias(fit.replay) is None
    if not rep or tried >= score or biased:
        return best
    return tried, ServiceFit(engine, fit.slots_reached, fit.streams, rep)


def _policy(cost: Costs, peak: int, probes: Sequence[Probe], q: float, metrics: Sequence[str],
            streams: int, kv: int = 0, limits: Mapping[str, float] | None = None,
            chunks: Sequence[int] = CHUNK_CHOICES) -> list[tuple[float, ServiceFit]]:  # fmt: skip
    """For each slot count (the peak seen, and unlimited), the prefill policy that replays the probes best with
    these costs, and its score; the better first. ``kv``: the server's KV pool in tokens (0: unknown), which admits
    and preempts as the server's does."""
    best: dict[int, tuple[float, ServiceFit]] = {}
    # unlimited admission first: a slot count is taken only when replaying it is clearly better (a limit the
    # probes never reached replays the same, and would cap the simulated capacity at a concurrency merely seen)
    for slots in sorted({max(1, peak), UNLIMITED_SLOTS}, reverse=True):
        for chunk in chunks:
            engine = EngineModel(
                slots=slots, step_ms=cost.step, step_ms_per_seq=cost.per_seq, prefill_ms_per_token=cost.prefill,
                prefill_ms_per_token_ctx=cost.ctx, prefill_ms_per_token_step=cost.batch,
                step_ms_per_kv_ktoken=cost.kv, frontend_ms=cost.frontend, frontend_ms_per_token=cost.frontend_per_token,
                chunked=chunk > 0, chunk_tokens=chunk or 512,
                kv_capacity_tokens=kv,
            )  # fmt: skip
            rep, fit_score = replay_fit(engine, probes, q, metrics, limits)
            if not rep:
                continue
            score = fit_score + (0.0 if slots == UNLIMITED_SLOTS else SLOTS_MARGIN * len(rep))
            if slots not in best or score < best[slots][0]:
                best[slots] = (score, ServiceFit(engine, slots < UNLIMITED_SLOTS, streams, rep))
    return sorted(best.values(), key=lambda f: f[0])


def _calibrated(
    found: tuple[float, ServiceFit] | None,
    probes: Sequence[Probe],
    q: float,
    metrics: Sequence[str],
    limits: Mapping[str, float] | None = None,
    *,
    unbiased: bool = False,
) -> tuple[float, ServiceFit] | None:
    """The prefill cost is the least determined (it rides on a few long prompts per span, and a direct measure
    holds only where prompts are not chunked) and the most visible in TTFT: it is calibrated by the replay, the
    fitted value kept unless clearly worse. ``unbiased``: a cost whose replay lies on one side of every probe's
    percentile is taken only where every cost tried does (one overloaded probe's queue may score best a prefill
    cost that is short everywhere else: a lent H100 with its KV pool, 9-20% short at five probes of six)."""
    if found is None:
        return None
    fit = found[1]
    e = fit.engine
    base, ctx, batch = e.prefill_ms_per_token, e.prefill_ms_per_token_ctx, e.prefill_ms_per_token_step
    tried_fits = [found]
    for factor in PREFILL_FACTORS:
        engine = replace(e, prefill_ms_per_token=base * factor, prefill_ms_per_token_ctx=ctx * factor,
                         prefill_ms_per_token_step=batch * factor)  # fmt: skip
        rep, fit_score = replay_fit(engine, probes, q, metrics, limits)
        if rep:
            tried_fits.append(
                (fit_score + SLOTS_MARGIN * len(rep), ServiceFit(engine, fit.slots_reached, fit.streams, rep))
            )
    both_sides = [f for f in tried_fits if systematic_bias(f[1].replay) is None] if unbiased else []
    # the fitted value first among equals: another must be better to replace it
    return min(both_sides or tried_fits, key=lambda f: f[0])


def _mechanisms(
    best: tuple[float, ServiceFit],
    probes: Sequence[Probe],
    q: float,
    metrics: Sequence[str],
    limits: Mapping[str, float] | None,
    *,
    unbiased: bool = False,
) -> ServiceFit:
    """How the engine takes in requests: composing each step when the one before it starts (asynchronous
    scheduling) or at its own start, and a front end that tokenizes prompts one at a time or side by side. Both
    decide how often two long prompts share a step, the event that sets a worst-gap p99 with chunked prefill off,
    and the probes' replays seldom tell them apart: on an H200 at 10 req/s a serial front end replayed 5 such
    steps where the server made 3 and the side-by-side one 7, and the capacity moved from 8.2 to 9.5 req/s. The
    combination that replays best is taken (the fitted one unless another is better by :data:`SLOTS_MARGIN` a
    row); the other front end, where its replay is as near, is kept as an alternative the answer must span."""
    fit = best[1]
    score = replay_fit(fit.engine, probes, q, metrics, limits)[1]  # as the others are scored: no margins added
    margin = SLOTS_MARGIN * len(fit.replay)
    serial_modes = (False, True) if fit.engine.frontend_ms_per_token > 0 else (fit.engine.frontend_serial,)
    fitted = (fit.engine.frontend_serial, fit.engine.async_scheduling)
    tried: dict[tuple[bool, bool], tuple[float, ServiceFit]] = {fitted: (score, fit)}
    for serial in serial_modes:
        for sched in (False, True):
            if (serial, sched) in tried:
                continue
            engine = replace(fit.engine, frontend_serial=serial, async_scheduling=sched)
            rep, fit_score = replay_fit(engine, probes, q, metrics, limits)
            if rep:
                tried[(serial, sched)] = (fit_score, ServiceFit(engine, fit.slots_reached, fit.streams, rep))
    # the fitted combination is handicapped by the margin: another must be clearly better to replace it
    # and (unbiased) one whose replay is off to one side at every probe only where every combination's is
    both_sides = {k: v for k, v in tried.items() if systematic_bias(v[1].replay) is None} if unbiased else {}
    (serial, sched), (chosen_score, chosen) = min((both_sides or tried).items(),
                                                  key=lambda kv: kv[1][0] - margin * (kv[0] == fitted))  # fmt: skip
    other = tried.get((not serial, sched))
    if other is not None and other[0] <= chosen_score + margin:
        name = "a front end that tokenizes side by side" if serial else "a front end that tokenizes one at a time"
        chosen.alternatives = [(name, other[1].engine)]
    return chosen
