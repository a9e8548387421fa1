"""The long-run truth counts the requests over a limit in events: a p99 that rests on two rare stalls, each over
twenty streams at once, is not a verdict at 95% however many requests the run held."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest
from recordkit import record

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import slo_truth_real as truth

from tailgate.records import RequestRecord


def test_poisson_bounds_are_garwoods() -> None:
    assert truth.poisson_bounds(0) == pytest.approx((0.0, 3.689), abs=1e-3)
    assert truth.poisson_bounds(3) == pytest.approx((0.619, 8.767), abs=1e-3)
    assert truth.poisson_bounds(10) == pytest.approx((4.795, 18.390), abs=1e-3)


def _run(stalls: list[float], hit: int, n: int = 4000, seconds: float = 400.0) -> list[RequestRecord]:
    """``n`` streams over ``seconds``; each stall at the given moments puts ``hit`` of them at 270 ms."""
    rng = random.Random(3)
    recs = []
    for i in range(n):
        t0 = seconds * i / n
        recs.append(record(trace_id=i, intended_s=t0, end_s=t0 + 1.0, worst_gap_ms=100 + 40 * rng.random(),
                           worst_gap_end_s=t0 + 0.5))  # fmt: skip
    for at in stalls:
        for j in range(hit):
            r = recs[int(at / seconds * n) - j - 1]
            r.worst_gap_ms, r.worst_gap_end_s = 270.0 + j, at + 0.001 * rng.random()
    return recs


def test_two_stalls_over_many_streams_bound_the_share_loosely() -> None:
    over, events, low, high = truth.event_share(_run([100.0, 300.0], hit=24), "gap", 200.0, 4000)
    assert (over, events) == (48, 2)
    assert low == pytest.approx(0.242 * 24 / 4000, rel=0.01) and high == pytest.approx(7.225 * 24 / 4000, rel=0.01)
    spread = truth.event_share(_run([50.0 * k for k in range(1, 8)], hit=1), "gap", 200.0, 4000)
    assert spread[:2] == (7, 7) and spread[3] < 0.01  # seven single streams: a share well within 1%


def _metric(events: int, low: float | None, high: float | None, boot_high: float = 190.0) -> Any:
    return truth.MetricTruth("gap_p99", 200.0, 180.0, 150.0, boot_high, "not_enough_data", 4000, 200.0,
                             over=events * 20, events=events, share_low=low, share_high=high)  # fmt: skip


def test_the_truth_passes_only_where_its_events_allow() -> None:
    assert truth.bootstrap_verdict([_metric(2, 0.0015, 0.043)], stopped=False) == "undecided"
    assert truth.bootstrap_verdict([_metric(2, 0.0015, 0.008)], stopped=False) == "pass"
    assert truth.bootstrap_verdict([_metric(0, 0.0, 0.06)], stopped=False) == "pass"  # no event seen: the bootstrap's
    assert truth.bootstrap_verdict([_metric(30, 0.012, 0.05, boot_high=260.0)], stopped=False) == "fail"
    assert truth.bootstrap_verdict([_metric(0, 0.0, 0.06)], stopped=True) == "fail"


def _rate(rate: float, measured: int, verdict: str, stopped: bool = False) -> Any:
    return truth.RateTruth("chunked", rate, measured, measured, 0, 600.0, verdict, [], "", truth=verdict,
                           stopped=stopped)  # fmt: skip


def test_a_run_whose_queue_ran_away_is_a_long_run_fail_however_few_it_measured() -> None:
    rates = [_rate(8.0, 4000, "pass"), _rate(9.0, 983, "fail", stopped=True)]
    assert truth.bracket(rates, 4000)["claim"] == "both sides measured"
    assert truth.bracket(rates, 4000)["high"] == 9.0
    short_fail = [_rate(8.0, 4000, "pass"), _rate(9.0, 983, "fail")]  # a short run that failed by its tail alone
    assert truth.bracket(short_fail, 4000)["claim"] == "one side only: no claim"


def test_the_parts_of_a_rate_are_read_as_one_truth(tmp_path: Path) -> None:
    """A rate whose requests take longer than one call may run is measured in parts, each its own folder and
    workload seed; read together they are one truth: the requests pooled, every part's folder named."""
    import subprocess

    from tailgate.verify.groundtruth import start_server_process

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "slo_truth_real.py"
    out = tmp_path / "truth"
    with start_server_process(accept_any_model=True) as server:
        for part in (0, 1):
            done = subprocess.run(
                [sys.executable, str(script), "run", "--host", server.base_url, "--slo", "ttft_p99<=5s",
                 "--rates", "20", "--n", "60", "--warmup", "0", "--part", str(part), "--out", str(out),
                 "--stage-warmup", "0", "--locust-arg=--settle=0"],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout[-2000:] + done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["r20", "r20-part1"]
    seeds = {json.loads((out / f / "slo.json").read_text())["plan"]["seed"] for f in ("r20", "r20-part1")}
    assert seeds == {truth.TRUTH_SEED, truth.TRUTH_SEED + 1}
    (one,) = truth.read_truth([out / "r20", out / "r20-part1"], block_s=5.0)
    alone = truth.read_truth([out / "r20"], block_s=5.0)[0]
    assert one.rate == 20.0 and one.measured == alone.measured + truth.read_truth([out / "r20-part1"], 5.0)[0].measured
    assert one.measured >= 120 and str(out / "r20") in one.folder and str(out / "r20-part1") in one.folder
