"""Counter arithmetic on raw samples, the same rules as Prometheus's ``increase()`` without its extrapolation.

Apart from fetching because both witnesses of a stage use it: the series pulled from Prometheus and the load
path's own ``/metrics`` reads, so a preemption delta means one thing whichever source gave it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def _clean(times: Sequence[float] | np.ndarray, values: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(times, dtype=float)
    v = np.asarray(values, dtype=float)
    if t.shape != v.shape:
        raise ValueError("times and values differ in length")
    ok = np.isfinite(t) & np.isfinite(v)
    t, v = t[ok], v[ok]
    order = np.argsort(t, kind="stable")
    return t[order], v[order]


def counter_increments(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Increase since the previous sample, per sample (0 for the first), across resets.

    A value below its predecessor means the counter restarted from zero, so the new value is
    all increase: the same rule as Prometheus ``increase()``.
    """
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return v.copy()
    d = np.diff(v)
    increments: np.ndarray = np.r_[0.0, np.where(d < 0, v[1:], d)]
    return increments


def counter_increase(
    times: Sequence[float] | np.ndarray, values: Sequence[float] | np.ndarray, start: float, end: float
) -> float | None:
    """Increase of one counter series over ``[start, end]`` from its raw samples, without extrapolation.

    Samples exactly on either edge count as inside. Fewer than two samples in the window mean
    the increase is unknown (None), not zero: one reading says nothing about change.
    """
    t, v = _clean(times, values)
    inside = (t >= start) & (t <= end)
    v = v[inside]
    if v.size < 2:
        return None
    return float(counter_increments(v)[1:].sum())


def increase_from_increments(
    times: Sequence[float] | np.ndarray, increments: Sequence[float] | np.ndarray, start: float, end: float
) -> float | None:
    """:func:`counter_increase` for a series already turned into per-sample increments.

    The first in-window increment is dropped: it happened between the last sample before the
    window and the first one inside it.
    """
    t, inc = _clean(times, increments)
    inside = (t >= start) & (t <= end)
    inc = inc[inside]
    if inc.size < 2:
        return None
    return float(inc[1:].sum())


def summed_increase(
    series: Iterable[tuple[Sequence[float] | np.ndarray, Sequence[float] | np.ndarray]], start: float, end: float
) -> float | None:
    """Sum over series (``engine`` and any other label) of each one's own increase.

    Summing per series, not summing values first, keeps one engine's restart from looking like
    a huge drop in the total.
    """
    parts = [counter_increase(t, v, start, end) for t, v in series]
    known = [p for p in parts if p is not None]
    return float(sum(known)) if known else None
