"""What kept a load process from pausing mid-stage, and how a pause that still happens is reported.

The two pauses found on the 16-core host were a full garbage collection over every object of the
process (about 29 ms) and the descriptor table growing inside a stream's ``socket()`` (10-16 ms).
These tests hold the mechanisms that remove them (the stage collector, the descriptor reserve), the
cheaper kernel-stamp conversion, the stall watch that found them, and the console and web UI lines
that name streams a late client merged.
"""

from __future__ import annotations

import gc
import io
import json
import resource
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from recordkit import record

from tailgate.contracts import StageSummary
from tailgate.hoststeal import cpu_counters, steal_share
from tailgate.load import stagegc
from tailgate.load.client import REFRESH_NS, WallToClock
from tailgate.load.console import client_behind, summary_line
from tailgate.load.descriptors import reserve_descriptors
from tailgate.load.stagegc import QuietCollector
from tailgate.load.stallwatch import StallWatch
from tailgate.webui.live import stage_figures, table_rows

# the busy pass (scripts/test.sh) runs these again: their verdicts depend on when things happen
pytestmark = pytest.mark.timing


@pytest.fixture
def restore_gc():
    yield
    gc.enable()
    gc.unfreeze()


def test_a_stage_freezes_what_lived_before_it_and_collects_nothing_until_it_ends(restore_gc: None) -> None:
    quiet = QuietCollector()
    quiet.start()
    assert gc.get_freeze_count() > 1000  # the interpreter's own objects at least: out of every walk
    assert not gc.isenabled()  # no collection, young or full, while streams are timed
    cycle: list[object] = []
    cycle.append(cycle)
    del cycle
    assert quiet.end() >= 1  # the stage's cycle is reclaimed once it ends
    assert gc.get_freeze_count() == 0 and gc.isenabled()
    assert quiet.end() == 0  # a second end (cancel, then the finally) changes nothing
    assert gc.isenabled()


def test_the_stage_collector_can_be_turned_off(monkeypatch: pytest.MonkeyPatch, restore_gc: None) -> None:
    monkeypatch.setenv(stagegc.STAGE_GC_ENV, "off")
    quiet = QuietCollector()
    quiet.start()
    assert gc.get_freeze_count() == 0 and gc.isenabled()
    quiet.end()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="FDSize is Linux's")
