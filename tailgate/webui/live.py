"""The live view of a run: exact per-stage tail figures from the records as they are written.

Locust's own statistics round response times into histogram buckets (a true p99 of 5629 ms shows as
6000), so the Tail latency tab computes its percentiles here, from the records, with the summaries'
rules (:mod:`tailgate.stats`): at the end of a stage the tab's p50 and p99 are the summary's.

It runs inside the load generator's event loop, which also timestamps chunks, so it is built to be
cheap and to hand the loop back often: files are read incrementally (only the bytes appended since
the last look, only the fields it needs), the work is cut into slices of :data:`SLICE_LINES` lines
with a :func:`gevent.idle` between them (the loop polls sockets there, as the dispatcher's spin
does), a stage's figures are recomputed only when that stage got new records, and a snapshot is
reused for :data:`MIN_REFRESH_S`. Pure Python: no pandas in the load path.
"""

from __future__ import annotations

import gevent
from gevent.lock import Semaphore

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tailgate.clientbound import behind_note
from tailgate.contracts import StageSummary
from tailgate.jsonl import Follower as Tail
from tailgate.jsontypes import (
    JsonMapping,
    JsonObject,
    as_object,
    json_float,
    json_int,
    json_object,
    json_objects,
    json_opt_float,
    json_opt_int,
    json_opt_object,
    json_str,
)
from tailgate.records import RequestRecord, journal_entry, supersedes
from tailgate.resultfiles import RECORDS_GLOB, SENT_GLOB, SERVER_METRICS
from tailgate.stats import field_values, measured_records, percentile, round_ms, tail

MIN_REFRESH_S = 1.0
"""A snapshot younger than this is served again: the UI polls every 2 s, possibly from several tabs."""
SERIES_POINTS = 600
"""Server samples kept for the chart (10 minutes at the default 1 s)."""
LATENCY_POINTS = 500
"""Newest requests drawn in the TTFT / worst-gap over time chart."""
METRICS = (("ttft", "ttft_ms"), ("gap", "worst_gap_ms"), ("total", "total_ms"))
QUANTILES = (50, 90, 99)
SLICE_LINES = 100
"""Lines parsed between two hand-backs to the event loop (under a millisecond of work on an idle core)."""


def pause() -> None:
    """Let the event loop poll sockets (chunks of running streams get stamped) before going on."""
    gevent.idle()


@dataclass
class StageView:
    records: list[RequestRecord] = field(default_factory=list)
    sent_keys: set[int] = field(default_factory=set)
    dropped_keys: set[int] = field(default_factory=set)
    """Journaled, then taken back (in-flight cap, or a stop between journal and send)."""
    seen: dict[tuple[str, int], int] = field(default_factory=dict)
    """(run, request) -> index in ``records``: one record per request, as the analysis reads them."""
    figures: StageFigures = field(default_factory=lambda: StageFigures())
    computed_at: int = -1
    """Record count the figures were computed for."""


@dataclass(frozen=True, slots=True)
class Tails:
    """One latency's exact figures over a stage's measured records, in ms (None: no successful request)."""

    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> Tails:
        p50, p90, p99 = (round_ms(percentile(values, q)) for q in QUANTILES)
        return cls(p50, p90, p99, round_ms(max(values)) if values else None)

    def to_json(self) -> dict[str, float | None]:
        return {"p50": self.p50, "p90": self.p90, "p99": self.p99, "max": self.max}


@dataclass(frozen=True, slots=True)
class StageFigures:
    """A stage's row of the Tail latency tab, recomputed only when the stage got new records; it joins the
    snapshot (:meth:`to_json`) that the tab and Locust's table read."""

    measured: int = 0
    ttft: Tails = Tails()
    gap: Tails = Tails()
    total: Tails = Tails()
    errors_by_class: dict[str, int] = field(default_factory=dict)
    errors: int = 0
    lag_p99: float | None = None
    client_coalesced: int = 0

    def to_json(self) -> JsonObject:
        return {
            "measured": self.measured, "ttft": self.ttft.to_json(), "gap": self.gap.to_json(),
            "total": self.total.to_json(), "errors_by_class": dict(self.errors_by_class), "errors": self.errors,
            "lag_p99": self.lag_p99, "client_coalesced": self.client_coalesced,
        }  # fmt: skip


