"""Distribution-free verdicts on a tail percentile against a limit, and a trend test for steady state.

"p99 <= L" is the statement "at most 1% of requests exceed L". With k of n requests over L, a one-sided
Clopper-Pearson bound on that share decides it at a stated confidence, with no assumption about the
latency distribution; inverting the same test gives order-statistic bounds on the percentile itself
(for n iid requests the upper bound is the order statistic x(s) with P(Bin(n, q) <= s-1) >= 1-alpha, so a
95% upper bound on p99 needs n >= 299 and is the maximum there). A percentile bootstrap cannot give
that: its bound never exceeds the sample maximum, so at small n it is optimistic by construction.

Requests are not independent: one engine stall delays every running stream at once. The exceedances
are therefore counted in blocks (seconds of the probe, or whole runs) and the binomial counts are
shrunk by the design effect (observed between-block variance over the binomial variance, at least 1):
a probe whose exceedances come in one burst carries less evidence than the same count spread out.

Verdicts are three-way: ``pass`` (the upper bound is within the limit), ``fail`` (the lower bound is
over it) and ``not_enough_data`` (neither: the data straddle the limit, or n is too small for any
bound to exist). Pure Python plus math: the load and search side imports it without pandas.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tailgate.jsontypes import JsonObject

REFERENCE_QUANTILE = 0.97
"""The sample quantile whose exceedances measure clustering when the limit's own are too few."""
PASS = "pass"
FAIL = "fail"
NOT_ENOUGH = "not_enough_data"


# --------------------------------------------------------------------------------------- binomial


def _log_pmf(k: int, n: int, p: float) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(p) + (n - k) * math.log1p(-p)


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(Bin(n, p) <= k), summed from the short side so a tail of a large n stays exact."""
    if k < 0:
        return 0.0
    if k >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    if k <= n // 2:
        return min(1.0, sum(math.exp(_log_pmf(i, n, p)) for i in range(k + 1)))
    return max(0.0, 1.0 - sum(math.exp(_log_pmf(i, n, p)) for i in range(k + 1, n + 1)))


def _solve(f: Any, target: float) -> float:
    """p in [0, 1] with f(p) = target for f decreasing in p (bisection to 1e-10)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if f(mid) > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def share_upper(k: int, n: int, alpha: float) -> float:
    """One-sided (1 - alpha) Clopper-Pearson upper bound on a proportion with k of n."""
    if n <= 0:
        return 1.0
    if k >= n:
        return 1.0
    return _solve(lambda p: binom_cdf(k, n, p), alpha)


def share_lower(k: int, n: int, alpha: float) -> float:
    """One-sided (1 - alpha) Clopper-Pearson lower bound on a proportion with k of n."""
    if n <= 0 or k <= 0:
        return 0.0
    return _solve(lambda p: binom_cdf(k - 1, n, p), 1.0 - alpha)


def min_n_for_bound(q: float, confidence: float) -> int:
    """The fewest independent requests for which a (confidence) upper bound on the q-quantile exists."""
    return math.ceil(math.log(1.0 - confidence) / math.log(q))


# ------------------------------------------------------------------------- anytime-valid (sequences)

MIXTURE_POINTS = 64
"""Points of the discrete mixing prior: a discrete prior is an exact mixture, so validity holds at any size."""


def _log_mix(k: float, n: float, p0: float, side: str) -> float:
    """log of a mixture likelihood-ratio martingale against ``p0`` for k exceedances in n (Bernoulli) draws.

    ``side`` ``below``: the alternatives are shares under ``p0`` (uniform prior on (0, p0)); under any
    share at or above ``p0`` the product is a nonnegative supermartingale, so by Ville's inequality it ever
    reaches 1/alpha with probability at most alpha, however often it is looked at. ``above``: shares over
    ``p0`` (log-uniform prior on (p0, 1)), a supermartingale under any share at or below ``p0``.
    """
    if p0 <= 0.0 or p0 >= 1.0 or n <= 0:
        return 0.0
    terms = []
    for i in range(MIXTURE_POINTS):
        u = (i + 0.5) / MIXTURE_POINTS
        q = p0 * u if side == "below" else p0 ** (1.0 - u)
        terms.append(k * math.log(q / p0) + (n - k) * math.log1p(-q) - (n - k) * math.log1p(-p0))
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms) / MIXTURE_POINTS)


