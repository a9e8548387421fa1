"""Time-interval arithmetic over a stage's records: merged coverage of a set of intervals, which streams
overlap which windows, the windows in which the preemption counter rose, and the prefill attribution
(did streams have their worst gap while another request's long prompt was prefilling?).

Numpy over whole columns; apart from the questions because the SLO report asks the attribution too.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

import numpy as np
import pandas as pd

from .prompts import long_prompt_threshold


def _covered(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge intervals; returns merged starts, ends and the covered length before each start."""
    order = np.argsort(starts)
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    new = np.r_[True, s[1:] > run_end[:-1]]
    group = np.cumsum(new) - 1
    ms = s[new]
    me = np.zeros(ms.size)
    np.maximum.at(me, group, e)
    before = np.r_[0.0, np.cumsum(me - ms)[:-1]]
    return ms, me, before


def _covered_until(t: np.ndarray, ms: np.ndarray, me: np.ndarray, before: np.ndarray) -> np.ndarray:
    """Covered length of the merged intervals up to each time in ``t``."""
    j = np.searchsorted(ms, t, side="right") - 1
    jj = np.clip(j, 0, None)
    inside = np.clip(t - ms[jj], 0.0, me[jj] - ms[jj])
    return np.where(j >= 0, before[jj] + inside, 0.0)


class Attribution(TypedDict):
    """What :func:`prefill_attribution` found; the diagnosis adds the cell it read and whether the worst gaps
    inside long prefills were the shorter ones."""

    big_prompt_min_tokens: int
    streams_live_during_big_prefill: int
    worst_gap_inside_big_prefill: int
    share: float | None
    share_by_chance: float | None
    median_worst_gap_inside_ms: float | None
    median_worst_gap_other_ms: float | None
    cell: NotRequired[str]
    inside_shorter: NotRequired[bool]


def prefill_attribution(stage: pd.DataFrame) -> Attribution | None:
    """Did streams have their worst gap while another request's large prompt was prefilling?

    A prefill runs from a request's send to its first chunk; long prompts (the rule chart 3 marks them
    by, :func:`~tailgate.postprocess.prompts.long_prompt_threshold`) are the ones whose prefill can
    stall everyone else. Among streams that were producing while
    such a prefill ran, count those whose worst gap overlaps one, and compare with chance: the
    share of each stream's lifetime covered by those prefills. Far above chance means the
    prefills caused the stalls.
    """
    ok = stage.loc[stage["error_class"].isna()]
    prompt = ok["prompt_tokens_planned"].to_numpy(dtype=float)
    if ok.empty or np.unique(prompt).size < 2:
        return None
    # the same cut-off as chart 3's long-prompt marks, so the chart and this count can be checked together
    big = prompt >= long_prompt_threshold(prompt)
    if not big.any():
        return None
    p0 = ok["sent_s"].to_numpy(dtype=float)[big]
    p1 = ok["first_chunk_s"].to_numpy(dtype=float)[big]
    keep = np.isfinite(p0) & np.isfinite(p1) & (p1 >= p0)
    if not keep.any():
        return None
    ms, me, before = _covered(p0[keep], p1[keep])
    first = ok["first_chunk_s"].to_numpy(dtype=float)
    last = ok["last_chunk_s"].to_numpy(dtype=float)
    gap = ok["worst_gap_ms"].to_numpy(dtype=float)
    g_end = ok["worst_gap_end_s"].to_numpy(dtype=float)
    valid = np.isfinite(first) & np.isfinite(last) & np.isfinite(gap) & np.isfinite(g_end) & (last > first)
    windows = np.column_stack([ms, me])
    live = valid & overlaps(first, last, windows)
    hit = live & overlaps(g_end - gap / 1000.0, g_end, windows)
    cover = np.zeros(len(ok))
    span = np.where(valid, last - first, 1.0)
    cover[valid] = (_covered_until(last[valid], ms, me, before) - _covered_until(first[valid], ms, me, before)) / (
        span[valid]
    )
    n_live = int(live.sum())
    return {
        "big_prompt_min_tokens": int(prompt[big].min()),
        "streams_live_during_big_prefill": n_live,
        "worst_gap_inside_big_prefill": int(hit.sum()),
        "share": round(float(hit.sum() / n_live), 3) if n_live else None,
        "share_by_chance": round(float(cover[live].mean()), 3) if n_live else None,
        "median_worst_gap_inside_ms": round(float(np.median(gap[hit])), 1) if hit.any() else None,
        "median_worst_gap_other_ms": round(float(np.median(gap[valid & ~hit])), 1) if (valid & ~hit).any() else None,
    }


def increment_windows(series: pd.DataFrame, run_dir: str, start: float, end: float) -> np.ndarray:
    """``[(t_prev, t)]`` for every sample whose preemption counter rose, within the stage window."""
    if series is None or series.empty or "preemptions_inc" not in series.columns:
        return np.empty((0, 2))
    s = series.loc[series["run_dir"] == run_dir] if "run_dir" in series.columns else series
    s = s.sort_values("t")
    t = s["t"].to_numpy(dtype=float)
    inc = s["preemptions_inc"].to_numpy(dtype=float)
    prev = np.r_[t[0] - 1.0 if t.size else 0.0, t[:-1]]
    m = np.isfinite(inc) & (inc > 0) & (t >= start) & (t <= end + (t[1] - t[0] if t.size > 1 else 1.0))
    return np.column_stack([prev[m], t[m], inc[m]]) if m.any() else np.empty((0, 3))


def overlaps(a0: np.ndarray, a1: np.ndarray, windows: np.ndarray) -> np.ndarray:
    """Which intervals ``[a0, a1]`` overlap any window ``(w0, w1]``."""
    if windows.size == 0:
        return np.zeros(a0.shape, dtype=bool)
    order = np.argsort(windows[:, 0])
    w0 = windows[order, 0]
    w1 = np.maximum.accumulate(windows[order, 1])
    j = np.searchsorted(w0, a1, side="left") - 1
    return (j >= 0) & (w1[np.clip(j, 0, None)] >= a0)
