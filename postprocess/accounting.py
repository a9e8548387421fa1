"""Where every planned request went, per cell: planned, sent, recorded, lost in flight, never sent.

A percentile is only as good as the population it was taken over. A cell that planned 500
requests and recorded 480 must say where the other 20 went, because each answer means something
different: *lost in flight* (sent, but the load generator stopped before writing its record: the
send journal is the witness) hides outcomes that may have been the slowest; *never sent* (the
stage was cut short, or arrivals were dropped above ``--max-in-flight``) only shrinks the sample.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from tailgate.arms import is_open_loop
from tailgate.records import WORKER_LOST, account_stage, read_sent

from .runfolders import RunDir

COLUMNS: tuple[str, ...] = ("planned", "sent", "recorded", "lost_in_flight", "never_sent")
HEADERS: dict[str, str] = {
    "planned": "planned",
    "sent": "sent",
    "recorded": "recorded",
    "lost_in_flight": "lost in flight",
    "never_sent": "never sent",
}


def _planned(row: pd.Series, run: RunDir | None) -> float:
    """The summary's ``planned``; else the run's trace size (a summary rebuilt from records lacks it)."""
    value = pd.to_numeric(pd.Series([row.get("planned")]), errors="coerce").iloc[0]
    if np.isfinite(value):
        return float(value)
    trace = run.meta.get("trace") if run is not None else None
    if not isinstance(trace, Mapping):
        return np.nan
    n, warmup = trace.get("n"), trace.get("warmup")
    if isinstance(n, int) and isinstance(warmup, int) and is_open_loop(str(row.get("arm"))):
        return float(n + warmup)
    return np.nan


def account(summaries: pd.DataFrame, records: pd.DataFrame, runs: Sequence[RunDir]) -> pd.DataFrame:
    """One row per summary row (same index): the five counts, NaN where a source is missing.

    Counted by the load path's own rule (:func:`tailgate.records.account_stage`), from the send journal and the
    records on disk: ``sent`` from the journal (written before each request goes out); a run without a journal
    counts its records as sent, so ``lost_in_flight`` is then unknown (NaN), not zero.
    """
    by_name = {r.name: r for r in runs}
    recorded: dict[tuple[str, int], list[int]] = defaultdict(list)
    worker_lost: Counter[tuple[str, int]] = Counter()
    if len(records) and {"run_dir", "stage", "trace_id"} <= set(records.columns):
        ok = records["stage"].notna() & records["trace_id"].notna()
        lost_class = records["error_class"] == WORKER_LOST if "error_class" in records.columns else False
        rows = zip(records.loc[ok, "run_dir"].astype(str), records.loc[ok, "stage"].astype("int64"),
                   records.loc[ok, "trace_id"].astype("int64"), pd.Series(lost_class, index=records.index)[ok],
                   strict=True)  # fmt: skip
        for run, stage, trace, lost in rows:
            recorded[(run, int(stage))].append(int(trace))
            worker_lost[(run, int(stage))] += bool(lost)
    journals: dict[str, dict[int, list[int]]] = {}
    for run in runs:
        sent = read_sent(run.path)
        if sent:
            journals[run.name] = defaultdict(list)
            for stage, trace in sent:
                journals[run.name][stage].append(trace)
    out = []
    for _, row in summaries.iterrows():
        run_name = str(row.get("run_dir"))
        stage_value = pd.to_numeric(pd.Series([row.get("stage")]), errors="coerce").iloc[0]
        if not np.isfinite(stage_value):
            out.append(dict.fromkeys(COLUMNS, np.nan))
            continue
        key = (run_name, int(stage_value))
        planned = _planned(row, by_name.get(run_name))
        journal = journals.get(run_name)
        counts = account_stage(
            int(planned) if np.isfinite(planned) else None, journal.get(key[1], []) if journal is not None else None,
            recorded.get(key, []), worker_lost=worker_lost.get(key, 0),
        )  # fmt: skip
        out.append({c: np.nan if getattr(counts, c) is None else float(getattr(counts, c)) for c in COLUMNS})
    return pd.DataFrame(out, index=summaries.index, columns=list(COLUMNS))


__all__ = ["COLUMNS", "HEADERS", "account"]