def seq_below(k: float, n: float, p0: float, alpha: float) -> bool:
    """Anytime-valid: the share is under ``p0`` at (1 - alpha), whenever the data are looked at."""
    return n > 0 and _log_mix(k, n, p0, "below") >= math.log(1.0 / alpha)


def seq_above(k: float, n: float, p0: float, alpha: float) -> bool:
    """Anytime-valid: the share is over ``p0`` at (1 - alpha), whenever the data are looked at."""
    return k > 0 and _log_mix(k, n, p0, "above") >= math.log(1.0 / alpha)


def seq_share_upper(k: float, n: float, alpha: float) -> float:
    """The confidence sequence's upper end on the share: the smallest p0 the data show the share is under."""
    if n <= 0 or k >= n:
        return 1.0
    return _bisect_log(lambda p0: seq_below(k, n, p0, alpha), max(k / n, 1e-9), 1.0 - 1e-9, lower_end=False)


def seq_share_lower(k: float, n: float, alpha: float) -> float:
    """The confidence sequence's lower end on the share: the largest p0 the data show the share is over."""
    if n <= 0 or k <= 0:
        return 0.0
    return _bisect_log(lambda p0: seq_above(k, n, p0, alpha), 1e-9, min(k / n, 1.0 - 1e-9), lower_end=True)


def _bisect_log(holds: Any, lo: float, hi: float, *, lower_end: bool) -> float:
    """The edge of the region where ``holds`` is true, by bisection in log space: ``holds`` true from the
    edge up (``lower_end`` False: the smallest such p0) or from the edge down (True: the largest)."""
    inside = lo if lower_end else hi
    edge = hi if lower_end else lo
    if holds(edge):
        return edge
    if not holds(inside):
        return 0.0 if lower_end else 1.0
    for _ in range(40):
        mid = math.sqrt(inside * edge)
        if holds(mid):
            inside = mid
        else:
            edge = mid
    return inside


def min_n_for_sequence(q: float, confidence: float) -> int:
    """The fewest independent requests, none over the limit, with which the sequence shows the q-quantile under it."""
    n = min_n_for_bound(q, confidence)
    while not seq_below(0, n, 1.0 - q, 1.0 - confidence):
        n = math.ceil(n * 1.02) + 1
    lo = n // 2
    while lo < n:  # the smallest such n (the test is monotone in n at k = 0)
        mid = (lo + n) // 2
        if seq_below(0, mid, 1.0 - q, 1.0 - confidence):
            n = mid
        else:
            lo = mid + 1
    return n


# ------------------------------------------------------------------------------------ design effect


def design_effect(flags: Sequence[bool], groups: Sequence[Any]) -> float:
    """How much the grouping inflates the variance of the share of ``flags`` (>= 1; 1 when unknowable).

    ``groups`` labels each value with its block (a second of the probe, a run). Uses the ratio
    estimator's between-block variance against the binomial variance; with no exceedance, or fewer
    than two blocks, the data say nothing about clustering and 1 is returned. So is 1 when the blocks
    show no overdispersion (a chi-square dispersion test at 5%): independent requests would otherwise
    be charged for the estimate's own noise.
    """
    n = len(flags)
    k = sum(1 for f in flags if f)
    if n == 0 or k == 0 or k == n:
        return 1.0
    counts: dict[Any, list[int]] = {}
    for f, g in zip(flags, groups, strict=True):
        c = counts.setdefault(g, [0, 0])
        c[0] += 1
        c[1] += 1 if f else 0
    m = len(counts)
    if m < 2:
        return 1.0
    p = k / n
    dispersion = sum((kb - p * nb) ** 2 / (nb * p * (1 - p)) for nb, kb in counts.values())
    if dispersion <= _chi2_upper(m - 1):
        return 1.0
    between = sum((kb - p * nb) ** 2 for nb, kb in counts.values()) * m / (m - 1) / (n * n)
    binomial = p * (1 - p) / n
    return max(1.0, between / binomial)


