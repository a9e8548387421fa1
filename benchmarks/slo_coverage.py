"""How often the SLO capacity search's bracket holds the true capacity, how wide it is, and what it costs.

Queueing shapes with a known answer (the ground-truth server's simulated engine,
``tailgate/verify/groundtruth/engine.py``, under the settings of :data:`SHAPES`): their steady-state p99s
at a Poisson rate follow from the model by a long simulation, so their capacity under an SLO is known to a
fraction of a percent. For each shape this script:

1. computes that true capacity (bisection over long simulations with common random numbers);
2. runs the search of ``tailgate slo`` (:func:`tailgate.slo.search` with the verdicts of
   :func:`tailgate.slo.check_probe`, pooling across rates and the model placing probes) many times, each
   attempt a fresh simulated run of a new sample of the workload from an empty server lasting ``--duration``
   seconds (at least ``--min-n`` requests), within ``--time-budget`` seconds of probing in virtual time;
3. prints coverage (the share of searches whose bracket [highest pass, lowest fail] holds the truth), the
   bracket's width relative to the truth (an open bracket is infinitely wide: a miss of the width target),
   the probing time per search, and the model's capacity error.

Targets: coverage at least the stated confidence; width within 15%; at most 20 minutes of probing.

``--e2e`` also runs one real search end to end: the ground-truth server with the custom engine on, driven by
``tailgate slo --server url`` through Locust, and reports whether its bracket holds the truth computed for it.

Run: ``python benchmarks/slo_coverage.py [--shape all] [--seeds 20] [--time-budget 1200] [--e2e]``.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tailgate import slo
from tailgate.load.workload import make_trace
from tailgate.slo.answer import seconds_to_decide
from tailgate.slo.confirm import (
    ConfirmationRecord,
    confirm_answer,
    length_within,
    reserve_rate,
    reserve_seconds,
    settle_confirmed,
)
from tailgate.slo.model import RateModel, binding_model
from tailgate.slo.plan import attempt_size, confirmation_seed
from tailgate.slo.replay import (
    ModelAnswer,
    Workload,
    model_answer,
    settling_answer,
    workload_of,
)
from tailgate.slo.replicates import Replicates, capacity_of
from tailgate.slo.search import lacks_only_data, over_a_limit, worth_extending
from tailgate.slo.servicefit import Probe, probes_of
from tailgate.slo.state import ProbeEntry
from tailgate.stats import measured_records
from tailgate.verify.groundtruth import start_server_process
from tailgate.verify.groundtruth.engine import EngineModel, Outcome, poisson_arrivals, simulate, true_capacity


def lengths_of(count: int, seed: int) -> list[tuple[int, int]]:
    return [(t.prompt_tokens, t.max_tokens) for t in make_trace(count, seed)]


@dataclass(frozen=True)
class FifoSlots:
    """A server outside the step loop's family: ``slots`` FIFO slots, each serving one request at a time at a
    pace of its own (every request's per-token time drawn log-normal around ``ms_per_token``, ``jitter`` its
    sigma), its prompt first at ``prefill_ms_per_token``. No step is shared, so a long prompt delays nobody
    else, and a request's speed varies as no fitted step cost can say."""

    slots: int = 4
    ms_per_token: float = 4.0
    prefill_ms_per_token: float = 0.05
    jitter: float = 0.3
    seed: int = 5

    def describe(self) -> dict[str, Any]:
        return {"kind": "fifo-slots", **asdict(self)}

    def __call__(self, arrivals: Sequence[tuple[int, int, int]]) -> list[Outcome]:
        rng = random.Random(self.seed)  # the speeds by arrival index: a probe draws a seed of its own
        free = [0] * self.slots
        out = []
        for t, prompt, tokens in sorted(arrivals):
            start = max(t, heapq.heappop(free))
            per_token = self.ms_per_token * rng.lognormvariate(0.0, self.jitter) * 1e6
            first = start + self.prefill_ms_per_token * prompt * 1e6 + per_token
            end = first + (max(1, tokens) - 1) * per_token
            heapq.heappush(free, round(end))
            out.append(Outcome(t, (first - t) / 1e6, per_token / 1e6, (end - t) / 1e6))
        return out


Server = EngineModel | FifoSlots
"""What a shape serves with: the step loop (the model's own family) or FIFO slots (outside it)."""


def served(server: Server) -> Callable[[list[tuple[int, int, int]]], list[Outcome]]:
    return partial(simulate, server) if isinstance(server, EngineModel) else server


