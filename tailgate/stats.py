"""Percentiles and the per-stage summary, with the reference harness's exact rules.

Pure Python on purpose: the load path writes summaries without pandas or numpy. The rules live here
once (:data:`PERCENTILE_RULES`, :data:`WARMUP_RULES`, :data:`COMPLETION_ORDER`, :data:`ROUND_DIGITS`);
``tailgate.postprocess.summarize`` vectorises the same table for frames of millions of records.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from tailgate.jsontypes import JsonObject
    from tailgate.records import RequestRecord

SEED_SUMMARY_KEYS: tuple[str, ...] = (
    "arm", "n", "started", "rate_or_batch",
    "ttft_p50", "ttft_p99", "gap_p50", "gap_p99", "total_p50", "total_p99",
    "preemptions_delta", "errors",
)  # fmt: skip

WARMUP_RULES = ("completion", "trace")

COMPLETION_ORDER: tuple[str, str] = ("end_s", "trace_id")
"""How "the first requests to finish" is decided: by end time, ties broken by trace id."""


def completion_key(record: RequestRecord) -> tuple[float, int]:
    """:data:`COMPLETION_ORDER` as a sort key (a record that never ended sorts first)."""
    return (record.end_s or 0.0, record.trace_id)


ROUND_DIGITS = 1
"""Summaries carry milliseconds with one decimal, as the reference harness prints them."""


@dataclass(frozen=True)
class PercentileRule:
    """One percentile a stage summary reports: which field, which percentile, over which requests.

    ``over="measured"`` is the successful requests left after the warm-up rule; ``over="sent"`` is
    every request the stage sent (schedule lag concerns them all, failed or not). ``p=100`` is the
    maximum. The load path's summary and the analysis's vectorised recomputation both iterate this
    table, so a rule changes in one place.
    """

    key: str
    field: str
    p: float
    over: Literal["measured", "sent"] = "measured"


PERCENTILE_RULES: tuple[PercentileRule, ...] = (
    PercentileRule("ttft_p50", "ttft_ms", 50),
    PercentileRule("ttft_p99", "ttft_ms", 99),
    PercentileRule("gap_p50", "worst_gap_ms", 50),
    PercentileRule("gap_p99", "worst_gap_ms", 99),
    PercentileRule("total_p50", "total_ms", 50),
    PercentileRule("total_p99", "total_ms", 99),
    PercentileRule("ttft_from_intended_p50", "ttft_from_intended_ms", 50),
    PercentileRule("ttft_from_intended_p99", "ttft_from_intended_ms", 99),
    PercentileRule("total_from_intended_p99", "total_from_intended_ms", 99),
    PercentileRule("schedule_lag_p50", "schedule_lag_ms", 50, "sent"),
    PercentileRule("schedule_lag_p99", "schedule_lag_ms", 99, "sent"),
    PercentileRule("schedule_lag_max", "schedule_lag_ms", 100, "sent"),
    PercentileRule("chunks_p50", "chunks", 50),
)


def percentile(values: Sequence[float], p: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default method); None when empty.

    Written as ``a + (b - a) * frac`` at index ``(p / 100) * (n - 1)``, the very arithmetic of pandas'
    grouped quantile, so the analysis's vectorised summaries round to the same tenth.
    """
    if not values:
        return None
    xs = sorted(values)
    k = (p / 100.0) * (len(xs) - 1)
    lo = int(k)
    if lo >= len(xs) - 1:
        return float(xs[-1])
    return xs[lo] + (xs[lo + 1] - xs[lo]) * (k - lo)


def field_values(records: Sequence[RequestRecord], name: str) -> list[float]:
    """A record field's measured values: None (never reached) and non-finite values are left out, as the
    analysis's vectorised quantile leaves out NaN. Every tail in the suite is computed over this list."""
    out: list[float] = []
    for r in records:
        v = getattr(r, name)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append(v)
    return out


def tail(records: Sequence[RequestRecord], name: str, p: float) -> float | None:
    """One field's percentile over records, rounded as every summary rounds it (p=100: the maximum)."""
    return round_ms(percentile(field_values(records, name), p))


def round_ms(x: float | None) -> float | None:
    """The summaries' rounding; None stays None."""
    return None if x is None else round(x, ROUND_DIGITS)


