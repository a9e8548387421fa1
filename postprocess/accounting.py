"""Where every planned request went, per cell: planned, sent, recorded, lost in flight, never sent.

A percentile is only as good as the population it was taken over. A cell that planned 500
requests and recorded 480 must say where the other 20 went, because each answer means something
different: *lost in flight* (sent, but the load generator stopped before writing its record: the
send journal is the witness) hides outcomes that may have been the slowest; *never sent* (the
stage was cut short, or arrivals were dropped above ``--max-in-flight``) only shrinks the sample.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import pandas as pd

from tailgate.arms import is_open_loop
from tailgate.postprocess.runfolders import RunDir
from tailgate.records import read_sent

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
    trace = run.meta.get("trace") if run is not None and isinstance(run.meta.get("trace"), dict) else {}
    n, warmup = trace.get("n"), trace.get("warmup")
    if isinstance(n, int) and isinstance(warmup, int) and is_open_loop(str(row.get("arm"))):
        return float(n + warmup)
    return np.nan


def account(summaries: pd.DataFrame, records: pd.DataFrame, runs: Sequence[RunDir]) -> pd.DataFrame:
    """One row per summary row (same index): the five counts, NaN where a source is missing.

    ``sent`` comes from the send journal (written before each request goes out); a run without a
    journal counts its records as sent, so ``lost_in_flight`` is then unknown (NaN), not zero.
    """
    by_name = {r.name: r for r in runs}
    recorded: Counter[tuple[str, int]] = Counter()
    if len(records) and {"run_dir", "stage"} <= set(records.columns):
        for (run, stage), count in records.groupby(["run_dir", "stage"], observed=True).size().items():
            recorded[(str(run), int(stage))] = int(count)
    journals: dict[str, Counter[int]] = {}
    for run in runs:
        journal = read_sent(run.path)
        if journal:
            journals[run.name] = Counter(stage for stage, _ in journal)
    out = []
    for _, row in summaries.iterrows():
        run_name = str(row.get("run_dir"))
        stage_value = pd.to_numeric(pd.Series([row.get("stage")]), errors="coerce").iloc[0]
        stage = int(stage_value) if np.isfinite(stage_value) else None
        got = recorded.get((run_name, stage), 0) if stage is not None else np.nan
        if stage is not None and run_name in journals:
            sent: float = journals[run_name].get(stage, 0)
            lost: float = max(0, sent - got)
        else:
            sent, lost = got, np.nan
        planned = _planned(row, by_name.get(run_name))
        never = planned - sent if np.isfinite(planned) and np.isfinite(sent) else np.nan
        out.append({"planned": planned, "sent": sent, "recorded": got, "lost_in_flight": lost, "never_sent": never})
    return pd.DataFrame(out, index=summaries.index, columns=list(COLUMNS))


__all__ = ["COLUMNS", "HEADERS", "account"]
