"""The master's in-memory view of a run's records, stage by stage, as the load processes report them.

A stage's summary is built from this, not from the record files: the files are the run's archive for the
analysis, and reading every one of them back at each stage end grew with the run and held the event loop
that timestamps the streams. Records reach the tally by the one path they already take to the master:

- one process: the order's DONE reply carries its records (in memory, nothing serialized);
- several: each batch the master writes to the record files (``tailgate_records``) and each ``worker_lost``
  record it writes for a lost share.

The tally keeps each record without its per-chunk lists (``--record-chunks``,
:meth:`~tailgate.records.RequestRecord.for_summary`), since no summary figure reads them and they are most of a
record's size. One record per request, by the rule the files' reader applies
(:func:`tailgate.records.supersedes`), so the summary counts what the files hold.
"""

from __future__ import annotations

from collections.abc import Iterable

from tailgate.records import RequestRecord, supersedes


class StageTally:
    """One record per (stage, request) of a run, from what the load processes reported."""

    def __init__(self) -> None:
        self._stages: dict[int, dict[int, RequestRecord]] = {}

    def add(self, record: RequestRecord) -> None:
        rows = self._stages.setdefault(record.stage, {})
        old = rows.get(record.trace_id)
        if old is None or supersedes(record, old):
            rows[record.trace_id] = record.for_summary()

    def add_many(self, records: Iterable[RequestRecord]) -> None:
        for record in records:
            self.add(record)

    def records(self, stage: int) -> list[RequestRecord]:
        """The stage's rows in trace order (no summary figure depends on the order)."""
        rows = self._stages.get(stage, {})
        return [rows[t] for t in sorted(rows)]

    def keys(self) -> set[tuple[int, int]]:
        """Every (stage, trace_id) recorded so far: with the send journal, what is still in flight."""
        return {(stage, trace_id) for stage, rows in self._stages.items() for trace_id in rows}
