"""The server's own service, fitted and replayed: a model of the capacity that narrows the bracket when it is checked.

Near its capacity a server's TTFT tail comes in queue build-ups lasting many seconds, so a probe there carries the
evidence of a few hundred independent requests at most, and a measured bracket narrower than ~50% costs hours. The
service the server gave each request is measured much faster: every stream's inter-token time, how many streams
shared the engine at that moment and how many prompt tokens were prefilled beside it. A continuous-batching engine
(vLLM's scheduler) is a step loop: a step costs ``step_ms + step_ms_per_seq * running + prefill_ms_per_token *
prefilled`` (plus, where attention over a long prompt shows, a cost per prefilled token that grows with the prompt
before it, or, where a GPU's unchunked prefill shows it, with the tokens prefilled in the same step) and admits
waiting requests while fewer than ``slots`` run; a front end may hold a long prompt before the scheduler sees it.
The costs are fitted to the probes' own streams (:mod:`tailgate.slo.stepfit`: each stream's decode time, the TTFT
of requests that found no queue, and the stalls that running streams saw when a prompt was prefilled); the slot
count, the prefill policy (whole prompts, or chunks of 512, 2048 or 8192 tokens a step, of those the server's
knobs allow: :func:`tailgate.slo.servicefit.prefill_choices`) and the prefill cost are then chosen by replaying
every probe's own arrivals through the fitted engine and comparing the body and the limited percentile of each
metric with those measured on the same requests.

The fitted engine then predicts the steady-state percentile at any rate (pooled simulation replicates of the
workload's requests: its own generator when known, else the distinct requests measured), and so a capacity. Its
interval is the jackknife over the replicates, floored at :data:`FLOOR`. The model narrows the bracket only when
it passes its checks: its replay of every probe lies inside that probe's own distribution-free interval or close
to the measured value, no limit's replay leans one way at every probe, its interval overlaps the measured bracket,
and the server preempted nothing unless it stated its KV pool (the engine then admits and preempts by that pool,
newest first, recomputing, as vLLM does). Every figure here is labelled a model
estimate; the measured bracket is never replaced, only intersected.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from tailgate.jsontypes import JsonObject
from tailgate.load.promptsources import DEFAULT_PROMPTS
from tailgate.load.workload import make_trace
from tailgate.slo.answer import figure_text
from tailgate.slo.attempt import ProbeAttempt
from tailgate.slo.replicates import RUN_REQUESTS, T975, Replicates, capacity_of, single_runs
from tailgate.slo.servicefit import (
    BIAS_PROBES,
    CHUNK_CHOICES,
    Probe,
    ReplayRow,
    ServiceFit,
    fit_service,
    measured_step_tokens,
    systematic_bias,
)
from tailgate.slo.stepfit import streams_of
from tailgate.verify.groundtruth.engine import EngineModel


class Tested(Protocol):
    """What tested a fitted answer after its fit (:class:`tailgate.slo.confirm.ConfirmationRecord`), as the answer
    writes it."""

    def to_json(self) -> JsonObject: ...


STOP_PROBES = BIAS_PROBES
"""Probes a fitted answer must be checked against before it may end a search early."""
FLOOR = 0.04
"""Least half-width of the model's interval, relative: the fit's own error on an engine of its family, which the
replicates do not see (a prefill cost or step slope a few percent off). On the coverage benchmark's four shapes
(70 searches) the centre was within 3.7% of the truth in 95% of them, and at most 4.8% off."""
FINAL_GROWTH = 4
"""A final answer simulates this many times ``--model-requests`` per replicate; a settling check (each probe may
end the search) the number itself. Where a rare co-scheduling event sets a limit's p99 (two long prompts prefilled
in one step), the simulation's own noise is most of the interval, and the jackknife of a few replicates can miss
it: on the coverage benchmark's ``nochunk64`` engine, an engine fitted within 0.5% of every true cost gave 8.80
req/s from 8 x 10,000 requests, with an interval whose lower end (8.44) stood above the true 8.04, where 8 x 40,000
of the same engine give 8.10. Its true capacity from 8 x 10,000 came out +-5.6% to +-13.8%, from 8 x 40,000
+-4.1%."""


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """One simulated rate of the capacity search: per limited metric, the pooled percentile and its band (ms)."""

    rate: float
    bands: Mapping[str, tuple[float, float, float]]

    def to_json(self) -> JsonObject:
        return {"rate": round(self.rate, 4), **{m: [round(v, 1) for v in band] for m, band in self.bands.items()}}


@dataclass
class ModelAnswer:
    """The model's capacity with its interval, its checks, and the bracket it narrows (all model estimates)."""

    capacity: float | None
    low: float | None
    high: float | None
    replicates: list[float]
    """Each leave-one-out capacity (the jackknife of the pooled replicates)."""
    fit: ServiceFit | None
    usable: bool
    why: str
    bracket: tuple[float, float] | None = None
    """The measured bracket intersected with the model's interval: only when ``usable``."""
    workload: str = ""
    """Where the simulated requests came from."""
    curve: list[CurvePoint] = field(default_factory=list)
    """The simulated percentile against rate, per limited metric, with its band: the rates the search for the
    capacity simulated."""
    confirmation: Tested | None = None
    """The probes that tested this answer after the fit (None: not tested, as with ``--no-confirm``)."""
    simulated: tuple[int, int] | None = None
    """(replicates, simulated requests per replicate) behind the interval."""
    extrapolated: list[Extrapolated] = field(default_factory=list)
    """The capacities under the other readings the probes cannot rule out: the square prefill terms past the largest
    step measured, and the other front end."""
    own: tuple[float, float] | None = None
    """The fitted reading's own interval, before the other readings widened it (None: no other reading)."""
    runs: list[float] = field(default_factory=list)
    """The capacity each simulated run of ``run_requests`` requests shows alone
    (:func:`~tailgate.slo.replicates.single_runs`): where one validation run would put it, beside the long-run
    interval."""
    run_requests: int = 0

    def as_dict(self) -> JsonObject:
        fit = self.fit
        return {
            "label": "model estimate, not a measurement", "form": "fitted step loop, replayed",
            "capacity": _r(self.capacity), "interval": [_r(self.low), _r(self.high)],
            "leave_one_out": [_r(c) for c in self.replicates], "usable": self.usable, "why": self.why,
            "bracket": None if self.bracket is None else [_r(self.bracket[0]), _r(self.bracket[1])],
            "engine": None if fit is None else fit.engine.describe(),
            "slots_reached": None if fit is None else fit.slots_reached,
            "streams": None if fit is None else fit.streams,
            "replay": [] if fit is None else [asdict(r) for r in fit.replay],
            "curve": [p.to_json() for p in self.curve], "workload": self.workload,
            "simulated": None if self.simulated is None else {"replicates": self.simulated[0],
                                                              "requests": self.simulated[1]},
            "confirmation": None if self.confirmation is None else self.confirmation.to_json(),
            "extrapolated": [e.to_json() for e in self.extrapolated],
            "fitted_interval": None if self.own is None else [_r(self.own[0]), _r(self.own[1])],
            "single_runs": None if not self.runs else _runs_json(self.runs, self.run_requests),
        }  # fmt: skip


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _runs_json(runs: Sequence[float], requests: int) -> JsonObject:
    """The simulated runs' capacities and their middle 95% (nearest ranks; every run when there are few)."""
    s = sorted(runs)
    lo, hi = s[int(0.025 * len(s))], s[min(len(s) - 1, math.ceil(0.975 * len(s)) - 1)]
    return {"requests": requests, "runs": len(s), "middle_95": [_r(lo), _r(hi)], "capacities": [_r(c) for c in s]}