def _chi2_upper(df: int, z: float = 1.6449) -> float:
    """The 95th percentile of chi-square with ``df`` degrees of freedom (Wilson-Hilferty)."""
    c = 2.0 / (9.0 * df)
    return df * (1.0 - c + z * math.sqrt(c)) ** 3


# ------------------------------------------------------------------------------------------ verdict


@dataclass
class TailCheck:
    """One percentile limit checked on one probe, with the evidence behind the verdict."""

    key: str
    limit: float
    q: float
    n: int
    n_effective: float
    over: int
    """Requests over the limit."""
    share_over: float
    share_over_upper: float
    share_over_lower: float
    point: float | None
    low: float | None
    """Lower confidence bound of the percentile (None: undefined at this n)."""
    high: float | None
    """Upper confidence bound of the percentile (None: undefined at this n: not enough data)."""
    verdict: str
    reason: str

    def as_dict(self) -> JsonObject:
        return asdict(self)


def _effective(k: int, n: int, deff: float) -> tuple[int, int]:
    """Counts shrunk by the design effect, rounded the conservative way for each bound."""
    return math.ceil(k / deff - 1e-9), max(0, math.floor(n / deff + 1e-9))


def check_tail(
    values: Sequence[float],
    q: float,
    limit: float,
    *,
    confidence: float = 0.95,
    groups: Sequence[Any] | None = None,
    key: str = "",
    sequential: bool = False,
) -> TailCheck:
    """Is the ``q``-quantile (0 < q < 1) of ``values`` at most ``limit``, at ``confidence``, one-sided each way?

    ``groups`` (same length as ``values``) labels the blocks the requests are correlated within;
    without it they are taken as independent. ``sequential``: decide by the anytime-valid mixture
    martingales (:func:`seq_below`, :func:`seq_above`) instead of Clopper-Pearson, so the verdict holds at
    ``confidence`` however many times the growing data are looked at (at the price of about 1.5 times the
    requests for a first bound: 449 instead of 299 for a p99 at 95%).
    """
    alpha = 1.0 - confidence
    n = len(values)
    tail = 1.0 - q
    if n == 0:
        return TailCheck(key, limit, q, 0, 0.0, 0, 0.0, 1.0, 0.0, None, None, None, NOT_ENOUGH, "no requests")
    flags = [v > limit for v in values]
    k = sum(flags)
    deff = 1.0
    if groups is not None:
        # A handful of exceedances (or none) cannot show how clustered the tail is; the share over a lower,
        # well-populated threshold can: a queue that builds up puts its slow requests together either way.
        ref = sorted(values)[int(REFERENCE_QUANTILE * (n - 1))]
        deff = max(design_effect(flags, groups), design_effect([v > ref for v in values], groups))
    k_hi, n_eff = _effective(k, n, deff)
    k_lo = math.floor(k / deff + 1e-9)
    srt = sorted(values)
    point = srt[max(0, math.ceil(q * n) - 1)]
    if sequential:
        upper = seq_share_upper(min(k_hi, n_eff), n_eff, alpha)
        lower = seq_share_lower(min(k_lo, n_eff), n_eff, alpha)
        passed = seq_below(min(k_hi, n_eff), n_eff, tail, alpha)
        failed = seq_above(min(k_lo, n_eff), n_eff, tail, alpha)
        high, low = _seq_quantile_bounds(srt, q, alpha, deff)
        no_bound = not seq_below(0, n_eff, tail, alpha)
    else:
        upper = share_upper(min(k_hi, n_eff), n_eff, alpha)
        lower = share_lower(min(k_lo, n_eff), n_eff, alpha)
        passed, failed = upper <= tail, lower > tail
        high = _quantile_upper(srt, q, alpha, deff)
        low = _quantile_lower(srt, q, alpha, deff)
        no_bound = share_upper(0, n_eff, alpha) > tail
    how = "anytime-valid " if sequential else ""
    if passed:
        verdict, reason = PASS, f"at most {upper:.2%} over the limit at {how}{confidence:.0%} (allowed {tail:.2%})"
    elif failed:
        verdict, reason = FAIL, f"at least {lower:.2%} over the limit at {how}{confidence:.0%} (allowed {tail:.2%})"
    elif no_bound:
        need = min_n_for_sequence(q, confidence) if sequential else min_n_for_bound(q, confidence)
        verdict = NOT_ENOUGH
        reason = (f"effective n {n_eff} (n {n}, design effect {deff:.2f}) is below the {need} needed for any "
                  f"{confidence:.0%} bound on p{q * 100:g}")  # fmt: skip
    else:
        verdict = NOT_ENOUGH
        reason = f"{k} of {n} over the limit: the interval [{lower:.2%}, {upper:.2%}] straddles {tail:.2%}"
    return TailCheck(key, limit, q, n, round(n / deff, 1), k, k / n, upper, lower, point, low, high, verdict, reason)


