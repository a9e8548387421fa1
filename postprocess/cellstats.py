"""What every diagnosis answer is built from: the measured records of each cell, indexed once; the p99
differences between two cells with their order-statistic intervals (and the rule for when there are too
few requests to give one); the lookups of a continuous ramp; and how numbers read in an answer.

Shared by the five checklist questions (:mod:`tailgate.postprocess.diagnosis`) and the prompt A/B
(:mod:`tailgate.postprocess.prompt_ab`), so both state their intervals the same way.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from tailgate.arms import OPEN_LOOP

from .bootstrap import min_n_for_difference, percentile_difference
from .diagnosistypes import Comparison, P99Comparison
from .runfolders import rate_text
from .summarize import measured_mask, stage_warmups

MIN_N_P99_CI = min_n_for_difference(99.0, 0.95)
"""A distribution-free 95% interval of a p99 difference needs this many requests per cell (437): fewer, and
no order statistic bounds a p99 at the 98.75% each side needs. Below it, the diagnosis gives the point
values and says the interval was not computed (a bootstrap would give one that looks precise and is not)."""


def finite(x: Any) -> float | None:
    """``x`` as a float, or None when it is missing, not a number, or infinite (a cell the data left empty)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def safe_ratio(a: Any, b: Any) -> float | None:
    x, y = finite(a), finite(b)
    if x is None or y is None or y <= 0:
        return None
    return round(x / y, 3)


def ms_text(x: Any) -> str:
    v = finite(x)
    return "n/a" if v is None else f"{v:.1f} ms"


def times_text(r: float | None) -> str:
    return "n/a" if r is None else f"{r:.2f}×"


class Cells:
    """The measured records of each cell, indexed once."""

    def __init__(self, table: pd.DataFrame, records: pd.DataFrame, summaries: pd.DataFrame) -> None:
        self.table = table
        self.records = records
        self.index: dict[tuple[str, int], np.ndarray] = {}
        self.all_index: dict[tuple[str, int], np.ndarray] = {}
        self.measured = records
        if records.empty:
            return
        warm, rules = stage_warmups(summaries)
        mask = measured_mask(records, warm, rules)
        self.measured = records.loc[mask.to_numpy()]
        self.index = {
            (str(k[0]), int(k[1])): v
            for k, v in self.measured.groupby(["run_dir", "stage"], observed=True).indices.items()
        }
        self.all_index = {
            (str(k[0]), int(k[1])): v for k, v in records.groupby(["run_dir", "stage"], observed=True).indices.items()
        }

    def values(self, row: pd.Series, column: str) -> np.ndarray:
        idx = self.index.get((str(row["run_dir"]), int(row["stage"])))
        if idx is None:
            return np.array([], dtype=float)
        values: np.ndarray = self.measured[column].to_numpy(dtype=float)[idx]
        return values

    def frame(self, row: pd.Series, measured: bool = True) -> pd.DataFrame:
        key = (str(row["run_dir"]), int(row["stage"]))
        if measured:
            idx = self.index.get(key)
            return self.measured.iloc[idx] if idx is not None else self.measured.iloc[:0]
        idx = self.all_index.get(key)
        return self.records.iloc[idx] if idx is not None else self.records.iloc[:0]


def span_text(lo: pd.Series, hi: pd.Series) -> str:
    return f"{rate_text(lo['rate_or_batch'])}→{rate_text(hi['rate_or_batch'])} req/s"


def primary_prompts(table: pd.DataFrame) -> str:
    """The prompt source the five questions read: the seed's when it was measured, else the commonest."""
    p = table["prompts"].fillna("seed").astype(str) if "prompts" in table.columns else pd.Series(["seed"])
    return "seed" if (p == "seed").any() or p.empty else str(p.mode().iloc[0])


def continuous_cells(table: pd.DataFrame, config: str | None = None, prompts: str | None = None) -> pd.DataFrame:
    d = table.loc[table["arm"].isin(OPEN_LOOP) & ~table["cell"].astype(str).str.contains("~")]
    if "prompts" in d.columns:
        d = d.loc[d["prompts"].fillna("seed").astype(str) == (prompts or primary_prompts(table))]
    if config is not None:
        d = d.loc[d["config"] == config]
    return d.sort_values("rate_or_batch")


def cell_at(table: pd.DataFrame, config: str, rate: float) -> pd.Series | None:
    d = continuous_cells(table, config)
    d = d.loc[np.isclose(d["rate_or_batch"].astype(float), rate)]
    return d.iloc[0] if len(d) else None


def compare_cells(cells: Cells, a: pd.Series, b: pd.Series, resamples: int, seed: int) -> Comparison:
    """Bootstrap p99 differences (``b - a``) of worst gap and TTFT between two cells."""

    def one(col: str) -> P99Comparison | None:
        va, vb = cells.values(a, col), cells.values(b, col)
        na, nb = int(np.isfinite(va).sum()), int(np.isfinite(vb).sum())
        if min(na, nb) < MIN_N_P99_CI:
            return {
                "n_a": na,
                "n_b": nb,
                "ci": None,
                "why_no_ci": f"n = {na} and {nb}; a p99 interval needs at least {MIN_N_P99_CI} per cell",
            }
        d = percentile_difference(va, vb, 99.0, resamples=resamples, seed=seed)
        return d.as_dict() if d is not None else None

    return {"a": a["cell"], "b": b["cell"], "gap_p99": one("worst_gap_ms"), "ttft_p99": one("ttft_ms")}


def ci_text(d: P99Comparison | None) -> str:
    """A comparison's interval in words. Without one it says only "no interval" and the two n: why (the
    :data:`MIN_N_P99_CI` rule) is said once for the whole diagnosis (``glossary.NO_INTERVAL_NOTE``), since at a
    small n it holds for every comparison on the page."""
    if not d:
        return "no records to bootstrap"
    if "why_no_ci" in d:
        return f"no interval: n = {d['n_a']} and {d['n_b']}"
    if d.get("ci_low") is None or d.get("ci_high") is None:
        return f"p99 difference {d['diff']:+.1f} ms, no closed interval at n = {d['n_a']} and {d['n_b']}"
    return (f"p99 difference {d['diff']:+.1f} ms, 95% CI [{d['ci_low']:+.1f}, {d['ci_high']:+.1f}] "
            "(order statistics), "
            f"n = {d['n_a']} and {d['n_b']}")  # fmt: skip


def ci_resolved(d: P99Comparison | None) -> bool | None:
    """True when a 95% interval was computed and excludes 0; None when there is no interval."""
    if not d or "why_no_ci" in d:
        return None
    return not d["ci_includes_zero"]
