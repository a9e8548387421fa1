"""The seed's results table over every cell, as Markdown and CSV.

Column names are the seed's summary keys so that a published table and ours line up; the
extra columns are what the seed could not measure: both preemption sources, latency from the
intended send (coordinated omission) and the generator's schedule lag.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from tailgate.arms import OPEN_LOOP
from tailgate.clientbound import merged_breached
from tailgate.hoststeal import NOTABLE_SHARE
from tailgate.resultfiles import TABLE_CSV, TABLE_MD
from tailgate.serverconfigs import CHUNKED_PAIR

if TYPE_CHECKING:
    from .tableview import TableContext

TABLE_COLUMNS: tuple[str, ...] = (
    "cell", "config", "arm", "rate_or_batch", "n",
    "ttft_p50", "ttft_p99", "gap_p50", "gap_p99", "total_p50", "total_p99",
    "preemptions_prometheus", "preemptions_direct", "errors",
    "ttft_from_intended_p99", "schedule_lag_p99", "client_coalesced_streams", "prompts", "prefix_hit_rate",
    "server_pauses", "server_pause_max_ms", "server_slow_gaps",
)  # fmt: skip
"""The Markdown table; the CSV adds :data:`CSV_EXTRA`."""
NOT_A_MEASUREMENT = " (not a measurement)"
"""Appended to a cell's name where the client read late and merged chunks: its gaps describe the client."""
CSV_EXTRA: tuple[str, ...] = (
    "run_dir", "run_id", "stage", "stage_label", "preemptions_source", "preemptions_disagree",
    "lost_in_flight", "achieved_rate", "sent", "warmup", "warmup_rule", "summary_source",
    "planned", "recorded", "never_sent", "endpoint", "arrivals", "prefix_cache_hit_rate",
    "prefix_cache_hit_rate_prometheus", "prefix_cache_queries_delta", "prefix_cache_hits_delta",
    "prompt_tokens_checked", "prompt_tokens_exact", "prompt_tokens_diff_max", "host_steal_share", "partial",
    "chunk_stamp", "capture_drops",
)  # fmt: skip
ACCOUNTING_COLUMNS: tuple[str, ...] = ("cell", "planned", "sent", "recorded", "lost_in_flight", "never_sent")
"""Where each cell's planned requests went (``postprocess/accounting.py``): a second table."""
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
    "prefix_hit_rate": "prefix-cache hit rate",
    "server_pauses": "server pauses",
    "server_pause_max_ms": "largest server pause ms",
    "server_slow_gaps": "server gaps over 0.25-0.3 s",
}


