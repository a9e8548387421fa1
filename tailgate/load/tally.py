"""The master's in-memory view of a run's records, stage by stage, as the load processes report them.

A stage's summary is built from this, not from the record files: the files are the run's archive for the
analysis, and reading every one of them back at each stage end grew with the run and held the event loop
that timestamps the streams. Records reach the tally by the one path they already take to the master:

- one process: the order's DONE reply carries its records (in memory, nothing serialized);
- several: each batch the master writes to the record files (``tailgate_records``) and each ``worker_lost``
  record it writes for a lost share.

A row keeps every field a summary reads; the per-chunk lists (``--record-chunks``) are left out, since no
summary figure reads them and they are most of a record's size. One row per request, by the rule the files'
reader applies (:func:`tailgate.records.supersedes`), so the summary counts what the files hold.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tailgate.records import supersedes

CHUNK_LISTS = ("chunk_offsets_ms", "chunk_read_delays_ms", "chunk_read_offsets_ms")
"""Record fields no stage summary reads: kept in the files, left out of the tally."""


def summary_row(row: dict[str, Any]) -> dict[str, Any]:
    """A record as the tally keeps it: the same dict without its per-chunk lists (changed in place)."""
    for name in CHUNK_LISTS:
        row.pop(name, None)
    return row


class StageTally:
    """One row per (stage, request) of a run, from what the load processes reported."""

    def __init__(self) -> None:
        self._stages: dict[int, dict[int, dict[str, Any]]] = {}

    def add(self, row: dict[str, Any]) -> None:
        """Take one record (its chunk lists are dropped from this dict, which the caller has written already)."""
        rows = self._stages.setdefault(int(row["stage"]), {})
        trace_id = int(row["trace_id"])
        old = rows.get(trace_id)
        if old is None or supersedes(row, old):
            rows[trace_id] = summary_row(row)

    def add_many(self, rows: Iterable[dict[str, Any]]) -> None:
        for row in rows:
            self.add(row)

    def records(self, stage: int) -> list[dict[str, Any]]:
        """The stage's rows in trace order (no summary figure depends on the order)."""
        rows = self._stages.get(stage, {})
        return [rows[t] for t in sorted(rows)]

    def keys(self) -> set[tuple[int, int]]:
        """Every (stage, trace_id) recorded so far: with the send journal, what is still in flight."""
        return {(stage, trace_id) for stage, rows in self._stages.items() for trace_id in rows}
