"""The results table as the HTML page shows it: grouped columns with readable headers, marks on cells, and a key.

``table.md`` and ``table.csv`` keep the summary keys so a published table and ours line up; the page is read
by a person in a laptop window (1400 px) or on a phone, so its columns are grouped under what they measure,
a column with no data in any cell is left out with a sentence saying why, and every mark a cell carries
(``not a measurement``, ``partial``, ``cache hits``) is explained under the table that shows it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import pandas as pd

from tailgate.hoststeal import NOTABLE_SHARE

from .cellstats import finite
from .glossary import anchor, title

NOT_A_MEASUREMENT = "not a measurement"
PARTIAL = "partial"
CACHE_HITS = "cache hits"
CACHE_MARK_SHARE = 0.10
"""A prefix-cache hit rate from this share up marks the cell: its prompts were largely served from cache."""

MARK_EXPLANATIONS: dict[str, str] = {
    NOT_A_MEASUREMENT: (
        "the load generator read some of this cell's streams late and merged chunks the server had sent apart "
        "(column “merged by client”), so its worst-gap figures describe the client, not the server. Run it again "
        "with more --processes or on a quieter machine; charts draw it hollow."
    ),
    PARTIAL: (
        "the stage was stopped before its end (Stop, Ctrl-C, a lost load process); its figures cover only the "
        "requests that finished. Charts draw it hollow."
    ),
    CACHE_HITS: (
        f"at least {CACHE_MARK_SHARE:.0%} of the prompt tokens were served from vLLM's prefix cache (column "
        "“hit rate”), so the prefill stalls this suite measures are smaller than with distinct prompts "
        "(--prompts unique). Chart 1 marks its values with †; chart 2 names it under its bars."
    ),
}
IN_SHORT: dict[str, str] = {
    NOT_A_MEASUREMENT: "its worst gaps describe the load generator, not the server",
    PARTIAL: "its figures cover only the requests that finished before it was stopped",
}
"""What a mark means for an answer that uses the cell's latencies, in one clause."""
STEAL_EXPLANATION = (
    "the host's hypervisor took CPU from this machine during the cell (host steal), which paused the reads: "
    "more load processes cannot help."
)


@dataclass(frozen=True)
class Column:
    key: str
    group: str
    label: str
    """The header under its group."""
    full: str
    """Group and label in one phrase: the label a phone shows beside each value."""
    empty_reason: str = "no cell has a value"
    term: str = ""
    """The glossary entry its header links to (``glossary.TERMS``), where the label alone does not say it."""


COLUMNS: tuple[Column, ...] = (
    Column("cell", "", "cell", "cell"),
    Column("rate_or_batch", "load", "rate / B", "rate (req/s) or batch size"),
    Column("n", "load", "n", "measured requests"),
    Column("ttft_p50", "time to first token (ms)", "p50", "TTFT p50 (ms)"),
    Column("ttft_p99", "time to first token (ms)", "p99", "TTFT p99 (ms)"),
    Column("ttft_from_intended_p99", "time to first token (ms)", "p99 from intended send",
           "TTFT p99 from the intended send (ms)", "no record has an intended send time", "from-intended"),
    Column("gap_p50", "worst gap in a stream (ms)", "p50", "worst-gap p50 (ms)"),
    Column("gap_p99", "worst gap in a stream (ms)", "p99", "worst-gap p99 (ms)"),
    Column("total_p50", "total time (ms)", "p50", "total p50 (ms)"),
    Column("total_p99", "total time (ms)", "p99", "total p99 (ms)"),
    Column("server_pauses", "server-wide pauses", "events", "server-wide pauses (streams released together)"),
    Column("server_pause_max_ms", "server-wide pauses", "largest (ms)", "largest server-wide pause (ms)",
           "no cell had a pause shared by several streams"),
    Column("server_slow_gaps", "server-wide pauses", "slow server gaps", "server-side inter-token gaps over the "
           "latency histogram's first edge at or above 0.25 s (0.3 s on vLLM)",
           "absent: no inter-token latency histogram was read per cell"),
    Column("errors", "", "errors", "failed requests"),
    Column("preemptions_prometheus", "preemptions", "Prometheus", "preemptions (Prometheus)",
           "no Prometheus scraped the server during these runs"),
    Column("preemptions_direct", "preemptions", "direct reads", "preemptions (direct /metrics reads)",
           "the load generator did not read the server's /metrics (--no-metrics)"),
    Column("prefix_hit_rate", "prefix cache", "hit rate", "prefix-cache hit rate",
           "the server exported no prefix-cache counters, or none of its prompts were looked up"),
    Column("schedule_lag_p99", "load generator", "lag p99 (ms)", "schedule lag p99 (ms)",
           "the records carry no schedule lag", "schedule-lag"),
    Column("client_coalesced_streams", "load generator", "merged by client", "streams merged by the client",
           "these records predate the merged-stream check", "merged-by-client"),
    Column("prompts", "", "prompts", "prompt source"),
)  # fmt: skip
"""Page columns in order; ``config`` and ``arm`` are in the cell's name (``nochunk_cont_r2``), as the key says."""
ACCOUNTING: tuple[Column, ...] = (
    Column("cell", "", "cell", "cell"),
    Column("planned", "", "planned", "planned"),
    Column("sent", "", "sent", "sent"),
    Column("recorded", "", "recorded", "recorded"),
    Column("lost_in_flight", "", "lost in flight", "lost in flight"),
    Column("never_sent", "", "never sent", "never sent"),
)
"""The Requests-per-cell table's columns."""