@dataclass(frozen=True)
class Workload:
    """Where each replicate's requests come from: the workload's own generator, or the distinct requests measured.

    The capacity depends on the mix as much as on the engine (one 6,000-token prompt in ten, or in nine, moves it
    by several percent), and a search's few thousand measured requests are few distinct ones (every probe's first
    attempt repeats one trace). With the generator the mix is the workload's own; with measured items each
    replicate draws from its own bootstrap resample of them, so the interval carries the mix's uncertainty."""

    items: tuple[tuple[int, int], ...] = ()
    """The distinct (prompt, output tokens) measured; empty: the seeded mix (``seeded``)."""
    seeded: bool = False

    def draw(self, k: int, requests: int, seed: int) -> list[tuple[int, int]]:
        if self.seeded:
            return [(t.prompt_tokens, t.max_tokens) for t in make_trace(requests, seed * 7919 + k)]
        rng = random.Random(seed * 7919 + k)
        resample = [self.items[rng.randrange(len(self.items))] for _ in self.items]
        return [resample[rng.randrange(len(resample))] for _ in range(requests)]

    def describe(self) -> str:
        if self.seeded:
            return "the seeded mix (70% 200->100, 20% 1000->300, 10% 6000->600 tokens)"
        return f"a bootstrap resample of the {len(self.items)} distinct requests measured, per replicate"