def stage_figures(records: Sequence[RequestRecord], warmup: int, rule: str) -> StageFigures:
    """Exact p50/p90/p99/max of TTFT, worst gap and total over the measured records, errors by class, lag p99."""
    good = measured_records(records, warmup, rule)
    ttft, gap, total = (Tails.of(field_values(good, key)) for _, key in METRICS)
    errors: dict[str, int] = {}
    for r in records:
        if r.error_class is not None:
            errors[r.error_class] = errors.get(r.error_class, 0) + 1
    return StageFigures(
        measured=len(good), ttft=ttft, gap=gap, total=total, errors_by_class=dict(sorted(errors.items())),
        errors=sum(errors.values()), lag_p99=tail(records, "schedule_lag_ms", 99),
        client_coalesced=sum(1 for r in good if r.client_coalesced),
    )  # fmt: skip


def stage_dropped(summary: StageSummary | None, journaled: int, reported: int, stopping: bool) -> int:
    """Arrivals the in-flight cap (``--max-in-flight``) refused: the summary's ``dropped_arrivals``, the one
    definition. Arrivals a stop took back are never sent, not dropped: once the stage is summarized (or while
    a stop ends it) the journal's take-back lines no longer count here, only what the load processes reported.
    While it runs, the journal counts a single process's refusals at once, the reports a worker's at its end."""
    if summary is not None:
        return int(summary.dropped_arrivals or 0)
    return reported if stopping else max(journaled, reported)


@dataclass(frozen=True, slots=True)
class ServerPoint:
    """One line of ``server-metrics.jsonl``: the figures the tab's chart draws (None: the server did not say)."""

    t: float
    running: float | None
    waiting: float | None
    kv_usage: float | None
    preemptions_total: float | None

    @classmethod
    def of(cls, line: str | bytes) -> ServerPoint:
        """Raises ``ValueError`` for a cut line or one of another shape."""
        p = as_object(json.loads(line), where=SERVER_METRICS)
        return cls(json_float(p, "t"), json_opt_float(p, "running"), json_opt_float(p, "waiting"),
                   json_opt_float(p, "kv_usage"), json_opt_float(p, "preemptions_total"))  # fmt: skip