def simulated_probe(
    model: Server, rate: float, *, seed: int, duration: float, min_n: int, warmup: int
) -> slo.ProbeAttempt:
    """One probe as ``tailgate slo`` runs it, in virtual time: an attempt's data for the verdict. FIFO slots draw
    their speeds afresh for each probe, as a real server's requests do: with one sequence for every probe, each
    search's probes would share the same few hundred speeds, and their verdicts would err together."""
    n = max(min_n, math.ceil(rate * duration))
    if isinstance(model, FifoSlots):
        model = replace(model, seed=seed)
    arrivals = poisson_arrivals(rate, lengths_of(n + warmup, seed), seed + 1)
    outs = served(model)(arrivals)
    recs = [o.record(i, a[1], a[2], rate=rate) for i, (o, a) in enumerate(zip(outs, arrivals, strict=True))]
    measured = measured_records(recs, warmup)  # the completion-order warm-up rule
    return slo.ProbeAttempt(measured, sent=len(recs), errors=0, records=recs)


SHAPES: dict[str, tuple[dict[str, Any], str]] = {
    # the engine of the ground-truth server: 32 slots, a per-step cost that grows with the batch
    "engine32": ({"slots": 32, "step_ms": 4.0, "step_ms_per_seq": 0.1, "prefill_ms_per_token": 0.01},
                 "ttft_p99<=1000ms"),
    # four slots, the step cost almost all per sequence: FIFO slots, each serving at its own pace
    "slots4": ({"slots": 4, "step_ms": 0.5, "step_ms_per_seq": 0.5, "prefill_ms_per_token": 0.005},
               "ttft_p99<=1000ms"),
    # eight slots, cheaper prefill, a tighter limit
    "slots8": ({"slots": 8, "step_ms": 1.0, "step_ms_per_seq": 0.4, "prefill_ms_per_token": 0.003},
               "ttft_p99<=500ms"),
    # batching: a step costs nearly the same for 1 or 64 sequences, so the service rate grows with the batch;
    # chunked prefill on
    "batch64": ({"slots": 64, "step_ms": 10.0, "step_ms_per_seq": 0.05, "prefill_ms_per_token": 0.01,
                 "chunked": True}, "ttft_p99<=1000ms"),
    # the H200's chunked-prefill-off mechanism, its SLO: a lone 6,000-token prefill stalls every decode ~126 ms,
    # two prefilled in one step ~246 ms, so the worst-gap p99 jumps past 200 ms where such pairs reach 1% of
    # streams, while TTFT climbs smoothly. The pairings are rare and the share over the limit grows slowly with the
    # rate (0.82% at 7.5 req/s, 1.14% at 8.4), so its truth needs many requests: 8.04 req/s (+-0.55%) by 8 x 250,000
    # (--truth-requests 250000 --truth-replicates 8, cached); 4 x 100,000 said 8.27
    "nochunk64": ({"slots": 64, "step_ms": 6.0, "step_ms_per_seq": 0.05, "prefill_ms_per_token": 0.02},
                  "ttft_p99<=300ms,gap_p99<=200ms"),
    # a GPU's chunked prefill with an 8,192-token budget whose square term (per step) is flat past 6,000 tokens: the
    # lent H100's full step cost less than the square fitted on smaller steps said, and probes far under the
    # capacity never see a full step, so the model's interval spans readings of that cost
    "flat8192": ({"slots": 4096, "step_ms": 6.0, "step_ms_per_seq": 0.17, "prefill_ms_per_token": 0.009,
                  "prefill_ms_per_token_step": 0.0037, "chunked": True, "chunk_tokens": 8192,
                  "prefill_flat_above": 6000}, "ttft_p99<=600ms,gap_p99<=195ms"),
    # the H200's chunked-prefill-off costs as fitted, behind a front end that tokenizes one prompt at a time and a
    # scheduler that composes each step as the one before starts (vLLM's): prompts sent together are spaced out,
    # so paired prefills are rarer than a side-by-side front end makes them, and the probes barely tell the two
    # apart
    "serial4096": ({"slots": 4096, "step_ms": 4.9, "step_ms_per_seq": 0.1, "prefill_ms_per_token": 0.0185,
                    "prefill_ms_per_token_step": 0.0006, "frontend_ms": 10.0, "frontend_ms_per_token": 0.0035,
                    "frontend_serial": True, "async_scheduling": True}, "ttft_p99<=300ms,gap_p99<=200ms"),
    # the CPU vLLM's costs as fitted on its own streams (2-core machine, chunks of 2,048 tokens): a prefill token
    # costs more the more of its prompt comes before it, so a 6,000-token prompt's last chunk is its dearest step
    # (41% of its TTFT, where a flat cost gives it 32%), and decoding reads every token the batch holds
    "ctx2048": ({"slots": 4096, "step_ms": 1.6, "step_ms_per_seq": 0.1, "step_ms_per_kv_ktoken": 0.057,
                 "prefill_ms_per_token": 0.0092, "prefill_ms_per_token_ctx": 0.00483, "chunked": True,
                 "chunk_tokens": 2048, "async_scheduling": True}, "ttft_p99<=4000ms,gap_p99<=2000ms"),
}  # fmt: skip
"""Queueing shapes whose capacity the benchmark knows by simulation: engine settings and the SLO."""

