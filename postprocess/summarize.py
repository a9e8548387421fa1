"""Per-stage summaries computed from a records frame, with the load path's exact rules.

The load path writes summaries as each stage ends; these functions recompute them from records
with pandas, for runs whose summary was never written and so that the records behind every
number (the bootstrap intervals, the per-request charts) are chosen by the same warm-up rule.
The rules are not restated here: which percentiles, over which requests, the warm-up rules, the
completion order and the rounding all come from :mod:`tailgate.stats`; this module only vectorises
them (numpy's linear interpolation is what :func:`tailgate.stats.percentile` implements).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from tailgate.jsontypes import JsonObject
from tailgate.stats import COMPLETION_ORDER, PERCENTILE_RULES, ROUND_DIGITS, SEED_SUMMARY_KEYS, WARMUP_RULES

STAGE_KEYS: tuple[str, ...] = ("run_dir", "stage")


def _r1(x: float) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), ROUND_DIGITS)


def measured_mask(
    records: pd.DataFrame,
    warmup: int | Mapping[tuple[Any, ...], int],
    rule: str | Mapping[tuple[Any, ...], str] = "completion",
) -> pd.Series:
    """True for the successful records that a stage summary counts.

    ``completion`` drops each stage's first ``warmup`` successes in the order they finished (the
    reference harness's rule, ties broken by trace id as :func:`tailgate.stats.measured_records`
    does); ``trace`` drops the stage's ``warmup`` lowest trace ids. ``warmup`` and ``rule`` may be
    given per stage, keyed by ``(run_dir, stage)``.
    """
    if records.empty:
        return pd.Series(False, index=records.index)
    keys = [k for k in STAGE_KEYS if k in records.columns]
    grp = (
        records.groupby(keys, sort=False, observed=True).ngroup().to_numpy()
        if keys
        else np.zeros(len(records), dtype=np.int64)
    )
    # per-stage settings are looked up once per stage, then spread to its rows
    _, first = np.unique(grp, return_index=True)
    stage_keys = [tuple(k) for k in records[keys].iloc[first].itertuples(index=False)] if keys else [()]
    if isinstance(warmup, Mapping):
        w = np.array([warmup.get(k, 0) for k in stage_keys], dtype=np.int64)[grp]
    else:
        w = np.full(len(records), int(warmup), dtype=np.int64)
    if isinstance(rule, Mapping):
        by_trace = np.array([rule.get(k, "completion") == "trace" for k in stage_keys])[grp]
    else:
        if rule not in WARMUP_RULES:
            raise ValueError(f"unknown warm-up rule {rule!r}")
        by_trace = np.full(len(records), rule == "trace")
    ok = records["error_class"].isna().to_numpy()
    # completion order within each stage: rank of each success by (end_s, trace_id)
    end_key, tie_key = COMPLETION_ORDER
    end = records[end_key].fillna(0.0).to_numpy()
    tid = records[tie_key].to_numpy()
    order = np.lexsort((tid, end, ~ok, grp))
    rank = np.empty(len(records), dtype=np.int64)
    g_sorted = grp[order]
    starts = np.r_[0, np.flatnonzero(np.diff(g_sorted)) + 1]
    pos = np.arange(len(records)) - np.repeat(starts, np.diff(np.r_[starts, len(records)]))
    rank[order] = pos
    keep_completion = ok & (rank >= w)
    # trace order within each stage: rank of each record by trace id, successes or not
    order_t = np.lexsort((tid, grp))
    rank_t = np.empty(len(records), dtype=np.int64)
    g_t = grp[order_t]
    starts_t = np.r_[0, np.flatnonzero(np.diff(g_t)) + 1]
    rank_t[order_t] = np.arange(len(records)) - np.repeat(starts_t, np.diff(np.r_[starts_t, len(records)]))
    keep_trace = ok & (rank_t >= w)
    return pd.Series(np.where(by_trace, keep_trace, keep_completion), index=records.index)


def stage_warmups(
    summaries: pd.DataFrame, default: int = 0
) -> tuple[dict[tuple[Any, ...], int], dict[tuple[Any, ...], str]]:
    """Each stage's warm-up count and rule as its summary recorded them."""
    warm: dict[tuple[Any, ...], int] = {}
    rules: dict[tuple[Any, ...], str] = {}
    for row in summaries.itertuples(index=False):
        key = (row.run_dir, row.stage)
        w = getattr(row, "warmup", None)
        warm[key] = int(w) if w is not None and np.isfinite(w) else default
        r = getattr(row, "warmup_rule", None)
        rules[key] = r if isinstance(r, str) and r in WARMUP_RULES else "completion"
    return warm, rules