def _seq_quantile_bounds(
    srt: Sequence[float], q: float, alpha: float, deff: float
) -> tuple[float | None, float | None]:
    """The confidence sequence's bounds on the q-quantile: order statistics found by bisection on the count
    above them (both tests are monotone in it). (upper, lower); None for a side no order statistic supports."""
    n = len(srt)
    tail = 1.0 - q
    n_eff = max(0, math.floor(n / deff + 1e-9))

    def below(k: int) -> bool:  # at most a (1 - q) share above the k-th largest
        return seq_below(min(math.ceil(k / deff - 1e-9), n_eff), n_eff, tail, alpha)

    def above(k: int) -> bool:  # more than a (1 - q) share at or above the k-th largest
        return seq_above(min(math.floor(k / deff + 1e-9), n_eff), n_eff, tail, alpha)

    upper = None
    if n and below(0):
        lo, hi = 0, n - 1  # the largest k with below(k)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if below(mid) else (lo, mid - 1)
        upper = srt[n - 1 - lo]
    lower = None
    if n and above(n):
        lo, hi = 1, n  # the smallest k with above(k)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if above(mid) else (mid + 1, hi)
        lower = srt[n - lo]
    return upper, lower


def _quantile_upper(srt: Sequence[float], q: float, alpha: float, deff: float) -> float | None:
    """The smallest order statistic x with at most a (1 - q) share above it at (1 - alpha): None if none."""
    n = len(srt)
    tail = 1.0 - q
    best: int | None = None
    for k in range(n):  # k values above the candidate; the bound only loosens as k grows
        k_eff, n_eff = _effective(k, n, deff)
        if share_upper(min(k_eff, n_eff), n_eff, alpha) <= tail:
            best = k
        else:
            break
    return None if best is None else srt[n - 1 - best]


def _quantile_lower(srt: Sequence[float], q: float, alpha: float, deff: float) -> float | None:
    """The largest order statistic under which a share above (1 - q) lies at (1 - alpha): None if none."""
    n = len(srt)
    tail = 1.0 - q
    for k in range(1, n + 1):  # the k-th largest value: k values at or above it
        k_eff = math.floor(k / deff + 1e-9)
        n_eff = max(0, math.floor(n / deff + 1e-9))
        if share_lower(min(k_eff, n_eff), n_eff, alpha) > tail:
            return srt[n - k]
    return None