FIFO_SHAPES: dict[str, tuple[dict[str, Any], str]] = {
    # four FIFO slots, every request at its own pace (sigma 0.3): outside the fitted step loop's family
    "fifo4": ({"slots": 4, "ms_per_token": 4.0, "prefill_ms_per_token": 0.05, "jitter": 0.3}, "ttft_p99<=1000ms"),
    # eight slots, slower but steadier tokens, a slower prefill (a 6,000-token prompt alone takes 600 ms)
    "fifo8": ({"slots": 8, "ms_per_token": 6.0, "prefill_ms_per_token": 0.1, "jitter": 0.15}, "ttft_p99<=1000ms"),
}  # fmt: skip
"""Servers outside the model's family (FIFO slots, no shared step), whose capacity is also known by simulation."""


class Search:
    """One search as ``tailgate slo`` runs it (its search, verdicts, extensions, pooling across rates and time
    budget), each attempt a fresh simulated run of a new sample of the workload, in virtual time."""

    def __init__(self, model: Server, limits: Sequence[slo.Limit], seed: int, args: argparse.Namespace) -> None:
        self.model, self.limits, self.seed, self.args = model, limits, seed, args
        self.seconds = 0.0
        """Probing time the search would have taken on a real server: arrivals plus each attempt's overhead."""
        self.spent_at: dict[float, float] = {}
        """The same, per rate."""
        self.by_rate: dict[float, list[slo.ProbeAttempt]] = {}
        self.latest: dict[float, ProbeEntry] = {}
        self.tails = {lim.key: 1.0 - lim.p / 100.0 for lim in limits if lim.p is not None}
        self.settled: ModelAnswer | None = None
        self.settle_tried = 0
        self.reserve = self.confirms
        """Whether the search's probes leave time for the confirmation probes (not once they run)."""
        self.answer: ModelAnswer | None = None
        """The fitted answer after its confirmation (None until :meth:`run` has ended)."""
        self.confirmation: ConfirmationRecord | None = None

    def budget(self, rate: float) -> float:
        """As ``tailgate slo``: the whole budget, less two confirmation probes near the capacity's lower end so far
        while the search's own probes run."""
        a = self.args
        if not self.reserve:
            return a.time_budget
        if not self.by_rate:
            return a.time_budget
        low, high = slo.bracket(self.pooled())
        return a.time_budget - reserve_seconds(a.time_budget, duration=a.duration, n=a.min_n, warmup=a.warmup,
                                               rate=reserve_rate(low, high, rate),
                                               overhead=slo.PROBE_OVERHEAD_S)  # fmt: skip

    @property
    def confirms(self) -> bool:
        return bool(self.args.model_replicates) and not self.args.no_confirm

    def probe(self, rate: float, phase: str, length: float = 1.0) -> str:
        a = self.args
        attempts = self.by_rate.setdefault(rate, [])
        verdict, checks = "not_enough_data", []
        first = len(attempts)
        base = max(a.min_n, math.ceil(rate * a.duration))
        for k in range(first, first + 1 + a.extend):
            left = self.budget(rate) - self.seconds if a.time_budget else None
            n = attempt_size(base, k, length, rate, left, 0)  # extensions grow as tailgate slo's do
            cost = n / rate + slo.PROBE_OVERHEAD_S
            if a.time_budget and self.seconds + cost > self.budget(rate):
                if k == first:
                    raise slo.SearchStopped(f"{self.seconds:.0f} s spent")
                break
            # each attempt a new sample of the workload, as the extensions draw; a confirmation one of its own
            s = confirmation_seed(self.seed, rate, k + 1) if phase == "confirm" else self.seed + 1000 * k
            attempt = simulated_probe(self.model, rate, seed=s, duration=0, min_n=n, warmup=a.warmup)
            attempts.append(replace(attempt, workload=s))  # the seed of its trace, as tailgate slo records it
            self.seconds += cost
            self.spent_at[rate] = self.spent_at.get(rate, 0.0) + cost
            verdict, checks = slo.check_probe(attempts, self.limits, level=a.confidence, rate=rate,
                                              sequential=not a.fixed)  # fmt: skip
            if verdict != "not_enough_data":
                break
        self.latest[rate] = ProbeEntry(len(self.latest), rate, "search", verdict=verdict, checks=list(checks))
        return verdict

    def pooled(self) -> dict[float, str]:
        if self.args.no_pool:
            return {r: p.verdict for r, p in self.latest.items()}
        return slo.pooled_verdicts(list(self.latest.values()), self.tails, self.args.confidence)

    def rate_model(self) -> RateModel | None:
        limits = {lim.key: lim.limit for lim in self.limits if lim.key in self.tails}
        return binding_model(list(self.latest.values()), limits)

    def guess(self) -> float | None:
        m = None if self.args.no_model else self.rate_model()
        return None if m is None else m.capacity

    def model_inputs(self) -> tuple[list[Probe], Workload, dict[str, float], float] | None:
        a = self.args
        if not a.model_replicates:
            return None
        checks = {r: p.checks for r, p in self.latest.items()}
        probes = probes_of(self.by_rate, checks)
        workload = workload_of(self.by_rate, trace_file=a.model_mix == "measured")
        if not probes or workload is None:
            return None
        limits = {lim.metric: lim.limit for lim in self.limits if lim.p is not None}
        return probes, workload, limits, next(lim.p for lim in self.limits if lim.p is not None) / 100.0

    def settles(self) -> bool:
        """As ``tailgate slo`` asks after each probe: does the checked model meet the resolution already?"""
        a = self.args
        inputs = None if a.no_model_stop else self.model_inputs()
        if inputs is None:
            return False
        probes, workload, limits, q = inputs
        seen = sum(len(x) for x in self.by_rate.values())
        if seen == self.settle_tried:
            return False  # no new attempt since the last try
        self.settle_tried = seen
        answer = settling_answer(probes, limits, q, slo.bracket(self.pooled()),
                                 slo.Resolution.parse(a.resolution).narrow, workload=workload,
                                 requests=a.model_requests, replicates=a.model_replicates, seed=self.seed)  # fmt: skip
        self.settled = answer
        return answer is not None

    def fitted(self, out: slo.SearchOutcome) -> ModelAnswer | None:
        """The step loop fitted to the search's streams, as ``tailgate slo`` computes it at the end (after
        :meth:`run`, the answer as its confirmation left it)."""
        a = self.args
        if self.answer is not None:
            return self.answer
        if self.settled is not None:
            return self.settled
        inputs = self.model_inputs()
        if inputs is None:
            return None
        probes, workload, limits, q = inputs
        return model_answer(probes, limits, q, (out.best, out.first_fail), workload=workload,
                            requests=a.model_requests, replicates=a.model_replicates, seed=self.seed)  # fmt: skip

    def _search(self, settle: bool, max_probes: int) -> slo.SearchOutcome:
        a = self.args
        return slo.search(self.probe, start=a.start, max_rate=a.max_rate, min_rate=a.start / 8,
                          resolution=slo.Resolution.parse(a.resolution), max_probes=max_probes,
                          pooled=self.pooled, guess=self.guess,
                          settled=self.settles if settle else None,
                          on_track=self.on_track,
                          over_limit=None if a.no_over_limit else self.over_limit)  # fmt: skip

    def over_limit(self) -> list[float]:
        """As ``tailgate slo``: the undecided rates with a measured point over a limit already."""
        return [r for r, p in self.latest.items() if over_a_limit(p.verdict, p.checks)]

    def on_track(self) -> list[float]:
        """As ``tailgate slo``: the rates lacking only data that more data can decide in the budget left."""
        a = self.args
        lacking = {r: seconds_to_decide(p.checks, self.spent_at.get(r, 0.0), a.confidence)
                   for r, p in self.latest.items() if lacks_only_data(p.verdict, p.checks)}  # fmt: skip
        if not lacking:
            return []
        left = self.budget(max(lacking)) - self.seconds if a.time_budget else None
        return worth_extending(lacking, left)

    def remeasured(self, out: slo.SearchOutcome) -> slo.SearchOutcome:
        """The outcome with every probe's verdict so far, the confirmation probes' included."""
        verdicts = self.pooled()
        lo, hi = slo.bracket(verdicts)
        status = out.status
        if lo is not None and hi is not None and slo.Resolution.parse(self.args.resolution).narrow(lo, hi):
            status = "bracketed"
        return replace(out, best=lo, first_fail=hi, verdicts=verdicts, status=status)

    def run(self) -> slo.SearchOutcome:
        """As ``tailgate slo`` runs a configuration: the search, then the fitted answer's confirmation, then
        (when the model that ended the search early does not stand) the search again with the budget left."""
        out = self._search(settle=True, max_probes=self.args.max_probes)
        fitted = self.fitted(out)
        if out.status == "time_budget" and self.reserve and (fitted is None or not fitted.usable):
            self.reserve = False  # no model to confirm: the time kept for it goes on measuring
            more = self._search(settle=False, max_probes=max(0, self.args.max_probes - len(out.steps)))
            out = replace(more, steps=[*out.steps, *more.steps])
            if more.steps:
                self.settled = None
                fitted = self.fitted(out)
        if fitted is None or not fitted.usable or not self.confirms:
            self.answer = fitted
            return out
        self.reserve = False
        inputs = self.model_inputs()
        assert inputs is not None
        _, _, limits, q = inputs

        def run(rate: float, left: int, kept: int) -> tuple[str, Probe | None]:
            a = self.args
            remaining = a.time_budget - self.seconds if a.time_budget else math.inf
            n = max(a.min_n, math.ceil(rate * a.duration))
            length = length_within(remaining, left, n, 0, rate, slo.PROBE_OVERHEAD_S, kept)
            if length is None:
                raise slo.SearchStopped(f"{remaining:.0f} s of the budget left")
            verdict = self.probe(rate, "confirm", length)
            probes = probes_of({rate: self.by_rate[rate]}, {rate: self.latest[rate].checks})
            return verdict, probes[0] if probes else None

        def refit() -> ModelAnswer | None:
            self.settled = None
            return self.fitted(self.remeasured(out))

        log = (lambda line: print(f"    {line}", flush=True)) if self.args.log_confirmation else (lambda line: None)
        fitted, record = confirm_answer(fitted, run, refit, q, limits, log)
        out = self.remeasured(out)
        self.answer = settle_confirmed(fitted, record, (out.best, out.first_fail))
        self.confirmation = record
        if not record.stands and out.status in ("settled", "time_budget"):
            ran = len([s for s in out.steps])
            more = self._search(settle=False, max_probes=max(0, self.args.max_probes - ran))
            out = replace(more, steps=[*out.steps, *more.steps])
        return out