def test_the_descriptor_table_is_grown_once_without_touching_open_descriptors() -> None:
    a, b = socket.socketpair()
    try:
        reached = reserve_descriptors(4096)
        assert reached == min(4096, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        with open("/proc/self/status", encoding="ascii") as f:
            size = int(f.read().split("FDSize:")[1].split()[0])
        assert size >= reached
        a.sendall(b"still open")
        assert b.recv(16) == b"still open"
    finally:
        a.close()
        b.close()


def test_kernel_stamps_convert_with_a_shared_offset_measured_again_when_stale() -> None:
    ticks = iter(range(0, 10**12, 1000))
    readings: list[int] = []

    def clock() -> int:
        readings.append(next(ticks))
        return readings[-1]

    conv = WallToClock(clock)
    wall = time.time_ns()
    first = conv.to_clock(wall, 0)
    measured = len(readings)
    assert measured == 2  # one tight pair
    assert conv.to_clock(wall, REFRESH_NS // 2) == first and len(readings) == measured  # no clock read
    conv.to_clock(wall, 2 * REFRESH_NS + 1)
    assert len(readings) == measured + 2  # stale: measured again


def test_a_preempted_measurement_never_moves_the_conversion_but_a_step_does() -> None:
    """Stamps of one stream are converted with one offset: a wide (preempted) re-measurement that puts the
    wall read off-centre must not shift them, or a kernel-stamped chunk could land before the request's
    write, stamped on the other clock (an inversion of the send path's instants)."""
    true_offset = 1_700_000_000 * 10**9
    now = [0]
    script: list[tuple[int, int]] = []  # (ns the clock advances before the wall read, ns after it)

    def clock() -> int:
        return now[0]

    def wall() -> int:
        lead, trail = script.pop(0)
        now[0] += lead
        real = now[0] + true_offset
        now[0] += trail
        return real

    conv = WallToClock(clock, wall)
    script.append((200, 200))  # a tight first measurement, 400 ns wide
    stamp = true_offset + 5_000_000
    first = conv.to_clock(stamp, now[0])
    assert abs(first - 5_000_000) <= 200 and conv.uncertainty_ns is not None and conv.uncertainty_ns <= 201
    now[0] += 2 * REFRESH_NS
    script.extend([(100, 300_000)] * 5)  # preempted right after each wall read: midpoints 150 us off
    assert conv.to_clock(stamp, now[0]) == first
    now[0] += 2 * REFRESH_NS
    script.extend([(50, 50)])  # tighter still: a better estimate of the same offset, within the old interval
    assert abs(conv.to_clock(stamp, now[0]) - first) <= 250
    true_offset += 5 * 10**9  # the wall clock is stepped 5 s forward
    now[0] += 2 * REFRESH_NS
    script.extend([(40_000, 40_000)] * 5)  # even a wide measurement reveals a step its interval excludes
    assert abs(conv.to_clock(stamp, now[0]) - (first - 5 * 10**9)) <= 40_300


def test_the_real_clock_conversion_is_within_microseconds() -> None:
    conv = WallToClock()
    for _ in range(100):
        now = time.perf_counter_ns()
        wall = time.time_ns()
        assert abs(conv.to_clock(wall, now) - now) < 2_000_000  # a busy machine may preempt between the reads
    errors = []
    for _ in range(200):
        now = time.perf_counter_ns()
        wall = time.time_ns()
        errors.append(abs(conv.to_clock(wall, now) - now))
    assert sorted(errors)[100] < 50_000


def test_the_stall_watch_times_every_collection_and_names_long_turns() -> None:
    out = io.StringIO()
    watch = StallWatch(out, turn_ns=0)
    gc.callbacks.append(watch.on_gc)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(watch.on_gc)
    watch.on_switch("switch", (object(), object()))
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    full = [e for e in events if e["kind"] == "gc" and e["generation"] == 2]
    assert full and full[0]["ms"] >= 0 and full[0]["tracked"] > 0
    (turn,) = [e for e in events if e["kind"] == "turn"]
    assert turn["stack"] and "test_stall.py" in turn["stack"][0]


def summary(merged: int) -> StageSummary:
    return StageSummary(
        stage_label="cont_r50", config="chunked", n=200, errors=0, ttft_p50=1, ttft_p99=2,
        gap_p50=3, gap_p99=4, total_p99=5, preemptions_delta=0, schedule_lag_p99=0.1,
        client_coalesced_streams=merged,
    )  # fmt: skip


def test_the_console_names_merged_streams_and_stays_quiet_without_them() -> None:
    assert client_behind(summary(0)) == "" and "CLIENT BEHIND" not in summary_line(summary(0))
    line = summary_line(summary(7))
    assert line.startswith("chunked_cont_r50: n=200")  # the cell's one name, as in its folder and the report
    assert "CLIENT BEHIND: 7 of 200 streams" in line and "client_coalesced" in line
    assert "more --processes" in line
    stolen = summary_line(replace(summary(7), host_steal_share=0.18))  # the host paused every process at once
    assert "the host stole 18%" in stolen and "more --processes" not in stolen


def test_the_console_prints_no_none() -> None:
    """A stage where every request failed, read without a /metrics counter: nothing prints as None."""
    empty = replace(summary(0), n=0, errors=2, preemptions_delta=None, schedule_lag_p99=None,
                    **dict.fromkeys(("ttft_p50", "ttft_p99", "gap_p50", "gap_p99", "total_p99")))  # fmt: skip
    line = summary_line(empty)
    assert "None" not in line and "n=0 errors=2 no successful request" in line and "preemptions –" in line, line
    assert "None" not in summary_line(replace(summary(0), preemptions_delta=None))


def test_host_steal_is_read_from_the_kernels_counters(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 50 0 25 400 5 0 2 18 0 0\n")
    before = cpu_counters(stat)
    assert before == (35, 1000)
    stat.write_text("cpu  200 0 100 1500 20 0 10 170 0 0\n")
    assert steal_share(before, cpu_counters(stat)) == round(135 / 1000, 4)
    assert cpu_counters(tmp_path / "absent") is None and steal_share(None, before) is None
    live = cpu_counters()
    assert live is None or 0 <= live[0] <= live[1]


def test_the_tab_counts_merged_streams_per_stage() -> None:
    recs = [
        record(trace_id=i, intended_s=float(i), end_s=i + 1.0, schedule_lag_ms=0.1, ttft_ms=10.0, worst_gap_ms=5.0,
               total_ms=100.0, chunks=10, completion_tokens=10, ttft_from_intended_ms=10.0,
               total_from_intended_ms=100.0, client_coalesced=i in (3, 5))
        for i in range(40)
    ]  # fmt: skip
    fig = stage_figures(recs, 0, "completion")
    assert fig.client_coalesced == 2
    snap = {"stages": [{"label": "cont_r50", "state": "done", "planned": 40, "sent": 40, "recorded": 40,
                        "preemptions": 0, **fig.to_json()}]}  # fmt: skip
    (row,) = table_rows(snap)
    assert row["behind"].startswith("2 ")
    fig0 = stage_figures([replace(r, client_coalesced=False) for r in recs], 0, "completion")
    (row0,) = table_rows({"stages": [{**snap["stages"][0], **fig0.to_json()}]})
    assert row0["behind"] == "0"


COOPERATIVE = r"""
from gevent import monkey; monkey.patch_all()
import json, sys, time
from tailgate.load import client
from tailgate.load.client import StreamTiming, Target, Timeouts, build_payload, build_request, stream_completion
from tailgate.verify.groundtruth import DEFAULT_MODEL, start_server_process

made = []
original = client.HubReads.__init__
def counting(self, *a, **k):
    made.append(1)
    original(self, *a, **k)
client.HubReads.__init__ = counting

out = {}
with start_server_process(ttft_ms=20, gap_ms=10) as server:
    target = Target.parse(server.base_url)
    request = build_request(target, build_payload(DEFAULT_MODEL, "hi", 6))
    def run(**limits):
        t = StreamTiming()
        started = time.monotonic()
        stream_completion(target, b"", t, request=request, timeouts=Timeouts(**limits), record_chunks=True)
        return {"error": t.error_class, "chunks": t.chunks, "done": t.done, "s": time.monotonic() - started,
                "stamps_rise": t.chunk_ns == sorted(t.chunk_ns)}
    out["plain"] = run()
    server.control({"faults": [{"kind": "stall", "match": {"all": True}, "at_chunk": 2, "stall_ms": 3000}]})
    out["stall"] = run(stall_s=0.3)
    out["request"] = run(request_s=0.5, stall_s=2.0)
out["cooperative"] = len(made)
print(json.dumps(out))
"""


def test_reads_under_gevent_wait_on_one_watcher_and_keep_both_limits() -> None:
    """The Locust path (gevent): chunks in order, and a stall or an overrun request still ends as classified."""
    import subprocess

    from conftest import ROOT

    done = subprocess.run([sys.executable, "-c", COOPERATIVE], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["cooperative"] == 3  # every stream read in the hub (HubReads)
    assert out["plain"]["done"] and out["plain"]["chunks"] == 6 and out["plain"]["stamps_rise"]
    assert out["stall"]["error"] == "stall_timeout" and out["stall"]["chunks"] == 2
    assert 0.3 <= out["stall"]["s"] < 2.5
    assert out["request"]["error"] == "request_timeout" and out["request"]["chunks"] == 2
    assert 0.5 <= out["request"]["s"] < 2.5
