from __future__ import annotations

import random

import numpy as np
import pytest
from recordkit import record

from tailgate.records import RequestRecord
from tailgate.stats import SEED_SUMMARY_KEYS, measured_records, percentile, summarize_stage


@pytest.mark.parametrize("n", [1, 2, 3, 10, 500, 501])
@pytest.mark.parametrize("p", [0, 1, 50, 90, 99, 99.9, 100])
def test_percentile_is_numpy_linear(n: int, p: float) -> None:
    rng = random.Random(n)
    xs = [rng.expovariate(1.0) * 100 for _ in range(n)]
    assert percentile(xs, p) == pytest.approx(float(np.percentile(xs, p)), rel=1e-12)


def test_percentile_of_nothing_is_none() -> None:
    assert percentile([], 50) is None


def rec(trace_id: int, end: float, ttft: float = 10.0, error: str | None = None) -> RequestRecord:
    return record(
        trace_id=trace_id, end_s=end, intended_s=float(trace_id), sent_s=float(trace_id),
        ttft_ms=None if error else ttft, worst_gap_ms=None if error else ttft / 2,
        total_ms=None if error else ttft * 3, ttft_from_intended_ms=None if error else ttft + 1,
        total_from_intended_ms=None if error else ttft * 3 + 1, schedule_lag_ms=0.2,
        chunks=0 if error else 5, completion_tokens=None if error else 5, error_class=error,
    )  # fmt: skip


def test_completion_rule_drops_first_successes_to_finish() -> None:
    # trace item 0 finishes last; the harness drops by completion order, not by id
    records = [rec(0, 100.0), rec(1, 1.0), rec(2, 2.0, error="http_500"), rec(3, 3.0), rec(4, 4.0)]
    kept = measured_records(records, 2, "completion")
    assert [r.trace_id for r in kept] == [4, 0]
    kept = measured_records(records, 2, "trace")
    assert [r.trace_id for r in kept] == [3, 4]


def test_summary_has_seed_keys_first_and_counts_errors() -> None:
    records = [rec(i, float(i), ttft=float(i)) for i in range(30)] + [rec(30, 31.0, error="stream_truncated")]
    s = summarize_stage(records, arm="continuous", rate_or_batch=5.0, started="t", warmup=25)
    assert tuple(s)[: len(SEED_SUMMARY_KEYS)] == SEED_SUMMARY_KEYS
    assert s["n"] == 5 and s["errors"] == 1 and s["errors_by_class"] == {"stream_truncated": 1}
    assert s["ttft_p50"] == 27.0 and s["ttft_p99"] == round(float(np.percentile([25, 26, 27, 28, 29], 99)), 1)
    assert s["sent"] == 31 and s["achieved_rate"] == pytest.approx(1.0)


def test_the_worst_gap_is_one_rule_for_live_reads_and_capture_times() -> None:
    from tailgate.stats import wider_gap, worst_gap

    assert worst_gap([]) == (0, None) and worst_gap([5]) == (0, None)
    assert worst_gap([0, 10, 40, 50, 80]) == (30, 40)  # a tie keeps the earlier gap
    assert worst_gap([7, 7, 7]) == (0, None)  # chunks of one read: no gap
    # as the client meets them, one read at a time
    assert wider_gap(0, None, 3, 9) == (6, 9) and wider_gap(6, 9, 9, 30) == (21, 30)
    assert wider_gap(21, 30, 30, 31) == (21, 30) and wider_gap(21, 30, 31, 60) == (29, 60)
    assert worst_gap([3, 9, 30, 31, 60]) == (29, 60)
