"""Preemption deltas and server series: the counter arithmetic, and the pull end to end.

The pull goes through prometheus-api-client against a small HTTP server that answers the two
Prometheus API endpoints the analysis uses, from raw samples it holds: enough to exercise a
counter reset inside a stage window, a series that does not exist, an older metric spelling,
and an unreachable Prometheus, without a Prometheus binary.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tailgate.postprocess.counters import (
    counter_increase,
    counter_increments,
    increase_from_increments,
    summed_increase,
)
from tailgate.postprocess.prometheus import (
    DIRECT,
    PROMETHEUS,
    SERIES_FILE,
    PrometheusSource,
    PrometheusUnavailable,
    collect_server_data,
)
from tailgate.postprocess.report import build_report
from tailgate.postprocess.runfolders import find_run_dirs, load_summaries
from tailgate.postprocess.table import summary_table

FIXTURE = Path(__file__).parent / "fixtures" / "results"


# ---------------------------------------------------------------------------------------------
# counter arithmetic


def test_increase_counts_samples_exactly_on_both_edges() -> None:
    t = [10.0, 11.0, 12.0, 13.0, 14.0]
    v = [0.0, 1.0, 3.0, 6.0, 10.0]
    assert counter_increase(t, v, 11.0, 13.0) == 5.0  # 1 -> 3 -> 6
    assert counter_increase(t, v, 10.5, 13.5) == 5.0
    assert counter_increase(t, v, 10.0, 14.0) == 10.0


def test_increase_across_a_reset_inside_the_window() -> None:
    # the server restarted between 12 and 13: the counter fell to 0 and rose to 2
    t = [10.0, 11.0, 12.0, 13.0, 14.0]
    v = [100.0, 101.0, 102.0, 0.0, 2.0]
    assert counter_increase(t, v, 10.0, 14.0) == 4.0  # +1 +1, then 0 counted from zero, +2
    v_nonzero = [100.0, 101.0, 102.0, 1.0, 2.0]
    assert counter_increase(t, v_nonzero, 10.0, 14.0) == 4.0  # the post-reset value is increase


def test_increase_with_no_samples_or_one_sample_is_unknown() -> None:
    assert counter_increase([], [], 0.0, 10.0) is None
    assert counter_increase([5.0], [3.0], 0.0, 10.0) is None
    assert counter_increase([1.0, 20.0], [0.0, 5.0], 2.0, 10.0) is None  # samples outside only


def test_increase_ignores_order_and_missing_values() -> None:
    assert counter_increase([3.0, 1.0, 2.0], [5.0, 1.0, math.nan], 0.0, 5.0) == 4.0


def test_increments_and_window_sum_agree_with_increase() -> None:
    t = np.arange(10.0)
    v = np.array([0, 0, 2, 2, 5, 1, 1, 4, 4, 6], dtype=float)
    inc = counter_increments(v)
    assert inc.tolist() == [0, 0, 2, 0, 3, 1, 0, 3, 0, 2]
    for a, b in [(0, 9), (2, 6), (4.5, 8), (3, 3)]:
        assert increase_from_increments(t, inc, a, b) == counter_increase(t, v, a, b)


def test_sum_over_engines_handles_one_engine_restarting() -> None:
    t = [0.0, 1.0, 2.0, 3.0]
    engine0 = [50.0, 51.0, 0.0, 1.0]  # restarted
    engine1 = [7.0, 7.0, 8.0, 9.0]
    assert summed_increase([(t, engine0), (t, engine1)], 0.0, 3.0) == 4.0  # (1 + 0 + 1) + (0 + 1 + 1)
    assert summed_increase([], 0.0, 3.0) is None


@given(st.lists(st.integers(min_value=0, max_value=5), min_size=2, max_size=40))
def test_increase_of_a_monotone_counter_is_last_minus_first(steps: list[int]) -> None:
    v = np.cumsum(steps).astype(float)
    t = np.arange(v.size, dtype=float)
    assert counter_increase(t, v, 0.0, float(v.size - 1)) == v[-1] - v[0]


@given(
    st.lists(st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=10), min_size=1, max_size=5),
)
def test_increase_across_resets_is_the_sum_of_segments(segments: list[list[int]]) -> None:
    # each segment is a fresh process whose counter starts from 0
    values: list[float] = []
    expected = 0.0
    for i, seg in enumerate(segments):
        cum = np.cumsum(seg).astype(float)
        values += cum.tolist()
        expected += cum[-1] - (cum[0] if i == 0 else 0.0)
    t = np.arange(len(values), dtype=float)
    got = counter_increase(t, values, 0.0, float(len(values)))
    if len(values) < 2:
        assert got is None
    else:
        # a restart whose first reading is not below the last one is invisible (Prometheus agrees):
        # the increase then misses the old process's last value
        visible = expected
        for i in range(1, len(segments)):
            prev_end = float(np.cumsum(segments[i - 1])[-1])
            if segments[i][0] >= prev_end:
                visible -= prev_end
        assert got == pytest.approx(visible)


# ---------------------------------------------------------------------------------------------
# a Prometheus HTTP API over raw samples


class FakePrometheus:
    """Holds raw samples per series and answers ``/api/v1/query`` and ``/api/v1/query_range``."""

    LOOKBACK = 300.0

    def __init__(self) -> None:
        self.series: dict[str, list[tuple[dict[str, str], list[tuple[float, float]]]]] = {}
        self.requests: list[str] = []

    def add(self, name: str, labels: dict[str, str], samples: list[tuple[float, float]]) -> None:
        self.series.setdefault(name, []).append(({"__name__": name, **labels}, sorted(samples)))

    def _at(self, samples: list[tuple[float, float]], t: float) -> float | None:
        best = None
        for ts, v in samples:
            if t - self.LOOKBACK < ts <= t:
                best = v
        return best

    def instant(self, query: str, at: float) -> dict[str, Any]:
        if query == "vector(1)":
            return {"resultType": "vector", "result": [{"metric": {}, "value": [at, "1"]}]}
        m = re.fullmatch(r"([a-z_:]+)\[(\d+)s\]", query)
        if m:
            name, width = m.group(1), float(m.group(2))
            result = []
            for labels, samples in self.series.get(name, []):
                values = [[ts, repr(v)] for ts, v in samples if at - width < ts <= at]
                if values:
                    result.append({"metric": labels, "values": values})
            return {"resultType": "matrix", "result": result}
        return {"resultType": "vector", "result": []}

    def range(self, query: str, start: float, end: float, step: float) -> dict[str, Any]:
        summed = re.fullmatch(r"sum\(([a-z_:]+)\)", query)
        name = summed.group(1) if summed else query
        if not re.fullmatch(r"[a-z_:]+", name):
            return {"resultType": "matrix", "result": []}  # rate(...) and anything else: no data
        steps = np.arange(start, end + step / 2, step)
        per_series = []
        for labels, samples in self.series.get(name, []):
            points = [(t, self._at(samples, t)) for t in steps]
            per_series.append((labels, [(t, v) for t, v in points if v is not None]))
        if summed:
            totals: dict[float, float] = {}
            for _, points in per_series:
                for t, v in points:
                    totals[t] = totals.get(t, 0.0) + v
            if not totals:
                return {"resultType": "matrix", "result": []}
            values = [[t, repr(v)] for t, v in sorted(totals.items())]
            return {"resultType": "matrix", "result": [{"metric": {}, "values": values}]}
        result = [
            {"metric": labels, "values": [[t, repr(v)] for t, v in points]} for labels, points in per_series if points
        ]
        return {"resultType": "matrix", "result": result}


def _handler(fake: FakePrometheus) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlparse(self.path)
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            fake.requests.append(f"{url.path}?{q.get('query')}")
            if url.path == "/api/v1/query":
                data = fake.instant(q["query"], float(q.get("time", time.time())))
            elif url.path == "/api/v1/query_range":
                data = fake.range(q["query"], float(q["start"]), float(q["end"]), float(q["step"]))
            else:
                self.send_error(404)
                return
            body = json.dumps({"status": "success", "data": data}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def fake_prometheus() -> Iterator[tuple[FakePrometheus, str]]:
    fake = FakePrometheus()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def results(tmp_path: Path) -> Path:
    dest = tmp_path / "results"
    shutil.copytree(FIXTURE, dest)
    return dest


def closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def _preempt_window(results: Path) -> tuple[float, float]:
    summary = json.loads((results / "preempt" / "summary-cont_r8.json").read_text())
    return summary["window_start_s"], summary["window_end_s"]


def _load_engine_samples(fake: FakePrometheus, start: float, end: float) -> float:
    """Two engines scraped every second; engine 0 restarts mid-window. Returns the true increase."""
    times = np.arange(math.floor(start) - 10 + 0.5, end + 10, 1.0)
    mid = start + (end - start) / 2
    e0, e1 = [], []
    c0, c1 = 40.0, 3.0
    for i, t in enumerate(times):
        if i and i % 3 == 0:
            c0 += 1
        if i and i % 4 == 0:
            c1 += 2
        if abs(t - mid) < 0.5:
            c0 = 1.0  # restarted: counting from zero again, one preemption already
        e0.append((float(t), c0))
        e1.append((float(t), c1))
    fake.add("vllm:num_preemptions_total", {"engine": "0", "model_name": "tiny"}, e0)
    fake.add("vllm:num_preemptions_total", {"engine": "1", "model_name": "tiny"}, e1)
    fake.add("vllm:num_requests_running", {"engine": "0"}, [(float(t), 5.0) for t in times])
    fake.add("vllm:num_requests_running", {"engine": "1"}, [(float(t), 3.0) for t in times])
    fake.add("vllm:num_requests_waiting", {"engine": "0"}, [(float(t), 1.0) for t in times])
    fake.add("vllm:gpu_cache_usage_perc", {"engine": "0"}, [(float(t), 0.4) for t in times])

    def truth(samples: list[tuple[float, float]]) -> float:
        inside = [v for t, v in samples if start <= t <= end]
        total = 0.0
        for a, b in itertools.pairwise(inside):
            total += b - a if b >= a else b
        return total

    return truth(e0) + truth(e1)


def test_pull_through_the_client_counts_across_a_reset(
    results: Path, fake_prometheus: tuple[FakePrometheus, str]
) -> None:
    fake, url = fake_prometheus
    start, end = _preempt_window(results)
    expected = _load_engine_samples(fake, start, end)
    source = PrometheusSource(url).connect()
    value, note = source.preemption_increase(start, end)
    assert note is None
    assert value == expected
    assert any("vllm:num_preemptions_total[" in r for r in fake.requests)
    frame, notes = source.series(start - 5, end + 5)
    assert frame["running"].dropna().eq(8.0).all()
    assert frame["kv_usage"].dropna().eq(0.4).all()  # the older spelling answered
    assert any("prompt_tokens_total" in n for n in notes)  # no such series: named, not a crash
    assert frame["prompt_tokens_rate"].isna().all()
    assert frame["preemptions_inc"].sum() > 0


def test_collect_uses_prometheus_saves_series_and_flags_disagreement(
    results: Path, fake_prometheus: tuple[FakePrometheus, str]
) -> None:
    fake, url = fake_prometheus
    start, end = _preempt_window(results)
    expected = _load_engine_samples(fake, start, end)
    runs = find_run_dirs(results)
    summaries = load_summaries(runs)
    data = collect_server_data(runs, summaries, url)
    row = data.preemptions.set_index("cell").loc["preempt_cont_r8"]
    assert row["preemptions_source"] == PROMETHEUS
    assert row["preemptions_prometheus"] == expected
    assert row["preemptions_direct"] == 15.0
    assert bool(row["preemptions_disagree"]) == (expected != 15.0)
    assert data.sources["preempt"] == PROMETHEUS
    assert (results / "preempt" / SERIES_FILE).is_file()
    # runs the fake holds nothing for keep their direct readings, and say why
    other = data.preemptions.set_index("cell").loc["chunked_cont_r8"]
    assert other["preemptions_source"] == DIRECT
    assert "no samples" in other["preemptions_note"]
    assert data.sources["chunked-cont"] == DIRECT


def test_saved_series_serve_a_later_report_without_prometheus(
    results: Path, fake_prometheus: tuple[FakePrometheus, str]
) -> None:
    fake, url = fake_prometheus
    start, end = _preempt_window(results)
    _load_engine_samples(fake, start, end)
    first = build_report(results, prometheus_url=url)
    assert results / "preempt" / SERIES_FILE in first.series_csv
    html = first.html.read_text()
    assert "prometheus" in html
    # the copy on another machine: no Prometheus, only the saved CSV
    later = build_report(results, out_dir=results / "again")
    assert later.series_csv == []
    assert any("saved prometheus-series.csv" in n for n in later.notes)
    table = pd.read_csv(later.table_csv).set_index("cell")
    assert table.loc["preempt_cont_r8", "preemptions_source"] == PROMETHEUS
    assert table.loc["preempt_cont_r8", "preemptions_prometheus"] > 0


def test_unreachable_prometheus_falls_back_and_says_so(results: Path) -> None:
    url = closed_port_url()
    t = time.monotonic()
    with pytest.raises(PrometheusUnavailable):
        PrometheusSource(url).connect()
    assert time.monotonic() - t < 5.0  # no retry back-off
    paths = build_report(results, prometheus_url=url)
    table = pd.read_csv(paths.table_csv).set_index("cell")
    assert table.loc["preempt_cont_r8", "preemptions_source"] == DIRECT
    assert table.loc["preempt_cont_r8", "preemptions_direct"] == 15.0
    assert table["preemptions_prometheus"].isna().all()
    diagnosis = json.loads(paths.diagnosis_json.read_text())
    assert any("did not answer" in n for n in diagnosis["notes"])
    assert any(n.startswith("no Prometheus data: preemption deltas from direct /metrics scrapes") for n in paths.notes)
    html = paths.html.read_text()
    assert "did not answer" in html and "direct /metrics scrapes" in html
    assert not (results / "preempt" / SERIES_FILE).exists()


def test_prefix_cache_hit_rate_per_stage_from_prometheus(
    results: Path, fake_prometheus: tuple[FakePrometheus, str]
) -> None:
    """The stage's prefix-cache hits over queries from the raw counters, as the preemption delta is read."""
    fake, url = fake_prometheus
    start, end = _preempt_window(results)
    times = np.arange(math.floor(start) - 10 + 0.5, end + 10, 1.0)
    inside = [t for t in times if start <= t <= end]
    fake.add("vllm:prefix_cache_queries_total", {"engine": "0"}, [(float(t), 1000.0 * i) for i, t in enumerate(times)])
    fake.add("vllm:prefix_cache_hits_total", {"engine": "0"}, [(float(t), 250.0 * i) for i, t in enumerate(times)])
    assert len(inside) >= 2
    runs = find_run_dirs(results)
    data = collect_server_data(runs, load_summaries(runs), url)
    rows = data.preemptions.set_index("cell")
    assert rows.loc["preempt_cont_r8", "prefix_cache_hit_rate_prometheus"] == pytest.approx(0.25)
    assert math.isnan(rows.loc["chunked_cont_r8", "prefix_cache_hit_rate_prometheus"])  # no samples in its window
    table = summary_table(load_summaries(runs), data.preemptions).set_index("cell")
    assert table.loc["preempt_cont_r8", "prefix_hit_rate"] == pytest.approx(0.25)