def _pct(values: pd.core.groupby.SeriesGroupBy, p: float) -> pd.Series:
    return values.quantile(p / 100.0, interpolation="linear")


def summaries_from_records(
    records: pd.DataFrame, *, default_warmup: int = 0, rule: str = "completion"
) -> list[JsonObject]:
    """Seed-compatible summaries (plus the extras the table needs) for every stage in ``records``.

    Used when a stage's summary file is missing; ``preemptions_delta`` is left None because only
    the server knows it.
    """
    if records.empty:
        return []
    keys = [k for k in STAGE_KEYS if k in records.columns]
    mask = measured_mask(records, default_warmup, rule)
    good = records.loc[mask]
    gi = good.groupby(keys, observed=True)
    ga = records.groupby(keys, observed=True)
    population = {"measured": gi, "sent": ga}
    stats = {pr.key: _pct(population[pr.over][pr.field], pr.p) for pr in PERCENTILE_RULES}
    stats["n"] = gi.size()
    stats["completion_tokens"] = gi["completion_tokens"].sum()
    if "client_coalesced" in good.columns:  # frames built by hand, or from an older schema, may lack it
        stats["client_coalesced_streams"] = gi["client_coalesced"].sum()
    else:
        stats["client_coalesced_streams"] = gi.size() * 0
    stats["sent"] = ga.size()
    stats["errors"] = ga["error_class"].count()
    stats["window_start_s"] = ga["sent_s"].min()
    stats["window_end_s"] = ga["end_s"].max()
    first = ga[["arm", "rate_or_batch", "stage_label", "run_id"]].first()
    span = ga["intended_s"].max() - ga["intended_s"].min()
    stats["achieved_rate"] = ((ga.size() - 1) / span).where(span > 0)
    table = pd.DataFrame(stats).join(first)
    failed = records.loc[records["error_class"].notna()]
    by_class = failed.groupby([*keys, "error_class"], observed=True).size()
    classes: dict[tuple[Any, ...], dict[str, int]] = {}
    for k, v in by_class.items():
        if v:
            classes.setdefault(tuple(k[:-1]), {})[str(k[-1])] = int(v)
    out = []
    for key, row in table.iterrows():
        key = key if isinstance(key, tuple) else (key,)
        d: JsonObject = dict(zip(keys, key, strict=True))
        start = float(row["window_start_s"])
        d.update(
            {
                "arm": str(row["arm"]),
                "n": int(row["n"]) if np.isfinite(row["n"]) else 0,
                "started": pd.Timestamp(start, unit="s", tz="UTC").strftime("%Y-%m-%dT%H:%M:%SZ"),
                "rate_or_batch": float(row["rate_or_batch"]),
                **{pr.key: _r1(row[pr.key]) for pr in PERCENTILE_RULES if pr.key in SEED_SUMMARY_KEYS},
                "preemptions_delta": None,
                "errors": int(row["errors"]),
                "stage_label": str(row["stage_label"]),
                "run_id": str(row["run_id"]),
                "window_start_s": start,
                "window_end_s": float(row["window_end_s"]),
                "sent": int(row["sent"]),
                "warmup": default_warmup,
                "warmup_rule": rule,
                "errors_by_class": dict(sorted(classes.get(tuple(key), {}).items())),
                **{pr.key: _r1(row[pr.key]) for pr in PERCENTILE_RULES if pr.key not in SEED_SUMMARY_KEYS},
                "achieved_rate": None if pd.isna(row["achieved_rate"]) else round(float(row["achieved_rate"]), 3),
                "completion_tokens": int(row["completion_tokens"]) if pd.notna(row["completion_tokens"]) else 0,
                "client_coalesced_streams": int(row["client_coalesced_streams"])
                if pd.notna(row["client_coalesced_streams"])
                else 0,
                "summary_source": "records",
            }
        )
        out.append(d)
    return out