TRUTH_CACHE = Path(__file__).resolve().parent / "results" / "slo-truth.json"
"""True capacities computed before, by engine, limits and simulation size: minutes each on two cores."""


def pooled_truth(model: Server, limit_ms: dict[str, float], q: float, requests: int, replicates: int) -> float:
    """The steady-state capacity of ``model``: ``replicates`` independent runs of ``requests`` of the seeded mix
    each, their counts over the limits pooled at every rate, bisected to 0.2%.

    One run's p99 near the capacity is skewed by rare queue build-ups: a single 40,000-request run put engine32's
    capacity 3% above what five times as many requests say. Cached in :data:`TRUTH_CACHE`."""
    key = json.dumps([model.describe(), limit_ms, q, requests, replicates], sort_keys=True)
    cache = json.loads(TRUTH_CACHE.read_text()) if TRUTH_CACHE.exists() else {}
    if key in cache:
        return float(cache[key])
    mixes = [lengths_of(requests, 99 + k) for k in range(replicates)]
    if isinstance(model, EngineModel):
        near = true_capacity(model, limit_ms, lengths_of(min(requests, 20000), 99), q=q, tolerance=0.02)
        reps = Replicates(model, mixes, seed=1)
    else:  # the replicates' engine is unused when a server is given
        near = 0.7 * model.slots / (model.ms_per_token * 190 / 1000)  # ~70% of slots / mean service
        reps = Replicates(EngineModel(), mixes, seed=1, server=model)
    value, _ = capacity_of(reps, limit_ms, q, near=near, tolerance=0.002)
    if value is None:
        raise SystemExit(f"no capacity found for {model.describe()} near {near:g} req/s")
    cache[key] = round(value, 4)
    TRUTH_CACHE.parent.mkdir(parents=True, exist_ok=True)
    TRUTH_CACHE.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
    return value