def workload_of(attempts_by_rate: Mapping[float, Sequence[ProbeAttempt]], trace_file: bool) -> Workload | None:
    """The seeded mix when every measured request came from it and ran to its planned length (its population is
    known); else the distinct requests measured (a trace file, other prompts, streams that stopped early)."""
    distinct: dict[tuple[int, int], tuple[int, int]] = {}
    seeded = not trace_file
    for attempts in attempts_by_rate.values():
        for a in attempts:
            for r in a.records:
                for s in streams_of([r], set()):
                    distinct[(a.workload, r.trace_id)] = (s.prompt, s.tokens)
                    if r.prompt_source != DEFAULT_PROMPTS or s.tokens != r.max_tokens:
                        seeded = False
    if not distinct:
        return None
    return Workload(seeded=True) if seeded else Workload(items=tuple(distinct.values()))


def model_answer(
    probes: Sequence[Probe],
    limits: Mapping[str, float],
    q: float,
    measured: tuple[float | None, float | None],
    *,
    workload: Workload,
    requests: int = 20000,
    replicates: int = 4,
    seed: int = 1,
    quick: bool = False,
    chunks: Sequence[int] = CHUNK_CHOICES,
) -> ModelAnswer:
    """Fit, check, and simulate: the model's capacity interval and, when it holds up, the narrowed bracket.

    ``limits``: metric (``ttft``, ``gap``, ``total``) -> ms at the quantile ``q``; ``measured``: the measured
    bracket [highest pass, lowest fail] (either end None when open); ``workload``: where each replicate's
    requests come from; ``requests``: per replicate, in a settling check (``quick``, where also a fit its own
    probes refute is not simulated: no capacity, only why); a final answer simulates :data:`FINAL_GROWTH` times
    as many; ``chunks``: the prefill policies the server can have (:func:`tailgate.slo.servicefit.prefill_choices`
    of its knobs)."""
    fit = fit_service(probes, q, list(limits), limits, chunks)
    if fit is None:
        return ModelAnswer(None, None, None, [], None, False, "too few streams of three tokens or more to fit")

    def answer_of(fitted: ServiceFit) -> ModelAnswer:
        return _answer_of(fitted, probes, limits, q, measured, workload=workload, requests=requests,
                          replicates=replicates, seed=seed, quick=quick)  # fmt: skip

    answer = answer_of(fit)
    error = systematic_error(fit.replay)
    if answer.usable or not error or answer.why != error:
        return answer
    # the costs that replayed best are off to one side at every probe, and that moves a verdict: the best of the
    # fits that replay on both sides, where there is one (a lent H100's search: 12.4 req/s refused, then 9.8 [9.4,
    # 12.3] with the truth in [9, 10.5]); where only a harmless bias came with the best score, that fit stands
    other = fit_service(probes, q, list(limits), limits, chunks, unbiased=True)
    if other is None or systematic_bias(other.replay) is not None:
        return answer
    second = answer_of(other)
    if not second.usable:
        return answer
    second.why += f" (the costs that replayed best were set aside: {error.split(': a ')[0]})"
    return second


