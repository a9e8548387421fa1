"""The load path's stage summary and the analysis's vectorised one follow the same rules.

Both iterate :data:`tailgate.stats.PERCENTILE_RULES`; this proves that the vectorised warm-up
selection, ordering and percentiles give the same numbers as the pure-Python reference on random
stages (ties in end times, failures, warm-up larger than the successes).
"""

from __future__ import annotations

import math

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st
from recordkit import records_of

from tailgate.postprocess.summarize import summaries_from_records
from tailgate.stats import PERCENTILE_RULES, WARMUP_RULES, summarize_stage

ERRORS = [None, None, None, "http_500", "stream_truncated"]


@st.composite
def stages(draw: st.DrawFn) -> list[dict]:
    n = draw(st.integers(min_value=1, max_value=60))
    ms = st.floats(min_value=0.0, max_value=5000.0, allow_nan=False)
    records = []
    for i in range(n):
        error = draw(st.sampled_from(ERRORS))
        end = float(draw(st.integers(min_value=0, max_value=20)))  # coarse: ties in completion order
        ok = error is None
        records.append(
            {
                "run_dir": "r", "stage": 0, "arm": "continuous", "rate_or_batch": 4.0, "stage_label": "cont_r4",
                "run_id": "x", "trace_id": i, "intended_s": i * 0.25, "sent_s": i * 0.25 + 0.001, "end_s": end,
                "ttft_ms": draw(ms) if ok else None, "worst_gap_ms": draw(ms) if ok else None,
                "total_ms": draw(ms) if ok else None, "ttft_from_intended_ms": draw(ms) if ok else None,
                "total_from_intended_ms": draw(ms) if ok else None, "schedule_lag_ms": draw(ms),
                "chunks": draw(st.integers(0, 50)) if ok else 0,
                "completion_tokens": draw(st.integers(0, 50)) if ok else None, "error_class": error,
            }
        )  # fmt: skip
    return records


@settings(max_examples=150, deadline=None)
@given(records=stages(), warmup=st.integers(min_value=0, max_value=30), rule=st.sampled_from(WARMUP_RULES))
def test_vectorised_summary_equals_the_load_path_summary(records: list[dict], warmup: int, rule: str) -> None:
    core = summarize_stage(
        records_of(records), arm="continuous", rate_or_batch=4.0, started="t", warmup=warmup, warmup_rule=rule
    )
    frame = pd.DataFrame(records)
    frame["error_class"] = frame["error_class"].astype(object)
    for column in ("ttft_ms", "worst_gap_ms", "total_ms", "ttft_from_intended_ms", "total_from_intended_ms",
                   "completion_tokens"):  # fmt: skip
        frame[column] = frame[column].astype(float)  # as the records loader types them
    (vec,) = summaries_from_records(frame, default_warmup=warmup, rule=rule)
    for key in ("n", "errors", "sent", "errors_by_class", "completion_tokens"):
        assert vec[key] == core[key], key
    for pr in PERCENTILE_RULES:
        want, got = core[pr.key], vec[pr.key]
        if want is None:
            assert got is None or math.isnan(got), pr.key
        else:
            assert got == want, pr.key  # same arithmetic, so the same rounded tenth
