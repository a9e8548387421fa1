"""Server-wide pauses per cell, from the records alone.

A pause inside the engine (a compilation, a graph capture, an allocator growth, a long scheduler step) holds
every stream that is decoding at that moment, and releases them together: the next chunk of each arrives at
(nearly) the same instant. So a pause the server gave many streams at once shows in the records as several
streams whose worst gap ends at the same moment, which independent slow streams (a slow connection, a
client that read late, one long prefill next to it) almost never do.

The rule, per cell (all its records, warm-up included: a pause is a fact about the server whenever it fell):

- a stream takes part when its worst gap is at least :data:`PAUSE_FLOOR_MS` (100 ms: ten decode steps of a
  GPU, far above a healthy stream's gaps, well below the ~300 ms first-time pauses seen on an H200);
- worst gaps ending within :data:`ALIGN_MS` (10 ms, a tenth of the floor) of the first one of a group are one
  event: the server releases its streams in one step, and the client stamps them a few ms apart at most;
- an event is the server's when at least :data:`MIN_STREAMS` streams share it, or at least two and
  :data:`MIN_SHARE` of the streams that were streaming across it (first chunk before the pause began, end
  after it ended): three coincident worst gaps of 100 ms or more are not chance, and at low load a pause may
  catch only two or three streams;
- its size is the shortest of its streams' gaps: the time every one of them waited (each stream's own gap
  adds the part of its normal gap that had passed when the pause began).

Only each stream's worst gap is recorded, so a pause shorter than some streams' own worst gap is missed for
those streams: the counts are lower bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypedDict, cast

import numpy as np
import pandas as pd

PAUSE_FLOOR_MS = 100.0
ALIGN_MS = 10.0
MIN_STREAMS = 3
MIN_SHARE = 0.2
PAUSE_COLUMNS: tuple[str, ...] = ("server_pauses", "server_pause_max_ms", "server_slow_gaps")
"""Per cell: shared-pause events, the largest one (ms), and the server's own count of slow inter-token gaps
from its latency histogram (NaN where the run has no such snapshot: absent, not zero)."""
ITL_GAPS_KEY = "server_slow_gaps_delta"
"""A stage summary's server-side count of inter-token gaps over the histogram's first edge at or above
0.25 s (``server_slow_gap_edge_s``; 0.3 s on vLLM's buckets), where the load path read it."""


@dataclass(frozen=True)
class Pause:
    end_s: float
    """When the streams were released (the first of the group's worst-gap ends), epoch seconds."""
    streams: int
    streaming: int
    """Streams that were streaming across the pause (the share's denominator)."""
    pause_ms: float


def server_pauses(records: pd.DataFrame) -> list[Pause]:
    """The shared-pause events in one cell's records (the rule is the module's docstring)."""
    need = ("worst_gap_ms", "worst_gap_end_s")
    if records.empty or any(c not in records.columns for c in need):
        return []
    gap = pd.to_numeric(records["worst_gap_ms"], errors="coerce").to_numpy(dtype=float)
    end = pd.to_numeric(records["worst_gap_end_s"], errors="coerce").to_numpy(dtype=float)
    take = np.isfinite(gap) & np.isfinite(end) & (gap >= PAUSE_FLOOR_MS)
    if take.sum() < 2:
        return []
    first = _column(records, "first_chunk_s")
    last = _column(records, "end_s")
    order = np.argsort(end[take], kind="stable")
    ends, gaps = end[take][order], gap[take][order]
    events: list[Pause] = []
    i = 0
    while i < len(ends):
        j = i
        while j + 1 < len(ends) and (ends[j + 1] - ends[i]) * 1000.0 <= ALIGN_MS:
            j += 1
        group = slice(i, j + 1)
        n = j - i + 1
        released, shortest = float(ends[i]), float(gaps[group].min())
        began = released - shortest / 1000.0
        streaming = int(np.sum((first <= began) & (last >= released)))
        streaming = max(streaming, n)
        if n >= 2 and (n >= MIN_STREAMS or n >= MIN_SHARE * streaming):
            events.append(Pause(released, n, streaming, round(shortest, 1)))
        i = j + 1
    return events


def _column(records: pd.DataFrame, name: str) -> np.ndarray:
    if name not in records.columns:
        return np.full(len(records), np.nan)
    column: np.ndarray = pd.to_numeric(records[name], errors="coerce").to_numpy(dtype=float)
    return column


def cell_pauses(summaries: pd.DataFrame, records: pd.DataFrame) -> pd.DataFrame:
    """:data:`PAUSE_COLUMNS` for each summary row (a cell's stage), in the summaries' order."""
    out = pd.DataFrame(index=summaries.index, columns=list(PAUSE_COLUMNS), dtype=float)
    keys = [k for k in ("run_dir", "stage") if k in records.columns and k in summaries.columns]
    groups = {k if isinstance(k, tuple) else (k,): g for k, g in records.groupby(keys, observed=True)} if keys else {}
    for idx, row in summaries.iterrows():
        key = tuple(_plain(row[k]) for k in keys)
        found = next((g for k, g in groups.items() if tuple(_plain(x) for x in k) == key), None)
        events = server_pauses(found) if found is not None else []
        out.at[idx, "server_pauses"] = float(len(events))
        out.at[idx, "server_pause_max_ms"] = max((e.pause_ms for e in events), default=np.nan)
        itl = pd.to_numeric(pd.Series([row.get(ITL_GAPS_KEY)]), errors="coerce").iloc[0]
        out.at[idx, "server_slow_gaps"] = itl
    return out


def _plain(x: Any) -> Any:
    if isinstance(x, (np.integer,)):
        return int(x)
    return str(x) if not isinstance(x, (int, float)) else x


def pause_lines(table: pd.DataFrame) -> list[str]:
    """The diagnosis's sentences: each cell where the server paused many streams at once (none: no line)."""
    if "server_pauses" not in table.columns:
        return []
    said = []
    for r in table.to_dict("records"):
        count = r.get("server_pauses")
        if not isinstance(count, (int, float)) or not math.isfinite(count) or count < 1:
            continue
        said.append(f"{r['cell']}: {int(count)} (largest {float(r['server_pause_max_ms']):.0f} ms)")
    if not said:
        return []
    return [
        "Server-wide pauses (several streams' worst gaps ending at the same instant, each "
        f"{PAUSE_FLOOR_MS:.0f} ms or more): " + "; ".join(said) + ". These gaps are the server's, not the "
        "client's or the network's."
    ]


class PauseRow(TypedDict, total=False):
    """A cell with server-wide pauses, with whichever of the pause columns the table has."""

    cell: str
    server_pauses: float
    server_pause_max_ms: float
    server_slow_gaps: float


class PauseEvidence(TypedDict):
    server_pauses: list[PauseRow]


def pause_evidence(table: pd.DataFrame) -> PauseEvidence:
    cols = ["cell", *PAUSE_COLUMNS]
    have = table[[c for c in cols if c in table.columns]]
    rows = have.loc[pd.to_numeric(have.get("server_pauses"), errors="coerce") > 0].to_dict("records")
    return {"server_pauses": cast("list[PauseRow]", rows)}


__all__ = ["PAUSE_COLUMNS", "Pause", "cell_pauses", "pause_evidence", "pause_lines", "server_pauses"]
