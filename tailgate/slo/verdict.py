"""Verdicts on one probe: each limit's point estimate and interval at the stated confidence, pooled over
attempts; a probe passes only when every interval lies under its limit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from tailgate.slo.spec import METRIC_FIELDS, Limit
from tailgate.stats import percentile


@dataclass
class Check:
    """One limit checked on one probe: point estimate, interval at the confidence level, verdict."""

    key: str
    limit: float
    point: float | None
    low: float | None
    high: float | None
    n: int
    verdict: str
    """``pass`` (interval under the limit), ``fail`` (interval above it) or ``uncertain``."""


def _verdict(low: float, high: float, limit: float) -> str:
    if high <= limit:
        return "pass"
    if low > limit:
        return "fail"
    return "uncertain"


def _error_verdict(point: float, low: float, limit: float) -> str:
    """Errors: fail when even the interval's low end is over the limit, uncertain when only the point is.

    Zero errors in n requests bound the rate only near 3/n, so an interval rule would call every probe
    under a 0.5% limit uncertain below ~600 requests. The observed rate is therefore held against the
    limit, and the Wilson interval is reported beside it, not used to pass.
    """
    if low > limit:
        return "fail"
    return "uncertain" if point > limit else "pass"


def bootstrap_interval(values: np.ndarray, p: float, level: float, resamples: int, seed: int) -> tuple[float, float]:
    """Percentile-bootstrap interval of the ``p``-th percentile (the report's fast order-statistic bootstrap)."""
    from tailgate.postprocess.bootstrap import bootstrap_percentile

    draws = bootstrap_percentile(values, p, resamples, np.random.default_rng(seed))
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(draws, [tail, 100.0 - tail])
    return float(lo), float(hi)


def wilson_interval(k: int, n: int, level: float) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion: sound at 0 errors and small n, unlike the normal one."""
    if n == 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(0.5 + level / 2.0)
    ph = k / n
    den = 1 + z * z / n
    mid = (ph + z * z / (2 * n)) / den
    half = z * math.sqrt(ph * (1 - ph) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def check_probe(
    attempts: Sequence[Mapping[str, Any]],
    limits: Sequence[Limit],
    *,
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 7,
) -> tuple[str, list[Check]]:
    """Pool the attempts of one probe and check every limit; the probe's verdict and the checks.

    Each attempt is ``{"measured": [records], "sent": int, "errors": int, "stopped_early": str|None}``.
    A probe stopped early (queue without bound, error budget spent) fails whatever its percentiles say.
    """
    measured = [r for a in attempts for r in a["measured"]]
    sent = sum(int(a["sent"]) for a in attempts)
    errors = sum(int(a["errors"]) for a in attempts)
    checks: list[Check] = []
    for lim in limits:
        if lim.metric == "errors":
            frac = errors / sent if sent else 1.0
            lo, hi = wilson_interval(errors, sent, level)
            checks.append(Check(lim.key, lim.limit, round(frac, 5), round(lo, 5), round(hi, 5), sent,
                                _error_verdict(frac, lo, lim.limit) if sent else "fail"))  # fmt: skip
            continue
        vals = np.array([r.get(METRIC_FIELDS[lim.metric]) for r in measured], dtype=float)
        vals = vals[np.isfinite(vals)]
        if vals.size == 0:
            checks.append(Check(lim.key, lim.limit, None, None, None, 0, "fail"))
            continue
        assert lim.p is not None
        point = float(percentile(vals.tolist(), lim.p) or 0.0)
        lo, hi = bootstrap_interval(vals, lim.p, level, resamples, seed)
        checks.append(Check(lim.key, lim.limit, round(point, 1), round(lo, 1), round(hi, 1), int(vals.size),
                            _verdict(lo, hi, lim.limit)))  # fmt: skip
    verdicts = {c.verdict for c in checks}
    if any(a.get("stopped_early") for a in attempts) or "fail" in verdicts:
        return "fail", checks
    return ("uncertain" if "uncertain" in verdicts else "pass"), checks


def p99s(measured: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """TTFT, worst-gap and total p99 from the intended send, whatever the SLO limits: the table shows all three."""
    out: dict[str, float | None] = {}
    for metric, fld in METRIC_FIELDS.items():
        vals = [float(r[fld]) for r in measured if isinstance(r.get(fld), (int, float)) and math.isfinite(r[fld])]
        v = percentile(vals, 99)
        out[metric] = None if v is None else round(v, 1)
    return out


def binding_limit(checks: Sequence[Check] | Sequence[Mapping[str, Any]]) -> str | None:
    """The limit that binds: the failing (else uncertain) check furthest above its limit, relative to it."""
    rows = [c if isinstance(c, Mapping) else asdict(c) for c in checks]
    for verdict in ("fail", "uncertain"):
        cands = [c for c in rows if c["verdict"] == verdict]
        if cands:

            def over(c: Mapping[str, Any]) -> float:
                if c["point"] is None:
                    return math.inf
                return (c["point"] - c["limit"]) / c["limit"] if c["limit"] > 0 else c["point"]

            return str(max(cands, key=over)["key"])
    return None


def _fmt(key: str, v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v * 100:.2f}%" if key == "errors" else f"{v:.1f}"
