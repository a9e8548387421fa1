"""The seed's results table over every cell, as Markdown and CSV.

Column names are the seed's summary keys so that a published table and ours line up; the
extra columns are what the seed could not measure: both preemption sources, latency from the
intended send (coordinated omission) and the generator's schedule lag.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

TABLE_COLUMNS: tuple[str, ...] = (
    "cell", "config", "arm", "rate_or_batch", "n",
    "ttft_p50", "ttft_p99", "gap_p50", "gap_p99", "total_p50", "total_p99",
    "preemptions_prometheus", "preemptions_direct", "errors",
    "ttft_from_intended_p99", "schedule_lag_p99", "client_coalesced_streams",
)  # fmt: skip
"""The Markdown table; the CSV adds :data:`CSV_EXTRA`."""
NOT_A_MEASUREMENT = " (not a measurement)"
"""Appended to a cell's name where the client read late and merged chunks: its gaps describe the client."""
CSV_EXTRA: tuple[str, ...] = (
    "run_dir", "run_id", "stage", "stage_label", "preemptions_source", "preemptions_disagree",
    "lost_in_flight", "achieved_rate", "sent", "warmup", "warmup_rule", "summary_source",
)  # fmt: skip
HEADERS: dict[str, str] = {
    "rate_or_batch": "rate / B",
    "ttft_p50": "ttft_p50 ms",
    "ttft_p99": "ttft_p99 ms",
    "gap_p50": "gap_p50 ms",
    "gap_p99": "gap_p99 ms",
    "total_p50": "total_p50 ms",
    "total_p99": "total_p99 ms",
    "preemptions_prometheus": "preempt. (Prometheus)",
    "preemptions_direct": "preempt. (direct)",
    "ttft_from_intended_p99": "ttft_from_intended_p99 ms",
    "schedule_lag_p99": "schedule_lag_p99 ms",
    "client_coalesced_streams": "coalesced by client",
}


def summary_table(summaries: pd.DataFrame, preemptions: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per cell in display order, numbers exactly as the summaries hold them.

    Without server data the direct column falls back to the summaries' own ``preemptions_delta``
    (the load path's before/after reads), so a table never needs Prometheus.
    """
    df = summaries.copy()
    if preemptions is not None and len(preemptions):
        keep = ["run_dir", "stage", "preemptions_prometheus", "preemptions_direct", "preemptions_source",
                "preemptions_disagree"]  # fmt: skip
        p = preemptions[keep].copy()
        df = df.merge(p, on=["run_dir", "stage"], how="left", suffixes=("_summary", ""))
    else:
        df["preemptions_prometheus"] = np.nan
        df["preemptions_direct"] = pd.to_numeric(df.get("preemptions_delta"), errors="coerce")
        df["preemptions_source"] = np.where(df["preemptions_direct"].notna(), "direct_scrape", "none")
        df["preemptions_disagree"] = False
    for c in (*TABLE_COLUMNS, *CSV_EXTRA):
        if c not in df.columns:
            df[c] = np.nan
    for c in ("preemptions_prometheus", "preemptions_direct"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df[[*TABLE_COLUMNS, *CSV_EXTRA]].reset_index(drop=True)


def _fmt(column: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if column in ("n", "errors", "sent", "lost_in_flight", "stage", "warmup", "client_coalesced_streams"):
        return str(int(value))
    if column == "rate_or_batch":
        v = float(value)
        return str(int(v)) if v.is_integer() else f"{v:g}"
    if column.startswith("preemptions_") and isinstance(value, (int, float, np.floating)):
        v = float(value)
        return str(int(v)) if v.is_integer() else f"{v:.1f}"
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.1f}"
    return str(value)


def table_markdown(table: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table of :data:`TABLE_COLUMNS` (numeric columns right-aligned)."""
    cols = list(TABLE_COLUMNS)
    head = "| " + " | ".join(HEADERS.get(c, c) for c in cols) + " |"
    align = "|" + "|".join("---" if c in ("cell", "config", "arm") else "---:" for c in cols) + "|"
    lines = [head, align]
    for row in table[cols].itertuples(index=False):
        cells = [_fmt(c, v) for c, v in zip(cols, row, strict=True)]
        cells[0] += _measurement_mark(row._asdict())
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _measurement_mark(row: dict[str, Any]) -> str:
    """:data:`NOT_A_MEASUREMENT` for a cell with streams the client coalesced (absent counts: old records)."""
    value = row.get("client_coalesced_streams")
    try:
        return NOT_A_MEASUREMENT if value is not None and float(value) > 0 else ""
    except (TypeError, ValueError):
        return ""


def table_html(table: pd.DataFrame) -> str:
    """The Markdown table's content as an HTML ``<table>`` for the self-contained report."""
    from html import escape

    cols = list(TABLE_COLUMNS)
    out = ['<table class="cells">', "<thead><tr>"]
    out += [f"<th>{escape(HEADERS.get(c, c))}</th>" for c in cols]
    out.append("</tr></thead><tbody>")
    for row in table.itertuples(index=False):
        d = row._asdict()
        flag = ' class="disagree"' if bool(d.get("preemptions_disagree")) is True else ""
        out.append(f"<tr{flag}>")
        for c in cols:
            cls = "" if c in ("cell", "config", "arm") else ' class="num"'
            mark = _measurement_mark(d) if c == "cell" else ""
            out.append(f"<td{cls}>{escape(_fmt(c, d[c]) + mark)}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def write_table(table: pd.DataFrame, out_dir: str | Path) -> tuple[Path, Path]:
    """``table.md`` and ``table.csv`` (the CSV keeps full precision and the extra columns)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md = out / "table.md"
    md.write_text(table_markdown(table), encoding="utf-8")
    path_csv = out / "table.csv"
    table.to_csv(path_csv, index=False)
    return md, path_csv


def _continuous_rates(table: pd.DataFrame, config: str | None = None) -> set[float]:
    d = table.loc[table["arm"] == "continuous"]
    if config is not None:
        d = d.loc[d["config"] == config]
    return {float(r) for r in d["rate_or_batch"].dropna()}


def choose_decision_rate(table: pd.DataFrame, requested: float | None = None) -> float | None:
    """The rate the seed's decision chart compares at.

    Default: the highest rate measured with chunked prefill both on and off (the comparison the
    chart exists for), else 10 req/s if measured (the seed's knee), else the highest continuous
    rate. None when no continuous cell exists. A requested rate must have been measured.
    """
    from tailgate.postprocess.load import ResultsError, rate_text

    every = _continuous_rates(table)
    if requested is not None:
        if not any(math.isclose(requested, r) for r in every):
            have = ", ".join(rate_text(r) for r in sorted(every)) or "none"
            raise ResultsError(f"no continuous cell at rate {rate_text(requested)} (rates measured: {have})")
        return float(requested)
    both = _continuous_rates(table, "chunked") & _continuous_rates(table, "nochunk")
    if both:
        return max(both)
    if any(math.isclose(10.0, r) for r in every):
        return 10.0
    return max(every) if every else None