def _answer_of(
    fit: ServiceFit,
    probes: Sequence[Probe],
    limits: Mapping[str, float],
    q: float,
    measured: tuple[float | None, float | None],
    *,
    workload: Workload,
    requests: int,
    replicates: int,
    seed: int,
    quick: bool,
) -> ModelAnswer:
    """One fitted engine checked and simulated (:func:`model_answer`)."""
    refuted = _refuted(fit, probes) if quick else ""
    if refuted:
        return ModelAnswer(None, None, None, [], fit, False, refuted)
    lo_m, hi_m = measured
    near = lo_m or (hi_m / 2 if hi_m else None) or max(p.rate for p in probes)
    size = requests if quick else FINAL_GROWTH * requests
    mixes = [workload.draw(k, size, seed) for k in range(replicates)]
    reps = Replicates(fit.engine, mixes, seed)
    cap, jack = capacity_of(reps, limits, q, near=near)
    runs = single_runs(reps, q) if cap is not None else []
    curve = [CurvePoint(r, reps.curve[r]) for r in sorted(reps.curve)]
    if cap is None or len(jack) < 2:
        return ModelAnswer(None, None, None, jack, fit, False, "the fitted engine crosses the limits at no rate tried")
    low, high = _interval(cap, jack, workload.seeded)
    # each reading at the settling size: it only widens the interval, and a final answer's four times as many
    # for every reading would triple its time
    readings = [m[:requests] for m in mixes]
    extrapolated = _extrapolations(fit, probes, readings, seed, limits, q, cap, workload.seeded)
    own = (low, high) if extrapolated else None
    low, high = min([low, *(e.low for e in extrapolated)]), max([high, *(e.high for e in extrapolated)])
    why = _unusable(fit, probes, (low, high), measured, lambda bias: bias_moves_nothing(bias, reps, limits, high))
    held = "every check held"
    bias = systematic_bias(fit.replay)
    if not why and bias is not None:
        held += f" ({systematic_error(fit.replay).split(': a ')[0]}, which moves no verdict up to {high:.3g} req/s)"
    if not why and extrapolated:
        held += f" ({extrapolation_text(extrapolated)})"
    answer = ModelAnswer(cap, low, high, jack, fit, not why, why or held, curve=curve,
                         workload=workload.describe(), simulated=(replicates, size),
                         extrapolated=extrapolated, own=own, runs=runs, run_requests=RUN_REQUESTS)  # fmt: skip
    if not why:
        answer.bracket = (max(low, lo_m or 0.0), min(high, hi_m if hi_m is not None else math.inf))
    return answer


def _interval(cap: float, jack: Sequence[float], seeded: bool) -> tuple[float, float]:
    """The 95% interval around a simulated capacity: the jackknife over its replicates, floored at :data:`FLOOR`."""
    r = len(jack)
    se = math.sqrt((r - 1) / r * sum((c - statistics.fmean(jack)) ** 2 for c in jack))
    if not seeded:
        # the mix's own error does not average out over replicates drawn from one measured sample: the spread of
        # a single replicate (the jackknife's times sqrt(r)) is its share, the simulation's noise on top
        se *= math.sqrt(r)
    half = max(T975.get(r - 1, 2.2) * se, FLOOR * cap)
    return cap - half, cap + half


