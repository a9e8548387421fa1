"""The suite's order of cells: the ramp's doubling and its knee on summaries alone, then once end to end.

The policies decide on stage summaries, so most of their rules are checked here without a server; one run
of ``tailgate suite --until-knee`` against the ground-truth server shows the suite follows them (the
doubled cells exist, numbered as they were added, and ``suite.json`` lists them).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, write_trace

from tailgate.contracts import StageSummary
from tailgate.policies import FixedCells, KneeRamp, kneed
from tailgate.verify.groundtruth import start_server_process

# the busy pass (scripts/test.sh) runs these again: their verdicts depend on when things happen
pytestmark = pytest.mark.timing


def summary(rate: float, ttft: float | None = 100.0, gap: float | None = 10.0, errors: int = 0) -> StageSummary:
    return StageSummary(arm="continuous", n=10, rate_or_batch=rate, ttft_p99=ttft, gap_p99=gap, errors=errors)


def drive(ramp: KneeRamp[float], shown: dict[float, StageSummary]) -> list[float]:
    ran = []
    while (rate := ramp.next_cell()) is not None:
        ran.append(rate)
        ramp.record(rate, shown.get(rate, summary(rate)))
    return ran


def ramp_of(rates: list[float], until_knee: bool = True, max_rate: float = 64.0) -> KneeRamp[float]:
    return KneeRamp(rates, float, float, until_knee=until_knee, factor=2.0, max_rate=max_rate)


def test_the_ramp_doubles_past_its_last_rate_up_to_the_cap() -> None:
    ramp = ramp_of([1.0, 5.0], max_rate=40.0)
    assert drive(ramp, {}) == [1.0, 5.0, 10.0, 20.0, 40.0]
    assert ramp.added == 3 and ramp.knee is None


def test_without_until_knee_the_ramp_is_the_rates_given_whatever_they_show() -> None:
    ramp = ramp_of([1.0, 5.0, 10.0], until_knee=False)
    assert drive(ramp, {5.0: summary(5.0, ttft=900.0), 10.0: summary(10.0, errors=3)}) == [1.0, 5.0, 10.0]
    assert ramp.knee is None and ramp.added == 0


def test_a_tail_that_grows_past_the_factor_stops_the_ramp_at_that_cell() -> None:
    ramp = ramp_of([1.0, 5.0], max_rate=320.0)
    ran = drive(ramp, {20.0: summary(20.0, gap=25.0)})
    assert ran == [1.0, 5.0, 10.0, 20.0]
    assert ramp.knee == "gap_p99 grew x2.5 (10.0 -> 25.0 ms) at 20 req/s"


def test_errors_knee_even_on_the_first_cell_and_an_unmeasured_p99_never_does() -> None:
    assert kneed(None, summary(1.0, errors=2), 2.0) == "2 errors at 1 req/s"
    assert kneed(summary(1.0, ttft=None), summary(2.0, ttft=500.0), 2.0) is None
    assert kneed(summary(1.0), summary(2.0, ttft=None, gap=None), 2.0) is None
    assert kneed(summary(1.0), summary(2.0, ttft=200.0), 2.0) is None  # exactly the factor: not past it


def test_no_rates_means_no_ramp_and_fixed_cells_keep_their_order() -> None:
    assert drive(ramp_of([]), {}) == []
    fixed = FixedCells(["b", "a", "c"])
    seen = []
    while (cell := fixed.next_cell()) is not None:
        seen.append(cell)
        fixed.record(cell, summary(1.0))
    assert seen == ["b", "a", "c"]


def suite_until_knee(base_url: str, results: Path, trace: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tailgate.cli", "suite", "--server", "url", "--host", base_url,
         "--configs", "chunked", "--rates", "2", "--until-knee", "--max-rate", "8", "--knee-factor", "1000",
         "--no-gated", "--nochunk-rates", "none", "--preempt-rate", "none", "--n", "4", "--warmup", "0",
         "--results", str(results), "--no-report", "--stage-warmup", "0",
         f"--locust-arg=--trace-file={trace}", "--locust-arg=--settle=0"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_the_suite_doubles_its_ramp_in_order_and_stops_it_at_a_knee(tmp_path: Path) -> None:
    """A knee factor no timing noise reaches: the ramp doubles to the cap; then errors on every second request
    knee the first cell and no doubled cell runs."""
    trace = write_trace(tmp_path / "trace.jsonl", [(4, 3)] * 4)
    with start_server_process(ttft_ms=5, gap_ms=5) as gt:
        done = suite_until_knee(gt.base_url, tmp_path / "clean", trace)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-3000:]
        numbered = [line.split("cell ", 1)[1].split(",")[0] for line in out.splitlines() if "[suite] cell " in line]
        assert numbered == ["1/1: chunked_cont_r2", "2/2: chunked_cont_r4", "3/3: chunked_cont_r8"], out
        suite = json.loads((tmp_path / "clean" / "suite.json").read_text())
        assert suite["cells"] == ["chunked_cont_r2", "chunked_cont_r4", "chunked_cont_r8"]
        assert suite["knee"] is None

        gt.control({"reset_seq": True, "faults": [{"match": {"every": 2}, "kind": "http_500"}]})
        kneed_run = suite_until_knee(gt.base_url, tmp_path / "knee", trace)
    out = kneed_run.stdout + kneed_run.stderr
    assert "[suite] the tail knees: 2 errors at 2 req/s; ramp stops" in out, out[-3000:]
    suite = json.loads((tmp_path / "knee" / "suite.json").read_text())
    assert suite["cells"] == ["chunked_cont_r2"] and suite["knee"] == "2 errors at 2 req/s"
    assert not (tmp_path / "knee" / "chunked_cont_r4").exists()