def quantile_interval(
    values: Sequence[float], q: float, confidence: float = 0.95, groups: Sequence[Any] | None = None
) -> tuple[float | None, float | None]:
    """Two-sided distribution-free interval of the q-quantile (each side at (1 - confidence) / 2).

    None for a side that no order statistic supports at this n (an upper bound on a p99 at 95% two-sided
    needs n >= 368 independent requests)."""
    n = len(values)
    if n == 0:
        return None, None
    alpha = (1.0 - confidence) / 2.0
    flags_ref = sorted(values)[int(REFERENCE_QUANTILE * (n - 1))]
    deff = design_effect([v > flags_ref for v in values], groups) if groups is not None else 1.0
    srt = sorted(values)
    return _quantile_lower(srt, q, alpha, deff), _quantile_upper(srt, q, alpha, deff)


# ---------------------------------------------------------------------------------------- steady state


def mann_kendall(series: Sequence[float]) -> tuple[float, float]:
    """Mann-Kendall S statistic's z score and the one-sided p-value of an *upward* trend (ties corrected)."""
    x = list(series)
    n = len(x)
    if n < 3:
        return 0.0, 1.0
    s = 0
    for i in range(n - 1):
        xi = x[i]
        for j in range(i + 1, n):
            d = x[j] - xi
            s += (d > 0) - (d < 0)
    ties: dict[float, int] = {}
    for v in x:
        ties[v] = ties.get(v, 0) + 1
    var = (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties.values())) / 18.0
    if var <= 0:
        return 0.0, 1.0
    z = (s - 1) / math.sqrt(var) if s > 0 else ((s + 1) / math.sqrt(var) if s < 0 else 0.0)
    p = 0.5 * math.erfc(z / math.sqrt(2))
    return z, p


def batch_means(series: Sequence[float], batches: int) -> list[float]:
    """The time-ordered series cut into ``batches`` equal runs, each replaced by its mean.

    Batch means are far less autocorrelated than the raw series (a queue's waits are strongly
    correlated request to request), so a trend test on them keeps its stated level.
    """
    n = len(series)
    if n < batches:
        return list(series)
    out = []
    for b in range(batches):
        lo, hi = b * n // batches, (b + 1) * n // batches
        chunk = series[lo:hi]
        out.append(sum(chunk) / len(chunk))
    return out


def sen_slope(series: Sequence[float]) -> float:
    """Theil-Sen slope per step: the median of pairwise slopes, robust to a few outlying batches."""
    slopes = sorted((series[j] - series[i]) / (j - i) for i in range(len(series)) for j in range(i + 1, len(series)))
    if not slopes:
        return 0.0
    mid = len(slopes) // 2
    return slopes[mid] if len(slopes) % 2 else (slopes[mid - 1] + slopes[mid]) / 2


@dataclass(frozen=True, slots=True)
class Trend:
    """A Mann-Kendall test on batch means with the Theil-Sen rise: the steady-state check weighs the rise
    against its own material size before it lets ``trend`` fail a probe."""

    trend: bool
    """Significant at ``alpha`` and a rise of at least ``min_rise`` times the series' median level."""
    z: float
    p: float
    rise: float
    """Theil-Sen slope of the batch means times their span: the series' rise from first to last batch."""
    level: float
    """The series' median: what a rise is measured against."""
    batch_means: tuple[float, ...]


def upward_trend(series: Sequence[float], *, batches: int = 10, alpha: float = 0.05, min_rise: float = 1.0) -> Trend:
    """Test a time-ordered series for a material upward trend: Mann-Kendall on batch means at ``alpha``,
    and a Theil-Sen rise over the series of at least ``min_rise`` times its median level.

    A queue near its capacity wanders up and down for long stretches, which a rank test alone reads as a
    trend; a server that does not keep up grows its queue without bound, far beyond its typical level.
    """
    means = batch_means(series, batches)
    z, p = mann_kendall(means)
    rise = sen_slope(means) * max(0, len(means) - 1)
    srt = sorted(series)
    level = srt[len(srt) // 2] if srt else 0.0
    trend = p < alpha and rise >= min_rise * max(level, 1e-9)
    return Trend(trend, round(z, 3), round(p, 4), round(rise, 2), round(level, 2), tuple(round(m, 2) for m in means))
