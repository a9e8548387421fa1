"""Bootstrap confidence intervals for percentile differences, without resampling arrays.

A resample's p-th percentile depends only on two of its order statistics. For data sorted
once, the k-th smallest of n indices drawn with replacement is ``floor(n * U_(k))`` where
``U_(k) ~ Beta(k, n - k + 1)`` is the k-th order statistic of n uniforms, and the next one
follows as ``U_(k) + (1 - U_(k)) * Beta(1, n - k)``. So each resample costs two Beta draws
instead of n draws and a sort: the same bootstrap distribution, and 2000 resamples of a
100,000-request stage take milliseconds.

Shared by the analysis (``postprocess``) and the SLO search's verdicts; numpy only, no pandas.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 7


def bootstrap_percentile(
    values: np.ndarray, p: float, resamples: int = DEFAULT_RESAMPLES, rng: np.random.Generator | None = None
) -> np.ndarray:
    """``resamples`` draws of the linear-interpolation ``p``-th percentile of a bootstrap resample."""
    x = np.sort(np.asarray(values, dtype=float)[np.isfinite(values)])
    n = x.size
    if n == 0:
        return np.full(resamples, np.nan)
    rng = rng or np.random.default_rng(DEFAULT_SEED)
    k = (n - 1) * p / 100.0
    lo = int(np.floor(k))
    frac = k - lo
    u_lo = rng.beta(lo + 1, n - lo, size=resamples)
    if lo + 1 < n:
        u_hi = u_lo + (1.0 - u_lo) * rng.beta(1, n - lo - 1, size=resamples)
    else:
        u_hi = u_lo
    i_lo = np.minimum((u_lo * n).astype(np.int64), n - 1)
    i_hi = np.minimum((u_hi * n).astype(np.int64), n - 1)
    return x[i_lo] * (1.0 - frac) + x[i_hi] * frac


def bootstrap_percentile_naive(
    values: np.ndarray, p: float, resamples: int = DEFAULT_RESAMPLES, rng: np.random.Generator | None = None
) -> np.ndarray:
    """The textbook resample-and-sort bootstrap; kept as the reference the fast one is tested against."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    rng = rng or np.random.default_rng(DEFAULT_SEED)
    idx = rng.integers(0, x.size, size=(resamples, x.size))
    return np.percentile(x[idx], p, axis=1)


@dataclass(frozen=True, slots=True)
class Difference:
    """``b - a`` of a percentile, with a percentile-bootstrap interval."""

    a: float
    b: float
    diff: float
    low: float
    high: float
    ratio: float | None
    n_a: int
    n_b: int
    level: float
    resamples: int

    @property
    def includes_zero(self) -> bool:
        return bool(self.low <= 0.0 <= self.high)

    def as_dict(self) -> dict[str, float | int | bool | None]:
        return {
            "a": round(self.a, 1), "b": round(self.b, 1), "diff": round(self.diff, 1),
            "ci_low": round(self.low, 1), "ci_high": round(self.high, 1),
            "ratio": None if self.ratio is None else round(self.ratio, 3),
            "n_a": self.n_a, "n_b": self.n_b, "level": self.level, "resamples": self.resamples,
            "ci_includes_zero": self.includes_zero,
        }  # fmt: skip


def percentile_difference(
    a: np.ndarray,
    b: np.ndarray,
    p: float = 99.0,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    level: float = 0.95,
    seed: int = DEFAULT_SEED,
) -> Difference | None:
    """Point estimate and seeded bootstrap interval of ``percentile(b) - percentile(a)``.

    The two groups are resampled independently (they are different requests). None when either
    side is empty.
    """
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if a.size == 0 or b.size == 0:
        return None
    rng = np.random.default_rng(seed)
    da = bootstrap_percentile(a, p, resamples, rng)
    db = bootstrap_percentile(b, p, resamples, rng)
    d = db - da
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(d, [tail, 100.0 - tail])
    pa, pb = float(np.percentile(a, p)), float(np.percentile(b, p))
    ratio = pb / pa if pa > 0 else None
    return Difference(pa, pb, pb - pa, float(lo), float(hi), ratio, a.size, b.size, level, resamples)