def summary_table(summaries: pd.DataFrame, preemptions: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per cell in display order, numbers exactly as the summaries hold them.

    Without server data the direct column falls back to the summaries' own ``preemptions_delta``
    (the load path's before/after reads), so a table never needs Prometheus.
    """
    df = summaries.copy()
    if preemptions is not None and len(preemptions):
        keep = ["run_dir", "stage", "preemptions_prometheus", "preemptions_direct", "preemptions_source",
                "preemptions_disagree", "prefix_cache_hit_rate_prometheus"]  # fmt: skip
        p = preemptions[[c for c in keep if c in preemptions.columns]].copy()
        df = df.merge(p, on=["run_dir", "stage"], how="left", suffixes=("_summary", ""))
    else:
        df["preemptions_prometheus"] = np.nan
        df["preemptions_direct"] = pd.to_numeric(df.get("preemptions_delta"), errors="coerce")
        df["preemptions_source"] = np.where(df["preemptions_direct"].notna(), "direct_scrape", "none")
        df["preemptions_disagree"] = False
    for c in (*TABLE_COLUMNS, *CSV_EXTRA):
        if c not in df.columns:
            df[c] = np.nan
    for c in ("preemptions_prometheus", "preemptions_direct", "prefix_cache_hit_rate",
              "prefix_cache_hit_rate_prometheus"):  # fmt: skip
        df[c] = pd.to_numeric(df[c], errors="coerce")
    # Prometheus when it saw the stage, else the load path's own before/after reads (as for preemptions)
    df["prefix_hit_rate"] = df["prefix_cache_hit_rate_prometheus"].where(
        df["prefix_cache_hit_rate_prometheus"].notna(), df["prefix_cache_hit_rate"]
    )
    df["prompts"] = df["prompts"].where(df["prompts"].notna(), "seed")
    return df[[*TABLE_COLUMNS, *CSV_EXTRA]].reset_index(drop=True)


def _fmt(column: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "absent" if column == "server_slow_gaps" else "–"  # no histogram snapshot: not zero
    if column in (
        "n",
        "errors",
        "sent",
        "lost_in_flight",
        "stage",
        "warmup",
        "planned",
        "recorded",
        "never_sent",
        "client_coalesced_streams",
        "server_pauses",
        "server_slow_gaps",
    ):
        return str(int(value))
    if column.startswith("prefix_") and "hit_rate" in column and isinstance(value, (int, float, np.floating)):
        return f"{100 * float(value):.1f}%"
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
    align = "|" + "|".join("---" if c in ("cell", "config", "arm", "prompts") else "---:" for c in cols) + "|"
    lines = [head, align]
    marks = [*cols, "host_steal_share"] if "host_steal_share" in table.columns else cols
    for row in table[marks].itertuples(index=False):
        d = row._asdict()
        cells = [_fmt(c, d[c]) for c in cols]
        cells[0] += _measurement_mark(d.get("client_coalesced_streams"), d.get("host_steal_share"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


ACCOUNTING_HEADERS: dict[str, str] = {"lost_in_flight": "lost in flight", "never_sent": "never sent"}


def _measurement_mark(value: Any, steal: Any) -> str:
    """:data:`NOT_A_MEASUREMENT` for a cell with streams the client coalesced (``value``; absent counts: old
    records), naming the host when the hypervisor stole a notable share (``steal``) of the machine's CPU during
    the cell."""
    try:
        if value is None or not merged_breached(float(value)):
            return ""
    except (TypeError, ValueError):
        return ""
    if isinstance(steal, (int, float, np.floating)) and math.isfinite(steal) and steal >= NOTABLE_SHARE:
        return f"{NOT_A_MEASUREMENT[:-1]}: the host stole {float(steal):.0%} of the CPU)"
    return NOT_A_MEASUREMENT


def table_context(table: pd.DataFrame) -> TableContext:
    """Both tables as the page shows them (``postprocess/tableview.py``), for ``templates/table.html.j2``."""
    from .tableview import ACCOUNTING, view_context

    return {**view_context(table, _fmt), "accounting": view_context(table, _fmt, with_key=False, columns=ACCOUNTING)}


def accounting_markdown(table: pd.DataFrame) -> str:
    """Planned / sent / recorded / lost in flight / never sent per cell, as Markdown."""
    cols = list(ACCOUNTING_COLUMNS)
    lines = ["| " + " | ".join(ACCOUNTING_HEADERS.get(c, c) for c in cols) + " |",
             "|" + "|".join("---" if c == "cell" else "---:" for c in cols) + "|"]  # fmt: skip
    for row in table.itertuples(index=False):
        d = row._asdict()
        lines.append("| " + " | ".join(_fmt(c, d.get(c)) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def write_table(table: pd.DataFrame, out_dir: str | Path) -> tuple[Path, Path]:
    """``table.md`` and ``table.csv`` (the CSV keeps full precision and the extra columns)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md = out / TABLE_MD
    text = table_markdown(table)
    if all(c in table.columns for c in ACCOUNTING_COLUMNS):
        text += "\nRequests per cell (sent: the send journal; lost in flight: sent, never recorded):\n\n"
        text += accounting_markdown(table)
    md.write_text(text, encoding="utf-8")
    path_csv = out / TABLE_CSV
    table.to_csv(path_csv, index=False)
    return md, path_csv


def _continuous_rates(table: pd.DataFrame, config: str | None = None) -> set[float]:
    d = table.loc[table["arm"].isin(OPEN_LOOP)]
    if config is not None:
        d = d.loc[d["config"] == config]
    return {float(r) for r in d["rate_or_batch"].dropna()}


def choose_decision_rate(table: pd.DataFrame, requested: float | None = None) -> float | None:
    """The rate the seed's decision chart compares at.

    Default: the highest rate measured with chunked prefill both on and off (the comparison the
    chart exists for), else 10 req/s if measured (the seed's knee), else the highest continuous
    rate. None when no continuous cell exists. A requested rate must have been measured.
    """
    from .runfolders import ResultsError, rate_text

    every = _continuous_rates(table)
    if requested is not None:
        if not any(math.isclose(requested, r) for r in every):
            have = ", ".join(rate_text(r) for r in sorted(every)) or "none"
            raise ResultsError(f"no continuous cell at rate {rate_text(requested)} (rates measured: {have})")
        return float(requested)
    on, off = CHUNKED_PAIR
    both = _continuous_rates(table, on.name) & _continuous_rates(table, off.name)
    if both:
        return max(both)
    if any(math.isclose(10.0, r) for r in every):
        return 10.0
    return max(every) if every else None
