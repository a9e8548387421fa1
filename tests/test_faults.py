"""Faults during a run, through a real ``locust --headless`` process against the ground-truth server.

Each fault is injected by the server for every other request, so one run shows both sides: the
failed requests become records with the fault's error class, the others keep correct timing,
and the books balance (records == journaled sends == planned, summary errors == error records).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import run_locust, vllm_python, write_trace
from runkit import (
    assert_no_traceback,
    check_nothing_lost,
    classes,
    count_lines,
    start_locust,
    summaries,
    wait_until,
)

from tailgate.exitcodes import DONE, FAILED
from tailgate.postprocess.report import build_report
from tailgate.servers import LocalVllmServer, ensure_tiny_model
from tailgate.verify.groundtruth import ServerProcess, start_server_process

# the busy pass (scripts/test.sh) runs these again: their verdicts depend on when things happen
pytestmark = pytest.mark.timing

TTFT_MS = 40.0
GAP_MS = 20.0
N = 8
EVERY_OTHER = {"every": 2, "offset": 1}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def gt_shared() -> Iterator[ServerProcess]:
    with start_server_process(ttft_ms=TTFT_MS, gap_ms=GAP_MS) as server:
        yield server


@pytest.fixture
def gt(gt_shared: ServerProcess) -> ServerProcess:
    """The shared server, back to a clean state: no faults, request numbers and chunk log from zero."""
    gt_shared.control(
        {"faults": [], "reset_seq": True, "reset_chunklog": True, "ttft_ms": TTFT_MS, "gap_ms": GAP_MS,
         "preemptions_total": 0, "healthy": True}
    )  # fmt: skip
    return gt_shared


def run_stage(
    server: ServerProcess, tmp_path: Path, *args: str, n: int = N, max_tokens: int = 6, rates: str = "10"
) -> tuple[Path, Any]:
    trace = write_trace(tmp_path / "trace.jsonl", [(4, max_tokens)] * n)
    out = tmp_path / "results"
    done = run_locust(
        "continuous.py", server.base_url, out, "--rates", rates, "--trace-file", str(trace), "--warmup", "0",
        "--settle", "0.5", *args, timeout=180,
    )  # fmt: skip
    assert_no_traceback(done.stdout, done.stderr)
    return out, done


def check_timing_of_successes(
    records: list[dict], max_tokens: int, chunk_log: list[list[int]], first_seen_ms: float = TTFT_MS
) -> None:
    """Lower bounds that hold however loaded the machine is: the server cannot answer before it is asked.

    ``first_seen_ms`` is when the server's first write goes out, after the request arrived. The server
    shares the machine: when it wrote a stream late and caught up on its schedule, its own gaps were
    shorter than ``GAP_MS``, so the worst gap is held to what the server's chunk log says it wrote.
    """
    writes: dict[int, list[int]] = {}
    for seq, _idx, t_ns in chunk_log:
        writes.setdefault(seq, []).append(t_ns)
    for r in records:
        if r.error_class is not None:
            continue
        assert r.chunks == r.completion_tokens == max_tokens and r.finish_reason == "length"
        assert r.ttft_ms >= first_seen_ms
        assert r.total_ms >= TTFT_MS + (max_tokens - 1) * GAP_MS
        if not r.client_coalesced:  # a late read merges chunks the server sent apart: flagged, not timed
            times = sorted(writes[int(r.response_id.removeprefix("cmpl-"))])
            written_ms = max((b - a) / 1e6 for a, b in itertools.pairwise(times))
            assert r.worst_gap_ms >= min(GAP_MS, written_ms) * 0.5, (r.worst_gap_ms, written_ms)


# ---------------------------------------------------------------------------------- classified faults

FAULTS = [
    # kind, fault params, extra locust args, expected class, content chunks an error record keeps
    ("http_429", {}, [], "http_429", 0),
    ("http_500", {}, [], "http_500", 0),
    ("http_503", {}, [], "http_503", 0),
    ("close_before_headers", {}, [], "connection_closed", 0),
    ("close_before_headers", {"rst": True}, [], "connection_reset", 0),
    ("headers_never", {}, ["--request-timeout", "1.5"], "headers_timeout", 0),
    ("malformed_json", {"at_chunk": 2}, [], "malformed_event", 2),
    ("cut_mid_stream", {"after_chunks": 2}, [], "stream_truncated", 2),
    ("cut_mid_stream", {"after_chunks": 2, "rst": True}, [], "connection_reset", 2),
    ("stall", {"at_chunk": 2, "stall_ms": 5000}, ["--stall-timeout", "0.6"], "stall_timeout", 2),
    ("error_event", {"at_chunk": 2}, [], "server_error_event", 2),
]


@pytest.mark.parametrize(
    "kind, params, args, expected, kept_chunks",
    FAULTS,
    ids=[f"{f[0]}{'-rst' if f[1].get('rst') else ''}" for f in FAULTS],
)
def test_fault_becomes_a_classified_record_and_is_counted(
    gt: ServerProcess, tmp_path: Path, kind: str, params: dict, args: list[str], expected: str, kept_chunks: int
) -> None:
    gt.control({"faults": [{"kind": kind, "match": EVERY_OTHER, **params}]})
    out, done = run_stage(gt, tmp_path, *args)
    # failed requests are measurements (error records): the run did its whole plan (tailgate.exitcodes)
    assert done.returncode == DONE, done.stderr[-3000:]
    records, by_label = check_nothing_lost(out, N)
    assert classes(records) == {None: N // 2, expected: N // 2}
    summary = by_label["cont_r10"]
    assert summary["errors"] == N // 2 and summary["errors_by_class"] == {expected: N // 2}
    assert summary["n"] == N // 2  # percentiles only over the successes
    failed = [r for r in records if r.error_class is not None]
    # a failed request keeps what it saw before failing
    assert all(r.chunks == kept_chunks for r in failed), [r.chunks for r in failed]
    if expected.startswith("http_"):
        assert all(r.status == int(expected[5:]) and "injected" in r.error for r in failed)
    check_timing_of_successes(records, 6, gt.chunk_log())
    assert gt.control({})["faults"][0]["hits"] == N // 2


# ---------------------------------------------------------------------------- not errors: timing only


def client_vs_server_gaps(records: list[dict], chunk_log: list[list[int]]) -> list[float]:
    """|client gap - server gap| in ms for every pair of consecutive content chunks of every stream."""
    writes: dict[int, dict[int, int]] = {}
    for seq, idx, t_ns in chunk_log:
        writes.setdefault(seq, {})[idx] = t_ns
    diffs = []
    for r in records:
        server = writes[int(r.response_id.removeprefix("cmpl-"))]
        client = r.chunk_offsets_ms
        assert len(client) == len(server)
        for k in range(1, len(client)):
            server_gap = (server[k] - server[k - 1]) / 1e6
            diffs.append(abs((client[k] - client[k - 1]) - server_gap))
    return diffs


def test_keepalive_comments_are_not_tokens_and_do_not_shorten_gaps(gt: ServerProcess, tmp_path: Path) -> None:
    # a comment every gap, half a gap off the tokens: the first one arrives before the first token
    gt.control({"faults": [{"kind": "keepalive_comments", "match": {"all": True}, "interval_ms": GAP_MS}]})
    out, done = run_stage(gt, tmp_path, "--record-chunks", max_tokens=8)
    assert done.returncode == 0, done.stderr[-3000:]
    records, by_label = check_nothing_lost(out, N)
    assert classes(records) == {None: N} and by_label["cont_r10"]["errors"] == 0
    check_timing_of_successes(records, 8, gt.chunk_log())
    diffs = client_vs_server_gaps(records, gt.chunk_log())
    assert statistics.median(diffs) < 5.0, sorted(diffs)[-5:]
    # had comments counted as chunks, every gap would be about half of the server's
    assert statistics.median(r.worst_gap_ms for r in records) >= GAP_MS * 0.9
    assert gt.control({})["faults"][0]["hits"] == N


@pytest.mark.parametrize("same_http_chunk", [False, True], ids=["one-chunk-each", "one-http-chunk"])
def test_several_events_in_one_write_are_each_a_token_stamped_on_arrival(
    gt: ServerProcess, tmp_path: Path, same_http_chunk: bool
) -> None:
    gt.control(
        {"faults": [{"kind": "multi_event_writes", "match": {"all": True}, "events_per_write": 3,
                     "same_http_chunk": same_http_chunk}]}
    )  # fmt: skip
    out, done = run_stage(gt, tmp_path, "--record-chunks", max_tokens=9)
    assert done.returncode == 0, done.stderr[-3000:]
    records, _ = check_nothing_lost(out, N)
    assert classes(records) == {None: N}
    # the first write carries tokens 0-2 at token 2's time: the first token cannot be seen earlier
    check_timing_of_successes(records, 9, gt.chunk_log(), first_seen_ms=TTFT_MS + 2 * GAP_MS)
    diffs = client_vs_server_gaps(records, gt.chunk_log())
    assert statistics.median(diffs) < 5.0, sorted(diffs)[-5:]
    # writes are 3 gaps apart, and the worst gap says so
    assert statistics.median(r.worst_gap_ms for r in records) >= 3 * GAP_MS * 0.9


# ------------------------------------------------------------------------- the server goes away mid-run


@pytest.mark.parametrize(
    "how, stop_on_errors",
    [("kill", 0), ("terminate", 0), ("kill", 1)],
    ids=["killed", "shut-down", "killed-stop-on-errors"],
)
def test_server_gone_mid_stage_in_flight_fail_then_connection_refused(
    tmp_path: Path, how: str, stop_on_errors: int
) -> None:
    n, max_tokens = 16, 30  # 40 ms + 29 x 20 ms: about 0.6 s per request, 2-3 in flight at 4 req/s
    trace = write_trace(tmp_path / "trace.jsonl", [(4, max_tokens)] * n)
    out = tmp_path / "results"
    with start_server_process(ttft_ms=TTFT_MS, gap_ms=GAP_MS) as server:
        locust = start_locust(
            "continuous.py", server.base_url, out, tmp_path, "--rates", "4,8", "--trace-file", str(trace),
            "--warmup", "0", "--settle", "0.5", "--stop-on-errors", str(stop_on_errors),
        )  # fmt: skip
        try:

            def mid_stage() -> bool:
                sent, ended = count_lines(out, "sent-*.log"), count_lines(out, "records-*.jsonl")
                return sent >= 5 and sent - ended >= 2

            wait_until(mid_stage, 60, "requests in flight", locust)
            stopped_at = time.time()
            if how == "kill":
                os.kill(server.pid, signal.SIGKILL)
            else:
                server.proc.send_signal(signal.SIGTERM)  # it cuts every connection, then exits
            server.proc.wait(10)
            code = locust.wait(180)
        finally:
            if locust.proc.poll() is None:
                locust.proc.kill()
    assert_no_traceback(locust.stdout, locust.stderr)
    # ended itself early on the errors (--stop-on-errors): failed; otherwise its refused requests are data
    assert code == (FAILED if stop_on_errors else DONE), locust.stderr[-3000:]
    stages = 1 if stop_on_errors else 2
    records, by_label = check_nothing_lost(out, n * stages)
    first = [r for r in records if r.stage == 0]
    in_flight = [r for r in first if r.sent_s < stopped_at and r.error_class not in (None, "connection_refused")]
    assert in_flight, classes(first)
    assert {r.error_class for r in in_flight} <= {"stream_truncated", "connection_reset", "connection_closed"}
    assert all(r.error_class == "connection_refused" for r in first if r.sent_s > stopped_at + 0.1)
    assert any(r.error_class == "connection_refused" for r in first)
    assert all(r.error_class is None for r in first if r.end_s < stopped_at - 0.05)
    s0 = by_label["cont_r4"]
    assert s0["errors"] == sum(1 for r in first if r.error_class) > 0
    # the counter could not be read after the stage: unknown, never a made-up zero
    assert s0["preemptions_after"] is None and s0["preemptions_delta"] is None
    meta = json.loads((out / "run.json").read_text())
    if stop_on_errors:
        assert set(by_label) == {"cont_r4"}
        assert meta["status"] == f"stopped after cont_r4: {s0['errors']} errors" and meta["stages"] == ["cont_r4"]
        assert "--stop-on-errors 1" in locust.stderr
    else:
        # the run goes on: the next stage is sent in full and every request is refused
        second = [r for r in records if r.stage == 1]
        assert classes(second) == {"connection_refused": n}
        # its console line has no latency to print, and says so rather than printing None
        line = next(x for x in locust.stderr.splitlines() if "_cont_r8: " in x and f"errors={n}" in x)
        assert "None" not in line and "no successful request" in line, line
        assert by_label["cont_r8"]["errors_by_class"] == {"connection_refused": n}
        assert meta["status"] == "completed" and meta["stages"] == ["cont_r4", "cont_r8"]


# ------------------------------------------------------------------------ the real server killed mid-stage


@pytest.fixture(scope="module")
def doomed_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalVllmServer]:
    """A CPU vLLM of this module's own: the test kills it, so it cannot be the session's shared server."""
    python = vllm_python()
    model = ensure_tiny_model(python=python)
    log = tmp_path_factory.mktemp("vllm-doomed") / "vllm.log"
    server = LocalVllmServer(python, model, extra_args=["--enforce-eager"], log_path=log)
    server.start()
    try:
        server.wait_healthy(timeout=420)
        yield server
    finally:
        server.stop()


@pytest.mark.vllm
def test_vllm_killed_mid_stage_in_flight_become_errors_and_the_run_stops(
    doomed_vllm: LocalVllmServer, tmp_path: Path
) -> None:
    n = 16  # 400 tokens each take seconds on the CPU backend: everything sent before the kill is in flight
    trace = write_trace(tmp_path / "trace.jsonl", [(32, 400)] * n)
    out = tmp_path / "results"
    locust = start_locust(
        "continuous.py", doomed_vllm.base_url, out, tmp_path, "--rates", "4,8", "--trace-file", str(trace),
        "--warmup", "0", "--ignore-eos", "--stop-on-errors", "1", "--settle", "1",
    )  # fmt: skip
    try:
        # the journal runs one arrival ahead of the sends: line k+2 is written only after arrival k went out
        wait_until(lambda: count_lines(out, "sent-*.log") >= 8, 120, "the stage to be under way", locust)
        assert doomed_vllm.pid is not None
        killed_at = time.time()
        os.killpg(doomed_vllm.pid, signal.SIGKILL)  # API server and engine core together
        code = locust.wait(300)
    finally:
        if locust.proc.poll() is None:
            locust.proc.kill()
    assert_no_traceback(locust.stdout, locust.stderr)
    assert code == 1, locust.stderr[-3000:]
    records, by_label = check_nothing_lost(out, n)  # the second stage never started
    assert set(by_label) == {"cont_r4"}
    in_flight = [r for r in records if r.sent_s < killed_at]
    after = [r for r in records if r.sent_s > killed_at + 0.5]
    assert len(in_flight) >= 6 and after
    cut = {"stream_truncated", "connection_reset", "connection_closed"}
    assert {r.error_class for r in in_flight} <= cut | {None}
    assert any(r.error_class in cut for r in in_flight)
    assert all(r.error_class == "connection_refused" for r in after)
    summary = by_label["cont_r4"]
    assert summary["errors"] == sum(1 for r in records if r.error_class) >= len(after) + 1
    assert summary["preemptions_before"] is not None and summary["preemptions_delta"] is None
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == f"stopped after cont_r4: {summary['errors']} errors"
    assert meta["stages"] == ["cont_r4"] and meta["stages_planned"] == ["cont_r4", "cont_r8"]


# ------------------------------------------------------------------------------ preemption counter reset


def test_preemption_counter_falling_mid_stage_is_flagged_not_negative(gt: ServerProcess, tmp_path: Path) -> None:
    gt.control({"preemptions_total": 100})
    trace = write_trace(tmp_path / "trace.jsonl", [(4, 20)] * 12)
    out = tmp_path / "results"
    locust = start_locust(
        "continuous.py", gt.base_url, out, tmp_path, "--rates", "6", "--trace-file", str(trace), "--warmup", "0",
    )  # fmt: skip
    try:
        wait_until(lambda: count_lines(out, "sent-*.log") >= 3, 60, "the stage to start", locust)
        gt.control({"preemptions_total": 5})  # a restarted server counts from zero again
        code = locust.wait(120)
    finally:
        if locust.proc.poll() is None:
            locust.proc.kill()
    assert code == 0, locust.stderr[-3000:]
    assert_no_traceback(locust.stderr)
    _, by_label = check_nothing_lost(out, 12)
    s = by_label["cont_r6"]
    assert s["preemptions_before"] == 100 and s["preemptions_after"] == 5
    assert s["preemptions_delta"] is None and s["preemption_counter_reset"] is True
    assert "preemption counter fell 100.0 -> 5.0" in locust.stderr
    # the report never turns the fall into a negative number either, and says what happened
    paths = build_report(out)
    table = pd.read_csv(paths.table_csv)
    for column in ("preemptions_direct", "preemptions_prometheus"):
        assert not (pd.to_numeric(table[column], errors="coerce") < 0).any(), table[column]
    assert any("counter" in note and "reset" in note for note in paths.notes), paths.notes


# ------------------------------------------------------------------------------------ Prometheus down


def test_report_falls_back_to_direct_scrapes_when_prometheus_is_down(gt: ServerProcess, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{closed_port()}"
    out, done = run_stage(gt, tmp_path, "--prometheus-url", dead, n=12, max_tokens=20, rates="6")
    assert done.returncode == 0, done.stderr[-3000:]
    check_nothing_lost(out, 12)
    assert json.loads((out / "run.json").read_text())["prometheus_url"] == dead
    assert (out / "server-metrics.jsonl").stat().st_size > 0
    # the recorded URL is down, and so is the one given when the report is built
    for override in (None, f"http://127.0.0.1:{closed_port()}"):
        paths = build_report(out, out_dir=tmp_path / f"report-{override is None}", prometheus_url=override)
        url = override or dead
        assert any(f"Prometheus at {url} did not answer" in n and "direct /metrics" in n for n in paths.notes)
        diagnosis = json.loads(paths.diagnosis_json.read_text())
        assert diagnosis["series_sources"] == {".": "direct_scrape"}
        table = pd.read_csv(paths.table_csv)
        assert list(table["preemptions_source"]) == ["direct_scrape"]
        assert table["preemptions_prometheus"].isna().all() and list(table["preemptions_direct"]) == [0]
        html = paths.html.read_text()
        assert "did not answer" in html and "direct /metrics" in html
    assert summaries(out)["cont_r6"]["errors"] == 0
