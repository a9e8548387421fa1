"""What a search is asked to do: its limits, configurations, rates, probe sizes and budgets, and the rules that
follow from them alone (an attempt's seed, a probe's size, where its queue stop fires, what the search's own
probes may spend)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from tailgate.jsontypes import JsonObject
from tailgate.slo.confirm import reserve_seconds
from tailgate.slo.search import Resolution
from tailgate.slo.spec import Limit, ServerConfig, slo_text

PROBE_OVERHEAD_S = 15.0
"""Seconds a probe costs beyond its arrivals: the load generator's start, the last streams, the settle."""


EXTENSION_GROWTH_STEPS = 2
"""An extension's attempt doubles the one before it this many times at most (four times the plan's count)."""

RECORDED_RESAMPLES = 2000
"""What ``slo.json``'s plan records as ``resamples``: every bound is exact and draws none, so the value is fixed and
only keeps plans comparable for a resume."""


def attempt_size(base: int, extension: int, length: float, rate: float, left_s: float | None, warmup: int) -> int:
    """Measured requests of one attempt: ``base`` times ``length``, doubled for each extension before it (the
    ``extension``-th, 0 for a first attempt or a re-run) up to :data:`EXTENSION_GROWTH_STEPS` times; an extension
    never longer than ``left_s`` seconds of budget allow, nor shorter than ``base``.

    A rate extended is one whose decision needs several times its data, and whose requests may outlast a tenth of
    a short window, where its keep-up cannot tell: a longer window pays the start and the drain once, and lets the
    sustained check see past the requests still running at its end."""
    grow = 1 << min(max(0, extension), EXTENSION_GROWTH_STEPS)
    n = max(base, round(base * length * grow))
    if left_s is not None and grow > 1:
        n = max(base, min(n, math.floor((left_s - PROBE_OVERHEAD_S) * rate) - warmup))
    return n


