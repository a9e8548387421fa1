"""The fitted engine simulated at any rate: independent replicates pooled, and the capacity where they cross.

A fitted engine is judged by the rate at which its simulated percentile crosses a limit. One long run of it is not
enough: near the capacity the share over a limit comes in rare queue build-ups, so each replicate has its own
requests and arrival draws, their counts are pooled per rate, and a replicate left out at a time gives the
spread. The replicates of a final answer run in processes of their own where the host has the cores.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import random
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from functools import partial

from tailgate.slo.servicefit import METRIC_OF_OUTCOME
from tailgate.verify.groundtruth.engine import EngineModel, Outcome, quantile, simulate

T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}
"""Student's t, 97.5% two-sided, by degrees of freedom (more: 2.2)."""


Server = Callable[[list[tuple[int, int, int]]], list[Outcome]]
"""A simulated server: (arrival ns, prompt tokens, output tokens) in arrival order -> what each request saw."""


class Replicates:
    """Independent simulations of the fitted engine at any rate, each with its own requests and arrival draws.

    The share of requests over a limit near the capacity comes from rare queue build-ups, so one short run's
    share is skewed (usually under, now and then far over): the capacity where a single run crosses the limit
    is biased upward. The replicates' counts are pooled at each rate instead, and the capacity is where the
    pooled share crosses; a replicate left out at a time (the jackknife) gives its spread."""

    def __init__(self, engine: EngineModel, mixes: Sequence[Sequence[tuple[int, int]]], seed: int,
                 server: Server | None = None) -> None:  # fmt: skip
        """``server``: what serves the simulated arrivals, when not ``engine``'s step loop (a benchmark's
        truth of a server outside the model's family)."""
        self.engine = engine
        self.servers: list[Server] = [
            server if server is not None
            # a noisy engine draws its front-end delays afresh in each replicate, as its arrivals are
            else partial(simulate, replace(engine, noise_seed=seed * 104729 + k) if engine.frontend_noise else engine)
            for k in range(len(mixes))
        ]  # fmt: skip
        self.mixes = mixes
        rngs = [random.Random(seed * 104729 + k) for k in range(len(mixes))]
        self.gaps = [[rng.expovariate(1.0) for _ in m] for rng, m in zip(rngs, mixes, strict=True)]
        self.counts: dict[float, list[dict[str, tuple[int, int]]]] = {}
        """Per rate, per replicate: metric -> (requests over the limit, requests)."""
        self.windows: dict[float, list[dict[str, tuple[int, int]]]] = {}
        """Per rate, per run of :data:`RUN_REQUESTS` consecutive requests of a replicate: the same counts."""
        self.curve: dict[float, dict[str, tuple[float, float, float]]] = {}
        """Per rate: metric -> the pooled percentile and its jackknife band (low, high), ms."""
        self.q = 0.99
        self.parallel = sys.platform == "linux" and len(mixes) > 1 and sum(map(len, mixes)) >= PARALLEL_REQUESTS
        self.parallel = self.parallel and usable_cores() > 1

    def at(self, rate: float, limits: Mapping[str, float]) -> list[dict[str, tuple[int, int]]]:
        if rate not in self.counts:
            jobs = [(server, mix, gaps, rate, dict(limits))
                    for server, mix, gaps in zip(self.servers, self.mixes, self.gaps, strict=True)]  # fmt: skip
            done = self._in_processes(jobs) if self.parallel else None
            if done is None:
                done = [_replicate(*job) for job in jobs]
            self.counts[rate] = [counts for counts, _ in done]
            self.windows[rate] = [w for _, values in done for w in _runs(values, limits)]
            self.curve[rate] = {m: _pooled_band([values[m] for _, values in done], self.q) for m in limits}
        return self.counts[rate]

    def _in_processes(self, jobs: Sequence[_Job]) -> list[_Done] | None:
        """The replicates run each in a process of its own (None: they cannot be, and never will be here)."""
        try:
            pool = _pool()
            return [f.result() for f in [pool.submit(_replicate, *job) for job in jobs]]
        except (pickle.PicklingError, AttributeError, TypeError, OSError, BrokenProcessPool):
            self.parallel = False  # a server that cannot travel (a closure), or no processes here: in this one
            return None


_Job = tuple[Server, Sequence[tuple[int, int]], Sequence[float], float, dict[str, float]]
_Done = tuple[dict[str, tuple[int, int]], dict[str, list[float]]]
PARALLEL_REQUESTS = 40_000
"""Simulated requests at one rate, all replicates together, from which the replicates run in processes of their
own: the final answer simulates 8 x 40,000 at every rate its search tries, ~95% of a fit's time, which on a
16-core GPU host took three minutes of a search's budget in one process."""
_POOL: ProcessPoolExecutor | None = None