@dataclass(frozen=True)
class Extrapolated:
    """The fitted engine's capacity under another reading the probes cannot rule out (the interval spans it): its
    square prefill terms past the largest step the probes measured (``step_tokens``), flat at their rate there or
    per prompt instead of per step (or the reverse); or the other front end (``step_tokens`` 0)."""

    step_tokens: int
    reading: str
    capacity: float
    low: float
    high: float
    engine: EngineModel | None = field(default=None, compare=False, repr=False)
    """The engine of this reading: its confirmation probes are matched against it."""

    def text(self) -> str:
        return f"{self.reading}: {self.capacity:.3g} [{self.low:.3g}, {self.high:.3g}] req/s"

    def to_json(self) -> JsonObject:
        return {"step_tokens": self.step_tokens, "reading": self.reading, "capacity": _r(self.capacity),
                "interval": [_r(self.low), _r(self.high)]}  # fmt: skip


def extrapolation_text(readings: Sequence[Extrapolated]) -> str:
    """Why the interval is as wide as it is: square terms read past what was measured, and front ends the probes
    could not tell apart."""
    squares = [r for r in readings if r.step_tokens]
    others = [r for r in readings if not r.step_tokens]
    parts = []
    if squares:
        parts.append(
            f"steps over {squares[0].step_tokens:,} prompt tokens were never measured, and the interval "
            f"spans the fitted square and its other readings there ({'; '.join(r.text() for r in squares)})"
        )
    if others:
        parts.append(
            f"the probes replay {' and '.join(r.reading for r in others)} about as well, and the interval "
            f"spans it too ({'; '.join(r.text() for r in others)})"
        )
    return "; ".join(parts)  # fmt: skip


def _extrapolations(
    fit: ServiceFit,
    probes: Sequence[Probe],
    mixes: Sequence[Sequence[tuple[int, int]]],
    seed: int,
    limits: Mapping[str, float],
    q: float,
    near: float,
    seeded: bool,
) -> list[Extrapolated]:
    """The capacity under every other reading of the fitted engine the probes cannot rule out: its square
    prefill terms read another way where the simulation prefills steps larger than any the probes measured, and
    the other front end where it replays the probes as well (:func:`tailgate.slo.servicefit.fit_service`'s
    alternatives; ``step_tokens`` 0). Empty: none.

    The square is fitted to the steps the probes saw, and near the capacity the steps are larger. An H100 at 5
    req/s prefilled at most one 6,000-token prompt a step; near its capacity the worst-gap p99 is the full
    8,192-token step, which the square (per step) priced at ~211 ms, its flat rate at ~179 and the long runs
    at ~186, and with the gap flat near its limit that 12% moved the capacity by a quarter. A step of two
    prompts costs the square of their sum on a GPU's unchunked prefill (the H200's paired steps) and about the
    sum of their squares where attention is per sequence: probes that measured no such step cannot say which.
    The interval spans every reading; their confirmation probes, or more probes near the capacity, narrow it."""
    engine = fit.engine
    ctx, batch = engine.prefill_ms_per_token_ctx, engine.prefill_ms_per_token_step
    measured = measured_step_tokens(probes)
    largest = engine.chunk_tokens if engine.chunked else 2 * max(p for mix in mixes for p, _ in mix)
    readings: list[tuple[int, str, EngineModel]] = []
    if (ctx or batch) and measured and largest > measured:
        readings += [
            (measured, f"flat past {measured:,} tokens", replace(engine, prefill_flat_above=measured)),
            (measured, "per prompt" if batch else "per step",
             replace(engine, prefill_ms_per_token_ctx=batch, prefill_ms_per_token_step=ctx)),
        ]  # fmt: skip
    readings += [(0, name, other) for name, other in fit.alternatives]
    out = []
    for step_tokens, reading, other in readings:
        cap, jack = capacity_of(Replicates(other, mixes, seed), limits, q, near=near)
        if cap is not None and len(jack) >= 2:
            low, high = _interval(cap, jack, seeded)
            out.append(Extrapolated(step_tokens, reading, cap, low, high, other))
    return out


