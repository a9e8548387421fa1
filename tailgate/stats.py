"""Percentiles and the per-stage summary, with the reference harness's exact rules.

Pure Python on purpose: the load path writes summaries without pandas or numpy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

SEED_SUMMARY_KEYS: tuple[str, ...] = (
    "arm", "n", "started", "rate_or_batch",
    "ttft_p50", "ttft_p99", "gap_p50", "gap_p99", "total_p50", "total_p99",
    "preemptions_delta", "errors",
)  # fmt: skip

WARMUP_RULES = ("completion", "trace")


def percentile(values: Sequence[float], p: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default method); None when empty."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    if lo == hi:
        return float(xs[lo])
    return xs[lo] * (hi - k) + xs[hi] * (k - lo)


def _r1(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def measured_records(
    records: Sequence[Mapping[str, Any]], warmup: int, rule: str = "completion"
) -> list[Mapping[str, Any]]:
    """The successful records that count, in completion order.

    ``completion`` is the reference harness's rule: drop the first ``warmup`` successful records
    in the order they finished. ``trace`` drops the first ``warmup`` trace items of the stage
    instead, which does not depend on which requests happened to finish first.
    """
    done = sorted(records, key=lambda r: (r.get("end_s") or 0.0, r["trace_id"]))
    good = [r for r in done if r.get("error_class") is None]
    if rule == "completion":
        return good[warmup:]
    if rule == "trace":
        first_ids = sorted(r["trace_id"] for r in records)[:warmup]
        skip = set(first_ids)
        return [r for r in good if r["trace_id"] not in skip]
    raise ValueError(f"unknown warm-up rule {rule!r}")


def summarize_stage(
    records: Sequence[Mapping[str, Any]],
    *,
    arm: str,
    rate_or_batch: float,
    started: str,
    warmup: int,
    warmup_rule: str = "completion",
    preemptions_delta: float | None = None,
) -> dict[str, Any]:
    """The seed's keys with the seed's meanings, then extra keys that the seed lacks."""
    good = measured_records(records, warmup, warmup_rule)
    ttft = [r["ttft_ms"] for r in good]
    gap = [r["worst_gap_ms"] for r in good]
    total = [r["total_ms"] for r in good]
    errors_by_class: dict[str, int] = {}
    for r in records:
        if r.get("error_class") is not None:
            errors_by_class[r["error_class"]] = errors_by_class.get(r["error_class"], 0) + 1
    summary: dict[str, Any] = {
        "arm": arm,
        "n": len(good),
        "started": started,
        "rate_or_batch": rate_or_batch,
        "ttft_p50": _r1(percentile(ttft, 50)),
        "ttft_p99": _r1(percentile(ttft, 99)),
        "gap_p50": _r1(percentile(gap, 50)),
        "gap_p99": _r1(percentile(gap, 99)),
        "total_p50": _r1(percentile(total, 50)),
        "total_p99": _r1(percentile(total, 99)),
        "preemptions_delta": preemptions_delta,
        "errors": sum(errors_by_class.values()),
    }
    sent = sorted(r["intended_s"] for r in records)
    span = (sent[-1] - sent[0]) if len(sent) > 1 else 0.0
    ttft_i = [r["ttft_from_intended_ms"] for r in good]
    total_i = [r["total_from_intended_ms"] for r in good]
    lag = [r["schedule_lag_ms"] for r in records]
    summary.update(
        {
            "sent": len(records),
            "warmup": warmup,
            "warmup_rule": warmup_rule,
            "errors_by_class": dict(sorted(errors_by_class.items())),
            "ttft_from_intended_p50": _r1(percentile(ttft_i, 50)),
            "ttft_from_intended_p99": _r1(percentile(ttft_i, 99)),
            "total_from_intended_p99": _r1(percentile(total_i, 99)),
            "schedule_lag_p50": _r1(percentile(lag, 50)),
            "schedule_lag_p99": _r1(percentile(lag, 99)),
            "schedule_lag_max": _r1(max(lag) if lag else None),
            "achieved_rate": round((len(sent) - 1) / span, 3) if span > 0 else None,
            "completion_tokens": sum(r.get("completion_tokens") or 0 for r in good),
            "chunks_p50": _r1(percentile([r["chunks"] for r in good], 50)),
        }
    )
    summary.update(client_quality(good))
    return summary


def client_quality(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """How much of a stage's timing the client could have hidden, from the records' own flags.

    ``client_coalesced_streams`` counts streams where a late read merged chunks: their gaps describe the
    client, so a cell with any is not a measurement of the server. Records written before these fields
    existed count as unflagged, and ``read_delay_measured`` says how many records could be checked.
    """
    delays = [r["max_read_delay_ms"] for r in records if r.get("max_read_delay_ms") is not None]
    return {
        "client_coalesced_streams": sum(1 for r in records if r.get("client_coalesced")),
        "read_delay_measured": len(delays),
        "max_read_delay_p99": _r1(percentile(delays, 99)),
        "max_read_delay_max": _r1(max(delays) if delays else None),
        "max_events_per_read_max": max((int(r.get("max_events_per_read") or 0) for r in records), default=0),
    }