def usable_cores() -> int:
    """The cores this process may run on (its affinity, as a container or ``taskset`` sets it), at most 32: a
    final answer has 8 replicates a rate, and every worker is a fork of the whole process."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(32, cores))


def _pool() -> ProcessPoolExecutor:
    global _POOL
    if _POOL is None:
        # fork, not spawn or forkserver: those import the caller's main module again in every worker, and a script
        # without a main guard would run itself there; the workers only simulate (no locks, no I/O)
        _POOL = ProcessPoolExecutor(max_workers=usable_cores(), mp_context=multiprocessing.get_context("fork"))
    return _POOL


def _replicate(server: Server, mix: Sequence[tuple[int, int]], gaps: Sequence[float], rate: float,
               limits: Mapping[str, float]) -> _Done:  # fmt: skip
    """One replicate at one rate: per limited metric, (requests over the limit, requests) and every value."""
    t, arrivals = 0.0, []
    for (p, mx), g in zip(mix, gaps, strict=True):
        t += g / rate  # common random numbers: the same unit-rate draws at every rate
        arrivals.append((round(t * 1e9), p, mx))
    outs: list[Outcome] = server(arrivals)[len(arrivals) // 20 :]  # the empty start out
    values = {m: [getattr(o, METRIC_OF_OUTCOME[m]) for o in outs] for m in limits}
    return {m: (sum(1 for v in values[m] if v > lim), len(outs)) for m, lim in limits.items()}, values


RUN_REQUESTS = 4000
"""The length of one run whose own capacity the answer states beside the long-run one: a validation run of a few
thousand requests, as the truth runs of ``benchmarks/slo_truth_real.py`` are."""


def _runs(values: Mapping[str, Sequence[float]], limits: Mapping[str, float]) -> list[dict[str, tuple[int, int]]]:
    """A replicate cut into consecutive runs of :data:`RUN_REQUESTS`: each run's (requests over the limit, requests)."""
    n = min((len(v) for v in values.values()), default=0)
    starts = range(0, n - RUN_REQUESTS + 1, RUN_REQUESTS)
    return [{m: (sum(1 for v in values[m][s : s + RUN_REQUESTS] if v > lim), RUN_REQUESTS) for m, lim in limits.items()}
            for s in starts]  # fmt: skip


def _pooled_band(values: Sequence[Sequence[float]], q: float) -> tuple[float, float, float]:
    """The q-quantile of the replicates pooled, and a 95% band from the jackknife over replicates (ms)."""
    whole = quantile([v for vs in values for v in vs], q)
    r = len(values)
    if r < 2:
        return whole, whole, whole
    jack = [quantile([v for j, vs in enumerate(values) if j != k for v in vs], q) for k in range(r)]
    mean = statistics.fmean(jack)
    se = math.sqrt((r - 1) / r * sum((x - mean) ** 2 for x in jack))
    half = T975.get(r - 1, 2.2) * se
    return whole, max(0.0, whole - half), whole + half


def excess(rows: Sequence[Mapping[str, tuple[int, int]]], q: float, keep: Sequence[int]) -> float:
    """How far the pooled share over the worst limit is above its allowance, relative (<= 0: the limits hold)."""
    worst = -1.0
    for m in rows[0]:
        over = sum(rows[k][m][0] for k in keep)
        n = sum(rows[k][m][1] for k in keep)
        worst = max(worst, over / max(1, n) / (1.0 - q) - 1.0)
    return worst


def crossing(reps: Replicates, q: float, keep: Sequence[int]) -> float | None:
    """The rate where the pooled share crosses its allowance, interpolated between the rates simulated."""
    return _crossing_of(reps.counts, q, keep)


def _crossing_of(counts: Mapping[float, Sequence[Mapping[str, tuple[int, int]]]], q: float,
                 keep: Sequence[int]) -> float | None:  # fmt: skip
    rates = sorted(counts)
    ex = [excess(counts[r], q, keep) for r in rates]
    bad = next((i for i, e in enumerate(ex) if e > 0), None)
    if bad is None:
        return rates[-1] if rates else None
    ok = max((i for i in range(bad) if ex[i] <= 0), default=None)
    if ok is None:
        return None
    r0, r1, e0, e1 = rates[ok], rates[bad], ex[ok], ex[bad]
    return r0 + (r1 - r0) * (-e0) / (e1 - e0) if e1 > e0 else r0


def capacity_of(reps: Replicates, limits: Mapping[str, float], q: float, *, near: float,
                tolerance: float = 0.005) -> tuple[float | None, list[float]]:  # fmt: skip
    """The pooled capacity (bisection from around ``near``, then interpolation) and each leave-one-out capacity."""
    every = list(range(len(reps.mixes)))
    reps.q = q

    def ok(rate: float) -> bool:
        return excess(reps.at(rate, limits), q, every) <= 0

    lo, hi = near * 0.8, near * 1.25
    while not ok(lo):
        hi, lo = lo, lo / 2
        if lo < near / 20:
            return None, []
    while ok(hi):
        lo, hi = hi, hi * 1.5
        if hi > near * 100:
            return None, []
    while hi - lo > tolerance * lo:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    whole = crossing(reps, q, every)
    jack = [c for k in every if (c := crossing(reps, q, [j for j in every if j != k])) is not None]
    return whole, jack


def single_runs(reps: Replicates, q: float) -> list[float]:
    """The capacity each run of :data:`RUN_REQUESTS` requests shows alone (its requests at every rate simulated, common
    random numbers): the run-to-run spread of a finite window's p99, which the long-run interval does not hold. A
    validation run lands anywhere in it: on the CPU vLLM in float32 the fitted model's own p99 over 4,000-request
    windows came out 7-8% over its long-run p99 (``benchmarks/truth_replay.py``). A run that crosses outside the
    rates simulated is left out (the rates simulated close in on the long-run capacity, so the spread stated is
    if anything too narrow)."""
    if not reps.windows:
        return []
    rates = sorted(reps.windows)
    out = []
    for k in range(len(reps.windows[rates[0]])):
        c = _crossing_of(reps.windows, q, [k])
        if c is not None and (c < rates[-1] or excess(reps.windows[rates[-1]], q, [k]) > 0):
            out.append(c)
    return out