def settling_answer(
    probes: Sequence[Probe],
    limits: Mapping[str, float],
    q: float,
    measured: tuple[float | None, float | None],
    narrow: Callable[[float, float], bool],
    **simulation: Any,
) -> ModelAnswer | None:
    """The fitted answer when it may end a search early, else None: it needs a measured failure above the
    capacity and :data:`STOP_PROBES` probes to be checked against (fewer cannot show a systematic error), every
    check held, and its narrowed bracket within the resolution (``narrow(low, high)``). The measured bracket is
    then what those probes gave, and the answer is labelled a model estimate as always. A quick check (the fit
    refused before any simulation, the settling size) finds the candidates; the answer that ends the search is
    the final one, simulated at its full size, and it must be narrow too."""
    if len(probes) < STOP_PROBES or measured[1] is None:
        return None
    for quick in (True, False):
        answer = model_answer(probes, limits, q, measured, quick=quick, **simulation)
        if not (answer.usable and answer.bracket is not None and narrow(*answer.bracket)):
            return None
    return answer


def systematic_error(replay: Sequence[ReplayRow]) -> str:
    """A model on one side of the measured percentile at every probe is off by more than its noise, even when each
    probe alone agrees within its interval ('' when no limit's replay is)."""
    bias = systematic_bias(replay)
    if bias is None:
        return ""
    key, mean, count = bias
    side = "under" if mean < 0 else "over"
    return (f"its replay is {side} the measured {key} at every one of {count} probes ({mean:+.0%} on average): "
            "a systematic error, not noise")  # fmt: skip


def bias_moves_nothing(
    bias: tuple[str, float, int], reps: Replicates, limits: Mapping[str, float], up_to: float
) -> bool:
    """Whether a systematic error in one limit's replay, taken out, leaves that limit on the same side at every rate
    simulated up to ``up_to``: the limit does not bind there either way, so the capacity (set by another limit)
    stands. A limit that binds, or would once corrected, moves it."""
    metric = bias[0].split("_p")[0]
    if metric not in limits:
        return False
    factor = 1.0 / (1.0 + bias[1])
    limit = limits[metric]
    for rate, by_metric in reps.curve.items():
        if rate <= up_to and metric in by_metric:
            value = by_metric[metric][0]
            if (value > limit) != (value * factor > limit):
                return False
    return True


def _unusable(fit: ServiceFit, probes: Sequence[Probe], interval: tuple[float, float],
              measured: tuple[float | None, float | None], harmless: Callable[[tuple[str, float, int]], bool],
              ) -> str:  # fmt: skip
    """Why the model may not narrow the bracket ('' when it may). ``harmless``: whether a systematic error moves no
    verdict the capacity rests on."""
    refuted = _refuted(fit, probes, harmless)
    if refuted:
        return refuted
    lo_m, hi_m = measured
    if lo_m is not None and interval[1] < lo_m:
        return f"its interval ends under the measured pass at {lo_m:g} req/s"
    if hi_m is not None and interval[0] >= hi_m:
        return f"its interval starts over the measured failure at {hi_m:g} req/s"
    return ""


def _refuted(
    fit: ServiceFit, probes: Sequence[Probe], harmless: Callable[[tuple[str, float, int]], bool] | None = None
) -> str:
    """Why the probes themselves refute the fitted engine ('' when none does): checks before any simulation, and a
    systematic error that ``harmless`` does not clear."""
    if any(p.preempted for p in probes) and not fit.engine.kv_capacity_tokens:
        return "the server preempted requests and did not state its KV pool: KV-cache pressure is not in the model"
    bad = [r for r in fit.replay if not r.inside]
    if bad:
        r = bad[0]
        return (
            f"its replay of {r.rate:g} req/s gives {r.key} {r.model:g} ms where {r.measured:g} ms was measured "
            f"(its interval [{figure_text(r.key, r.low)}, {figure_text(r.key, r.high)}])"
        )
    bias = systematic_bias(fit.replay)
    if bias is not None and harmless is not None and harmless(bias):
        return ""
    return systematic_error(fit.replay)