class LiveRun:
    """What one run's folder says right now, with the session's own state (stages, status, report)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        folder: Path = session.folder
        self._records = Tail(folder, RECORDS_GLOB)
        self._sent = Tail(folder, SENT_GLOB)
        self._metrics = Tail(folder, SERVER_METRICS)
        self.stages: dict[int, StageView] = {s.index: StageView() for s in session.stages}
        self.series: list[ServerPoint] = []
        self.unreadable = 0

    def _read(self) -> None:
        for i, line in enumerate(self._records.new_lines(), 1):
            if i % SLICE_LINES == 0:
                pause()
            try:
                obj = json.loads(line)
                record = RequestRecord.from_dict(obj if isinstance(obj, dict) else {}).for_summary()
            except (ValueError, TypeError):  # a cut line, or one that is not a record
                self.unreadable += 1
                continue
            view = self.stages.get(record.stage)
            if view is not None:
                key = (record.run_id, record.trace_id)
                at = view.seen.get(key)
                if at is None:
                    view.seen[key] = len(view.records)
                    view.records.append(record)
                elif supersedes(record, view.records[at]):
                    view.records[at] = record  # the rule of tailgate.records.read_records
        for line in self._sent.new_lines():
            entry = journal_entry(line)
            view = None if entry is None else self.stages.get(entry[0])
            if view is None or entry is None:
                continue
            if entry[2]:
                view.sent_keys.discard(entry[1])
                view.dropped_keys.add(entry[1])
            else:
                view.sent_keys.add(entry[1])
                view.dropped_keys.discard(entry[1])
        for i, line in enumerate(self._metrics.new_lines(), 1):
            if i % SLICE_LINES == 0:
                pause()
            try:
                self.series.append(ServerPoint.of(line))
            except ValueError:
                continue
        del self.series[:-SERIES_POINTS]

    def _latency(self, started: float) -> dict[str, list[float | None]]:
        """TTFT and worst gap of the newest requests against when each ended (s since the run started)."""
        ended = [(r.end_s, r) for v in self.stages.values() for r in v.records[-LATENCY_POINTS:] if r.end_s]
        ended.sort(key=lambda pair: pair[0])
        ended = ended[-LATENCY_POINTS:]
        return {
            "t": [round(end - started, 2) for end, _ in ended],
            "ttft": [r.ttft_ms for _, r in ended],
            "gap": [r.worst_gap_ms for _, r in ended],
        }

    def snapshot(self) -> JsonObject:
        self._read()
        s = self.session
        settings, summaries = s.settings, s.summaries
        current = s.current.index if s.current is not None else None
        latest_preempt = next(
            (p.preemptions_total for p in reversed(self.series) if p.preemptions_total is not None), None
        )
        stages: list[JsonObject] = []
        for stage in s.stages:
            view = self.stages[stage.index]
            if view.computed_at != len(view.records):
                pause()
                view.figures = stage_figures(view.records, stage.warmup, settings.warmup_rule)
                view.computed_at = len(view.records)
            summary = summaries.by_stage.get(stage.index)
            if summary is not None:
                state = "partial" if summary.get("partial") else "done"
                preemptions = summary.get("preemptions_delta")
            else:
                running = stage.index == current and not s.ended
                over = s.ended or s.stopping
                state = ("stopping" if s.stopping else "running") if running else ("not run" if over else "waiting")
                before = summaries.before.get(stage.index)
                pre = None if before is None else before.preemptions_total
                known = running and pre is not None and latest_preempt is not None
                preemptions = latest_preempt - pre if known else None  # type: ignore[operator]  # known: both set
            if summary is not None and summary.get("ran_short") and not summary.get("partial"):
                state += ", ran short"  # a stage that ran to its end without all of its plan (a partial one is cut)
            reported = int(summaries.dropped.get(stage.index, 0))
            dropped = stage_dropped(summary, len(view.dropped_keys), reported, s.stopping)
            never = summary.get("never_sent") if summary is not None else None
            stages.append({
                "index": stage.index, "label": stage.label, "state": state, "planned": stage.size,
                "sent": len(view.sent_keys), "recorded": len(view.records), "preemptions": preemptions,
                "dropped": dropped, "never_sent": never,
                "merged": sum(1 for r in view.records if r.client_coalesced), **view.figures.to_json(),
            })  # fmt: skip
        return {
            "run_id": s.run_id, "arm": settings.arm, "host": settings.host, "model": settings.model,
            "folder": str(s.folder), "status": s.status, "stop_reason": s.stop_reason, "ended": s.ended,
            "started": s.started, "elapsed_s": round((s.ended_at or time.time()) - s.started, 1),
            "current_stage": None if current is None else s.stages[current].label,
            "warmup": settings.warmup, "warmup_rule": settings.warmup_rule,
            "coordinator_alive": s.coordinator_alive, "sampler_alive": s.sampler_alive,
            "report": {"state": s.report_state(), "error": s.report_error()},
            "stages": stages, "unreadable_lines": self.unreadable, "latency": self._latency(s.started),
            "series": {
                "t": [round(p.t - s.started, 2) for p in self.series], "running": [p.running for p in self.series],
                "waiting": [p.waiting for p in self.series], "kv_usage": [p.kv_usage for p in self.series],
                "preemptions_total": [p.preemptions_total for p in self.series],
            },
        }  # fmt: skip


def _ms(fig: JsonMapping | None) -> str:
    """A latency's four figures as the snapshot holds them, as Locust's table prints them."""
    if not fig or fig.get("p50") is None:
        return "–"
    return " / ".join(f"{json_float(fig, k):.1f}" for k in ("p50", "p90", "p99", "max"))


TABLE_KEY = "tail-latency"
TABLE_STRUCTURE: list[dict[str, str]] = [
    {"key": "stage", "title": "Stage"},
    {"key": "state", "title": "State"},
    {"key": "counts", "title": "Planned / sent / recorded"},
    {"key": "unsent", "title": "Dropped / never sent / merged"},
    {"key": "ttft", "title": "TTFT p50 / p90 / p99 / max (ms)"},
    {"key": "gap", "title": "Worst gap p50 / p90 / p99 / max (ms)"},
    {"key": "total", "title": "Total p50 / p90 / p99 / max (ms)"},
    {"key": "errors", "title": "Errors"},
    {"key": "lag", "title": "Schedule lag p99 (ms)"},
    {"key": "behind", "title": "Client behind: merged streams"},
    {"key": "preempt", "title": "Preemptions"},
]


def table_rows(snapshot: JsonMapping | None) -> list[dict[str, str]]:
    """The stage rows of Locust's extended table (strings: its table prints cells as they are)."""
    if not snapshot:
        return []
    rows = []
    for st in json_objects(snapshot, "stages", where="snapshot"):
        errors = ", ".join(f"{k} {v}" for k, v in json_object(st, "errors_by_class", {}).items()) or "0"
        lag = json_opt_float(st, "lag_p99")
        pre = json_opt_float(st, "preemptions")
        merged = json_opt_float(st, "client_coalesced")
        never = json_opt_int(st, "never_sent")
        behind = "–" if merged is None else (behind_note(merged) or f"{merged:g}")
        counts = f"{json_int(st, 'planned')} / {json_int(st, 'sent')} / {json_int(st, 'recorded')}"
        rows.append({
            "stage": json_str(st, "label"), "state": json_str(st, "state"), "counts": counts,
            "unsent": f"{json_int(st, 'dropped', 0)} / {'–' if never is None else never} / {json_int(st, 'merged', 0)}",
            "ttft": _ms(json_opt_object(st, "ttft")), "gap": _ms(json_opt_object(st, "gap")),
            "total": _ms(json_opt_object(st, "total")), "errors": errors,
            "lag": "–" if lag is None else f"{lag:.1f}", "preempt": "–" if pre is None else f"{pre:g}",
            "behind": behind,
        })  # fmt: skip
    return rows