TEXT_COLUMNS = frozenset({"cell", "prompts"})
CELL_NAME_KEY = (
    "A cell is named configuration_arm: chunked (chunked prefill on, the engine default), nochunk (off) or "
    "preempt (a small KV pool, to cause preemptions), then cont_r2 (continuous arrivals at 2 req/s) or "
    "gated_b16 (gated batches of 16); the same name is the cell's folder and its name in the console."
)


def cell_marks(row: Mapping[str, Any]) -> list[str]:
    """The marks a cell carries, in the order the key explains them."""
    marks = []
    if (finite(row.get("client_coalesced_streams")) or 0) > 0:
        marks.append(NOT_A_MEASUREMENT)
    if row.get("partial") is True:
        marks.append(PARTIAL)
    if (finite(row.get("prefix_hit_rate")) or 0) >= CACHE_MARK_SHARE:
        marks.append(CACHE_HITS)
    return marks


def not_measured(row: Mapping[str, Any]) -> bool:
    """True when the cell's figures do not stand for the server: the client merged chunks, or it stopped early."""
    return bool({NOT_A_MEASUREMENT, PARTIAL} & set(cell_marks(row)))


def host_stole(row: Mapping[str, Any]) -> bool:
    steal = finite(row.get("host_steal_share"))
    return steal is not None and steal >= NOTABLE_SHARE


def _empty(series: pd.Series) -> bool:
    values = series.map(lambda v: None if isinstance(v, str) and not v else v)
    return (
        bool(pd.to_numeric(values, errors="coerce").isna().all()) and not values.map(lambda v: isinstance(v, str)).any()
    )


def page_columns(table: pd.DataFrame) -> tuple[list[Column], list[str]]:
    """The columns worth showing, and one sentence per column left out."""
    shown, hidden = [], []
    for col in COLUMNS:
        if col.key not in table.columns:
            continue
        if col.key == "prompts" and set(table["prompts"].dropna().astype(str)) <= {"seed"}:
            hidden.append("prompt source: every cell used the seed's filler prompts")
            continue
        if col.key not in ("cell", "n") and _empty(table[col.key]):
            hidden.append(f"{col.full}: {col.empty_reason}")
            continue
        shown.append(col)
    return shown, hidden


GROUP_TERMS: dict[str, str] = {
    "time to first token (ms)": "ttft",
    "worst gap in a stream (ms)": "worst-gap",
    "server-wide pauses": "server-pauses",
    "preemptions": "preemptions",
}
"""The glossary entry each column group's header links to."""


class TermLink(TypedDict):
    term: str
    title: str


class GroupView(TypedDict):
    """A header over a run of columns of one group."""

    label: str
    span: int
    term: str
    title: str


class HeaderView(TypedDict):
    label: str
    grouped: bool
    term: str
    title: str


class CellView(TypedDict):
    text: str
    numeric: bool
    label: str
    marks: list[str]


class RowView(TypedDict):
    disagree: bool
    lost: bool
    cells: list[CellView]
    stolen: bool


class KeyEntry(TypedDict):
    mark: str
    text: str


class ViewContext(TypedDict):
    """One table as ``templates/table.html.j2`` draws it."""

    groups: list[GroupView]
    headers: list[HeaderView]
    rows: list[RowView]
    hidden: list[str]
    key: list[KeyEntry]
    names: str


class TableContext(ViewContext):
    """The results table and, under ``accounting``, the requests-per-cell table."""

    accounting: ViewContext


def _term(key: str) -> TermLink:
    """A header's link to its glossary entry, and the entry as a tooltip (empty when it has none)."""
    return {"term": anchor(key), "title": title(key)} if key else {"term": "", "title": ""}


def _groups(cols: Sequence[Column]) -> list[GroupView]:
    out: list[GroupView] = []
    for c in cols:
        if out and c.group and out[-1]["label"] == c.group:
            out[-1]["span"] += 1
        else:
            out.append({"label": c.group, "span": 1, **_term(GROUP_TERMS.get(c.group, ""))})
    return out


def view_context(
    table: pd.DataFrame,
    fmt: Callable[[str, Any], str],
    *,
    with_key: bool = True,
    columns: Sequence[Column] | None = None,
) -> ViewContext:
    """Groups, headers, rows (cells with marks), hidden-column sentences and the key of marks that appear."""
    if columns is None:
        cols, hidden = page_columns(table)
    else:
        cols, hidden = [c for c in columns if c.key in table.columns], []
    rows: list[RowView] = []
    seen: list[str] = []
    for d in table.to_dict("records"):
        marks = cell_marks(d)
        seen += [m for m in marks if m not in seen]
        cells: list[CellView] = [
            {"text": fmt(c.key, d.get(c.key)), "numeric": c.key not in TEXT_COLUMNS, "label": c.full,
             "marks": marks if c.key == "cell" else []}
            for c in cols
        ]  # fmt: skip
        lost = finite(d.get("lost_in_flight")) or 0
        rows.append({"disagree": d.get("preemptions_disagree") is True, "lost": lost > 0, "cells": cells,
                     "stolen": host_stole(d) and NOT_A_MEASUREMENT in marks})  # fmt: skip
    key: list[KeyEntry] = [{"mark": m, "text": MARK_EXPLANATIONS[m]} for m in seen] if with_key else []
    if with_key and any(r["stolen"] for r in rows):
        key.append({"mark": "host steal", "text": STEAL_EXPLANATION})
    grouped = any(c.group for c in cols)
    return {
        "groups": _groups(cols) if grouped else [],
        "headers": [{"label": c.label, "grouped": bool(c.group), **_term(c.term)} for c in cols],
        "rows": rows,
        "hidden": hidden,
        "key": key,
        "names": CELL_NAME_KEY if with_key else "",
    }