@dataclass
class SloPlan:
    limits: tuple[Limit, ...]
    configs: list[ServerConfig]
    start_rate: float = 5.0
    max_rate: float = 64.0
    min_rate: float = 0.5
    resolution: Resolution = field(default_factory=lambda: Resolution(0.25, True))
    max_probes: int = 8
    reruns: int = 0
    """Re-runs of the same workload for a probe without a verdict: they add evidence only as far as the
    server behaves differently on the same arrivals, so none by default; extensions add new samples."""
    extend: int = 0
    """Further attempts, each a new sample of the workload (another seed), for a probe still undecided after
    its re-runs: more independent evidence where the capacity is, instead of longer probes everywhere."""
    confidence: float = 0.95
    resamples: int = RECORDED_RESAMPLES
    """Fixed (:data:`RECORDED_RESAMPLES`): nothing draws resamples, every bound is exact."""
    n: int = 200
    warmup: int = 25
    seed: int = 7
    ignore_eos: bool = False
    processes: int = 1
    max_waiting: int = -1
    """Stop a probe once the server's waiting queue reaches this many requests (0: never; -1: relative to the
    probe, :data:`QUEUE_STOP_SHARE` of its requests, so the stop can fire at any probe size)."""
    duration: float = 0.0
    """Seconds of arrivals per probe: a probe sends ``max(n, rate * duration)`` measured requests, so it
    lasts long enough to reach and hold steady state at every rate (0: ``n`` alone)."""
    stage_warmup: int = 0
    """Requests per stage warm-up round at ``max_rate`` before the first probe on a server (0: none)."""
    time_budget: float = 0.0
    """Seconds of probing per configuration; no probe starts that would overrun it (0: no budget)."""
    locust_args: list[str] = field(default_factory=list)
    base_flags: list[str] = field(default_factory=list)
    """Flags every configuration starts with (the embedded server's eager mode), before its own."""
    model_replicates: int = 8
    """Simulations of the step loop fitted to the server's streams (0: no fitted model)."""
    model_requests: int = 10000
    model_stop: bool = True
    """End the search early once the fitted model, checked against the probes, meets the resolution."""
    confirm: bool = True
    """Test the fitted model's interval with probes it was not fitted to before its answer stands
    (:mod:`tailgate.slo.confirm`); the search keeps a share of the time budget for them."""

    def describe(self) -> JsonObject:
        """The plan as ``slo.json`` records it: what a resume compares (``RESUME_KEYS`` in command.py)."""
        return {
            "slo": slo_text(self.limits), "limits": [asdict(lim) for lim in self.limits],
            "start_rate": self.start_rate, "max_rate": self.max_rate, "min_rate": self.min_rate,
            "resolution": str(self.resolution), "max_probes": self.max_probes, "reruns": self.reruns,
            "extend": self.extend, "look_confidence": round(self.look_confidence, 5),
            "confidence": self.confidence, "resamples": self.resamples, "n": self.n, "warmup": self.warmup,
            "seed": self.seed, "ignore_eos": self.ignore_eos, "processes": self.processes,
            "max_waiting": self.max_waiting, "duration": self.duration,
            "time_budget": self.time_budget, "locust_args": self.locust_args, "stage_warmup": self.stage_warmup,
            "base_flags": self.base_flags, "model_replicates": self.model_replicates,
            "model_requests": self.model_requests, "model_stop": self.model_stop, "confirm": self.confirm,
            "measured_from": "intended send (TTFT, total); worst gap inside the stream",
            "verdicts": "anytime-valid mixture-martingale confidence sequences on the share over each limit, "
                        "design effect of time blocks and runs, pooled across rates by isotonic blocks; "
                        "sustained load by completions inside the arrival window and Mann-Kendall "
                        "trend tests on TTFT and the waiting queue",
        }  # fmt: skip

    @property
    def looks(self) -> int:
        """Attempts one call of a probe takes on its growing data at most (first run, re-runs, extensions);
        the search may come back to an undecided rate for more."""
        return 1 + self.reruns + self.extend

    @property
    def look_confidence(self) -> float:
        """The confidence of each look: the verdicts are anytime-valid confidence sequences, so looking after
        every attempt (and pooling a later probe of the same rate) costs no share of the confidence."""
        return self.confidence

    @property
    def tails(self) -> dict[str, float]:
        """The share allowed over each percentile limit, by key: what pooling across rates tests."""
        return {lim.key: 1.0 - lim.p / 100.0 for lim in self.limits if lim.p is not None}

    def attempt_seed(self, attempt: int) -> int:
        """The trace seed of an attempt (1-based): re-runs repeat the plan's seed, extensions draw new ones."""
        extra = attempt - 1 - self.reruns
        return self.seed if extra <= 0 else self.seed + EXTEND_SEED_STEP * extra

    def confirm_seed(self, rate: float, attempt: int) -> int:
        """The trace seed of a confirmation probe's attempt: a sample of its own, never one a search probe drew.
        Every rate's first attempt replays the plan's sample, so a confirmation on it would rescale the requests
        and arrivals the model was fitted to: where that sample happened to be benign (a rate under it passed),
        the probe just over the capacity passes with it. Set by the rate, so a resumed search draws the same."""
        return confirmation_seed(self.seed, rate, attempt)

    def search_budget(self, capacity_low: float) -> float:
        """Seconds the search's own probes may spend: the budget less what the confirmation probes near
        ``capacity_low`` (:func:`tailgate.slo.confirm.reserve_rate`) would need, a refit's included."""
        if not self.time_budget or not (self.confirm and self.model_replicates):
            return self.time_budget
        return self.time_budget - reserve_seconds(self.time_budget, duration=self.duration, n=self.n,
                                                  warmup=self.warmup, rate=capacity_low,
                                                  overhead=PROBE_OVERHEAD_S)  # fmt: skip

    def probe_n(self, rate: float) -> int:
        """Measured requests of a probe at ``rate``: by duration, with ``n`` the minimum."""
        return max(self.n, math.ceil(rate * self.duration)) if self.duration > 0 else self.n

    def attempt_n(self, rate: float, attempt: int, length: float = 1.0, left_s: float | None = None) -> int | None:
        """Measured requests of attempt ``attempt`` (from 1) at ``rate`` (:func:`attempt_size`); None for the plan's
        own count, which a trace file always sets."""
        base = self.probe_n(rate)
        n = attempt_size(base, attempt - 1 - self.reruns, length, rate, left_s, self.warmup)
        return None if n == base or "--trace-file" in self.locust_args else n

    def queue_stop(self, rate: float) -> int:
        """The waiting-queue size at which a probe at ``rate`` stops early (0: never)."""
        if self.max_waiting >= 0:
            return self.max_waiting
        return max(4, math.ceil(QUEUE_STOP_SHARE * (self.probe_n(rate) + self.warmup)))


EXTEND_SEED_STEP = 1000
"""Seed distance of an extension's workload from the plan's (far from the suite's own seed + 100 re-draws)."""
CONFIRM_SEED_BASE = 500
"""Confirmation seeds sit between the extensions' (plan seed + 1,000 k): no search probe draws them."""


def confirmation_seed(seed: int, rate: float, attempt: int) -> int:
    """A confirmation probe's sample at ``rate`` (attempt 1-based), from the plan's ``seed``."""
    return seed + CONFIRM_SEED_BASE + round(rate * 1000) * EXTEND_SEED_STEP + attempt


QUEUE_STOP_SHARE = 0.25
"""A quarter of a probe's requests waiting at once: no server that keeps up queues that many."""