class LiveViews:
    """Snapshots per run, each reused for MIN_REFRESH_S unless the run's state changed meanwhile."""

    def __init__(self) -> None:
        self._views: dict[str, LiveRun] = {}
        self._cache: dict[str, tuple[float, tuple[object, ...], JsonObject]] = {}
        self.last_cost_ms: float | None = None
        self._lock = Semaphore()
        """Two polls (Locust's and the panel's) may overlap now that a refresh yields; one reads the files."""

    def snapshot(self, session: Any) -> JsonObject:
        with self._lock:
            return self._snapshot(session)

    def _snapshot(self, session: Any) -> JsonObject:
        key = (session.status, session.ended, session.stopping, session.current.index if session.current else None,
               len(session.summaries.by_stage), session.report_state())  # fmt: skip
        now = time.monotonic()
        cached = self._cache.get(session.run_id)
        if cached is not None and now - cached[0] < MIN_REFRESH_S and cached[1] == key:
            return cached[2]
        view = self._views.get(session.run_id)
        if view is None:
            view = self._views[session.run_id] = LiveRun(session)
        t0 = time.perf_counter()
        snap = view.snapshot()
        self.last_cost_ms = round((time.perf_counter() - t0) * 1000, 3)
        snap["cost_ms"] = self.last_cost_ms
        self._cache[session.run_id] = (now, key, snap)
        return snap
