"""Request records for tests that exercise the analysis of a few hand-made requests.

A test names the fields its case is about; the identity and plan every record carries get neutral values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tailgate.records import RECORD_FIELDS, RequestRecord

IDENTITY: dict[str, Any] = {
    "run_id": "test", "worker": "test-1", "trace_id": 0, "stage": 0, "stage_label": "cont_r1", "arm": "continuous",
    "rate_or_batch": 1.0, "batch": None, "prompt_tokens_planned": 200, "max_tokens": 100, "ignore_eos": True,
    "intended_s": 0.0, "sent_s": 0.0, "schedule_lag_ms": 0.0, "in_flight_at_send": 0,
}  # fmt: skip


def record(**fields: Any) -> RequestRecord:
    """A record with ``fields`` set and neutral values for the rest of what every record carries."""
    return RequestRecord(**{**IDENTITY, **fields})


def records_of(rows: Iterable[Mapping[str, Any]]) -> list[RequestRecord]:
    """Rows as a test writes them (only the fields its case is about, maybe frame-only columns besides) as records."""
    return [record(**{k: v for k, v in row.items() if k in RECORD_FIELDS}) for row in rows]