def measured_records(records: Sequence[RequestRecord], warmup: int, rule: str = "completion") -> list[RequestRecord]:
    """The successful records that count, in completion order.

    ``completion`` is the reference harness's rule: drop the first ``warmup`` successful records
    in the order they finished. ``trace`` drops the first ``warmup`` trace items of the stage
    instead, which does not depend on which requests happened to finish first.
    """
    done = sorted(records, key=completion_key)
    good = [r for r in done if r.error_class is None]
    if rule == "completion":
        return good[warmup:]
    if rule == "trace":
        first_ids = sorted(r.trace_id for r in records)[:warmup]
        skip = set(first_ids)
        return [r for r in good if r.trace_id not in skip]
    raise ValueError(f"unknown warm-up rule {rule!r}")


def summarize_stage(
    records: Sequence[RequestRecord],
    *,
    arm: str,
    rate_or_batch: float,
    started: str,
    warmup: int,
    warmup_rule: str = "completion",
    preemptions_delta: float | None = None,
) -> JsonObject:
    """The seed's keys with the seed's meanings, then extra keys that the seed lacks: the object
    :class:`tailgate.contracts.StageSummary` reads (and checks) as the stage's figures."""
    good = measured_records(records, warmup, warmup_rule)
    population = {"measured": good, "sent": records}
    pct = {rule.key: tail(population[rule.over], rule.field, rule.p) for rule in PERCENTILE_RULES}
    errors_by_class: dict[str, int] = {}
    for r in records:
        if r.error_class is not None:
            errors_by_class[r.error_class] = errors_by_class.get(r.error_class, 0) + 1
    summary: JsonObject = {
        "arm": arm,
        "n": len(good),
        "started": started,
        "rate_or_batch": rate_or_batch,
        **{k: pct[k] for k in SEED_SUMMARY_KEYS if k in pct},
        "preemptions_delta": preemptions_delta,
        "errors": sum(errors_by_class.values()),
    }
    sent = sorted(r.intended_s for r in records)
    span = (sent[-1] - sent[0]) if len(sent) > 1 else 0.0
    summary.update(
        {
            "sent": len(records),
            "warmup": warmup,
            "warmup_rule": warmup_rule,
            "errors_by_class": dict(sorted(errors_by_class.items())),
            **{k: v for k, v in pct.items() if k not in summary},
            "achieved_rate": round((len(sent) - 1) / span, 3) if span > 0 else None,
            "completion_tokens": sum(r.completion_tokens or 0 for r in good),
        }
    )
    summary.update(client_quality(good))
    return summary


def client_quality(records: Sequence[RequestRecord]) -> JsonObject:
    """How much of a stage's timing the client could have hidden, from the records' own flags.

    ``client_coalesced_streams`` counts streams where a late read merged chunks: their gaps describe the
    client, so a cell with any is not a measurement of the server. Records written before these fields
    existed count as unflagged, and ``read_delay_measured`` says how many records could be checked.
    """
    delays = field_values(records, "max_read_delay_ms")
    return {
        "client_coalesced_streams": sum(1 for r in records if r.client_coalesced),
        "read_delay_measured": len(delays),
        "max_read_delay_p99": round_ms(percentile(delays, 99)),
        "max_read_delay_max": round_ms(max(delays) if delays else None),
        "max_events_per_read_max": max((r.max_events_per_read for r in records), default=0),
    }


def wider_gap(worst_ns: int, worst_end_ns: int | None, last_ns: int, now_ns: int) -> tuple[int, int | None]:
    """A stream's worst gap and the instant that ends it, once a chunk at ``now_ns`` follows one at ``last_ns``.

    The one rule the client's live reads and the capture's segment times share: the gap between consecutive
    chunks, the longest kept, and on a tie the earlier one (a later pause of the same length is not news)."""
    gap = now_ns - last_ns
    return (gap, now_ns) if gap > worst_ns else (worst_ns, worst_end_ns)


def worst_gap(times: Sequence[int]) -> tuple[int, int | None]:
    """The worst gap of a stream whose chunks arrived at ``times`` (in order), and the instant that ends it;
    ``(0, None)`` for fewer than two chunks."""
    worst: int = 0
    end: int | None = None
    for last, now in itertools.pairwise(times):
        worst, end = wider_gap(worst, end, last, now)
    return worst, end