def holds(out: slo.SearchOutcome, capacity: float) -> bool:
    lo = out.best if out.best is not None else 0.0
    hi = out.first_fail if out.first_fail is not None else math.inf
    return lo <= capacity < hi


def width_of(out: slo.SearchOutcome, capacity: float) -> float:
    """(upper - lower) / truth; infinite for an open bracket, which misses every width target."""
    lo = out.best if out.best is not None else 0.0
    return math.inf if out.first_fail is None else (out.first_fail - lo) / capacity


def pct(values: Sequence[float], q: float) -> float:
    srt = sorted(values)
    return srt[min(len(srt) - 1, int(q * len(srt)))] if srt else math.nan


def run_shape(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Many searches against one shape; coverage, width and probing time."""
    model: Server
    if name in FIFO_SHAPES:
        settings, slo_text = FIFO_SHAPES[name]
        model = FifoSlots(**settings)
    else:
        settings, slo_text = SHAPES[name] if name != "custom" else (_custom(args), args.slo)
        model = EngineModel(**settings)
    limits = slo.parse_slo(slo_text)
    limit_ms = {lim.metric: lim.limit for lim in limits if lim.metric != "errors"}
    qs = {lim.p for lim in limits if lim.p is not None}
    assert len(qs) == 1, "one percentile for every limit (the truth is computed at one quantile)"
    t0 = time.monotonic()
    capacity = args.truth or pooled_truth(model, limit_ms, qs.pop() / 100, args.truth_requests,
                                          args.truth_replicates)  # fmt: skip
    print(f"[{name}] engine {model.describe()}; SLO {slo_text}: true capacity {capacity:.3f} req/s "
          f"({args.truth_replicates} x {args.truth_requests} simulated requests per rate, pooled; "
          f"{time.monotonic() - t0:.0f} s)", flush=True)  # fmt: skip
    rng = random.Random(args.first_seed)
    covered, widths, minutes, statuses, model_err = 0, [], [], {}, []
    fitted: list[tuple[bool, float, bool]] = []  # (usable, width of the narrowed bracket, holds the truth)
    for i in range(args.seeds):
        seed = rng.randrange(1, 2**31)
        search = Search(model, limits, seed, args)
        out = search.run()
        ok = holds(out, capacity)
        m = search.rate_model()
        model_err.append(math.inf if m is None or m.capacity is None else m.capacity / capacity - 1)
        covered += ok
        widths.append(width_of(out, capacity))
        minutes.append(search.seconds / 60)
        statuses[out.status] = statuses.get(out.status, 0) + 1
        fa = search.fitted(out)
        if fa is not None:
            br = fa.bracket
            f_ok = br is not None and br[0] <= capacity <= br[1]
            fitted.append((fa.usable, math.inf if br is None else (br[1] - br[0]) / capacity, f_ok))
            if args.verbose or (fa.usable and not f_ok):
                e = fa.fit.engine if fa.fit is not None else None
                admission = "" if e is None else (
                    f" ({'one prompt at a time' if e.frontend_serial else 'side by side'}"
                    f"{', composed ahead' if e.async_scheduling else ''})")  # fmt: skip
                print(f"  [{name}] search {i + 1}: fitted{admission} {fa.capacity and round(fa.capacity, 3)} interval "
                      f"[{fa.low and round(fa.low, 3)}, {fa.high and round(fa.high, 3)}], narrowed "
                      f"{None if br is None else [round(br[0], 3), round(br[1], 3)]} "
                      f"{'(not used)' if br is None else 'holds' if f_ok else 'MISSES'}; {fa.why}",
                      flush=True)  # fmt: skip
        if args.verbose or not ok:
            print(f"  [{name}] search {i + 1}: [{out.best}, {out.first_fail}] {'holds' if ok else 'MISSES'} "
                  f"{out.status}, {search.seconds / 60:.1f} min; steps "
                  f"{[(s.rate, s.phase, s.verdict) for s in out.steps]}",
                  flush=True)  # fmt: skip
    n = max(1, args.seeds)
    row = {
        "shape": name, "slo": slo_text, "capacity": round(capacity, 3), "searches": args.seeds,
        "coverage": covered / n, "width_median": pct(widths, 0.5), "width_p90": pct(widths, 0.9),
        "width_met": sum(1 for w in widths if w <= WIDTH_TARGET) / n,
        "minutes_median": pct(minutes, 0.5), "minutes_max": max(minutes, default=math.nan), "statuses": statuses,
        "model_error_median": pct(model_err, 0.5),
        "model_within": sum(1 for e in model_err if abs(e) <= WIDTH_TARGET / 2) / n,
        "fitted_usable": sum(1 for u, _, _ in fitted if u) / n,
        "fitted_coverage": sum(1 for u, _, ok in fitted if u and ok) / max(1, sum(1 for u, _, _ in fitted if u)),
        "fitted_width_median": pct([w for u, w, _ in fitted if u], 0.5),
        "fitted_width_max": max((w for u, w, _ in fitted if u), default=math.nan),
        "fitted_met": sum(1 for u, w, ok in fitted if u and ok and w <= WIDTH_TARGET) / n,
    }  # fmt: skip
    if fitted:
        print(f"[{name}] fitted step loop: usable in {row['fitted_usable']:.0%}; narrowed bracket holds the truth in "
              f"{row['fitted_coverage']:.0%} of those; width median {row['fitted_width_median']:.1%}, max "
              f"{row['fitted_width_max']:.1%}; holds and within {WIDTH_TARGET:.0%} in {row['fitted_met']:.0%} of "
              "searches", flush=True)  # fmt: skip
    print(f"[{name}] {args.seeds} searches: coverage {row['coverage']:.0%} (target >= {args.confidence:.0%}); width / "
          f"capacity median {row['width_median']:.1%}, 90th pct {row['width_p90']:.1%}, within {WIDTH_TARGET:.0%} in "
          f"{row['width_met']:.0%} (open brackets count as misses); probing time median "
          f"{row['minutes_median']:.1f} min, max {row['minutes_max']:.1f} min; statuses {statuses}",
          flush=True)  # fmt: skip
    return row


WIDTH_TARGET = 0.15


def _custom(args: argparse.Namespace) -> dict[str, Any]:
    return {"slots": args.slots, "step_ms": args.step_ms, "step_ms_per_seq": args.step_ms_per_seq,
            "prefill_ms_per_token": args.prefill_ms_per_token, "chunked": args.chunked}  # fmt: skip


def slowed(model: EngineModel, factor: float) -> EngineModel:
    """The same engine with every duration ``factor`` times longer: its capacity is the original's / factor
    at every latency limit times factor (the model is linear in time), so the truth carries over exactly."""
    return replace(model, step_ms=model.step_ms * factor, step_ms_per_seq=model.step_ms_per_seq * factor,
                   prefill_ms_per_token=model.prefill_ms_per_token * factor)  # fmt: skip


def e2e(model: EngineModel, limits_text: str, args: argparse.Namespace) -> dict[str, Any]:
    """One real search through Locust against the ground-truth server with the engine on."""
    out = Path(tempfile.mkdtemp(prefix="slo-e2e-"))
    with start_server_process(engine=model.describe()) as server:
        cmd = [
            sys.executable, "-m", "tailgate.cli", "slo", "--server", "url", "--host", server.base_url,
            "--config", "engine", "--slo", limits_text, "--results", str(out / "slo"), "--no-report",
            "--start-rate", f"{args.start:g}", "--max-rate", f"{args.max_rate:g}", "--resolution", args.resolution,
            "--duration", f"{args.e2e_duration:g}", "--n", str(args.e2e_min_n), "--warmup", str(args.warmup),
            "--seed", str(args.e2e_seed), "--max-probes", str(args.max_probes), "--reruns", "0",
            "--time-budget", f"{args.time_budget:g}",
            "--extend", str(args.extend), "--confidence", f"{args.confidence:g}",
        ]  # fmt: skip
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(Path.cwd())})
        seconds = time.monotonic() - t0
    state = json.loads((out / "slo" / "slo.json").read_text())
    result = state["configs"][0].get("result") or {}
    return {
        "exit": proc.returncode, "seconds": round(seconds), "best": result.get("best_rate"),
        "first_fail": result.get("first_fail_rate"), "status": result.get("status"),
        "probes": [(p["rate"], p["verdict"]) for p in state["configs"][0]["probes"]], "folder": str(out),
        "fitted": result.get("fitted") or {},
        "tail": proc.stdout.splitlines()[-12:],
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", action="append", default=[],
                   help=f"one of {', '.join([*SHAPES, *FIFO_SHAPES])}, 'all', or 'custom' (the engine options "
                        "below); repeat")  # fmt: skip
    p.add_argument("--seeds", type=int, default=100)
    p.add_argument("--first-seed", type=int, default=1000)
    p.add_argument("--slo", default="ttft_p99<=1000ms", help="the SLO of the custom shape")
    p.add_argument("--chunked", action="store_true", help="the custom engine's chunked prefill on")
    p.add_argument("--slots", type=int, default=32)
    p.add_argument("--step-ms", type=float, default=4.0)
    p.add_argument("--step-ms-per-seq", type=float, default=0.1)
    p.add_argument("--prefill-ms-per-token", type=float, default=0.01)
    p.add_argument("--duration", type=float, default=120.0, help="seconds of arrivals per attempt")
    p.add_argument("--min-n", type=int, default=500, help="measured requests per attempt at least")
    p.add_argument("--warmup", type=int, default=25)
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--start", type=float, default=2.0)
    p.add_argument("--max-rate", type=float, default=64.0)
    p.add_argument("--resolution", default="10%")
    p.add_argument("--max-probes", type=int, default=30)
    p.add_argument("--time-budget", type=float, default=1200.0, help="seconds of probing per search (0: none)")
    p.add_argument("--extend", type=int, default=0, help="extensions of an undecided probe per call (tailgate slo)")
    p.add_argument("--fixed", action="store_true", help="fixed-n Clopper-Pearson verdicts instead of sequences")
    p.add_argument("--no-pool", action="store_true", help="no pooling across rates")
    p.add_argument("--no-model", action="store_true", help="no model of p99 against rate to place probes")
    p.add_argument(
        "--no-over-limit",
        action="store_true",
        help="bisect under an undecided top rate over its limit instead of extending a rate on track",
    )
    p.add_argument("--model-replicates", type=int, default=8, help="fitted step loop simulations (0: none)")
    p.add_argument("--model-requests", type=int, default=10000)
    p.add_argument("--no-model-stop", action="store_true", help="spend the whole budget (no early stop on the model)")
    p.add_argument("--no-confirm", action="store_true",
                   help="the fitted interval without confirmation probes (tailgate slo --no-confirm)")  # fmt: skip
    p.add_argument("--model-mix", choices=("seeded", "measured"), default="seeded",
                   help="the fitted model's requests: the seeded mix (as tailgate slo for the seeded workload) "
                        "or the distinct requests measured (as for a trace file)")  # fmt: skip
    p.add_argument("--truth-requests", type=int, default=100000, help="simulated requests per truth replicate")
    p.add_argument("--truth-replicates", type=int, default=4)
    p.add_argument("--truth", type=float, default=0.0, help="the true capacity, when computed before (one shape)")
    p.add_argument("--verbose", action="store_true", help="one line per search")
    p.add_argument("--log-confirmation", action="store_true", help="every step of each model's confirmation")
    p.add_argument("--json", default="", help="write the rows here")
    p.add_argument("--e2e", action="store_true", help="also one real search through Locust (the custom engine)")
    p.add_argument("--e2e-duration", type=float, default=75.0)
    p.add_argument(
        "--e2e-slowdown",
        type=float,
        default=4.0,
        help="the end-to-end engine runs this many times slower (capacity / this), to suit one machine",
    )
    p.add_argument("--e2e-min-n", type=int, default=300)
    p.add_argument("--e2e-seed", type=int, default=7)
    args = p.parse_args(argv)
    every = [*SHAPES, *FIFO_SHAPES]
    shapes = [s for name in (args.shape or ["all"]) for s in (every if name == "all" else [name])]
    unknown = [s for s in shapes if s not in every and s != "custom"]
    if unknown:
        p.error(f"--shape: unknown {unknown}; known: {', '.join(every)}, all, custom")
    rows = [run_shape(name, args) for name in shapes if args.seeds > 0]
    print(f"attempts: {args.duration:g} s of Poisson arrivals, at least {args.min_n} measured "
          f"(+{args.warmup} warm-up); resolution {args.resolution}; {args.extend} extension(s) per call; time budget "
          f"{args.time_budget:g} s; verdicts {'fixed-n' if args.fixed else 'anytime-valid'}, "
          f"{'no ' if args.no_pool else ''}pooling")  # fmt: skip
    print("| shape | SLO | true capacity | coverage | width median | width 90th | within 15% | minutes median | max "
          "| model error median | model within ±7.5% | fitted usable | fitted coverage | fitted width median "
          "| fitted width max | fitted within 15% |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['shape']} | {r['slo']} | {r['capacity']:g} | {r['coverage']:.0%} | {r['width_median']:.1%} | "
              f"{r['width_p90']:.1%} | {r['width_met']:.0%} | {r['minutes_median']:.1f} | {r['minutes_max']:.1f} | "
              f"{r['model_error_median']:+.1%} | {r['model_within']:.0%} | {r['fitted_usable']:.0%} | "
              f"{r['fitted_coverage']:.0%} | {r['fitted_width_median']:.1%} | {r['fitted_width_max']:.1%} | "
              f"{r['fitted_met']:.0%} |")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str) + "\n")
    if args.e2e:
        model = EngineModel(**_custom(args))
        limits = slo.parse_slo(args.slo)
        limit_ms = {lim.metric: lim.limit for lim in limits if lim.metric != "errors"}
        capacity = args.truth or pooled_truth(model, limit_ms, 0.99, args.truth_requests, args.truth_replicates)
        f = args.e2e_slowdown
        e2e_model = slowed(model, f)
        e2e_slo = ",".join(f"{lim.key}<={lim.limit * f:g}ms" for lim in limits if lim.metric != "errors")
        e2e_capacity = capacity / f
        r = e2e(e2e_model, e2e_slo, args)
        ok = holds(slo.SearchOutcome(r["best"], r["first_fail"], r["status"]), e2e_capacity)
        print(f"end to end (Locust -> ground-truth server, engine {f:g}x slower, SLO {e2e_slo}, true capacity "
              f"{e2e_capacity:.3f} req/s, seed {args.e2e_seed}): exit {r['exit']}, {r['seconds']} s, bracket "
              f"[{r['best']}, {r['first_fail']}] ({r['status']}), holds the truth: {ok}; probes {r['probes']}; "
              f"results in {r['folder']}")  # fmt: skip
        f_br = r["fitted"].get("bracket")
        verdict = "no narrowed bracket" if not f_br else "holds" if f_br[0] <= e2e_capacity <= f_br[1] else "MISSES"
        print(f"  fitted step loop: capacity {r['fitted'].get('capacity')} interval {r['fitted'].get('interval')}, "
              f"narrowed bracket {f_br} ({verdict}); {r['fitted'].get('why')}")  # fmt: skip
        for line in r["tail"]:
            print("   ", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
