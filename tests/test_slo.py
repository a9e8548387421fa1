"""``tailgate slo``: SLO and sweep parsing, verdicts with intervals, the search, controllers, bad input.

The search and the verdicts are tested on synthetic probes, where the capacity is known; the end-to-end
test at the bottom runs the command against the embedded CPU vLLM, scaled down, and checks what it
recorded against the search's rules rather than any absolute speed.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from recordkit import record
from runkit import RecordingController

from tailgate import slo
from tailgate.servers.sweep import CommandServer, ComposeWithFlags
from tailgate.slo.answer import seconds_to_decide
from tailgate.slo.search import lacks_only_data, over_a_limit, worth_extending
from tailgate.slo.state import ConfigSearch, ProbeEntry, SloState

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------------------- parsing


def test_parse_slo_units_and_errors() -> None:
    limits = slo.parse_slo("ttft_p99<=300ms, gap_p99 <= 0.2s,total_p95<=10s,errors<=0.5%")
    got = {lim.key: lim.limit for lim in limits}
    assert got == {"ttft_p99": 300.0, "gap_p99": 200.0, "total_p95": 10000.0, "errors": 0.005}
    assert slo.parse_slo("TTFT_P99<=300")[0].limit == 300.0  # ms by default
    assert slo.parse_slo("gap_p99<=1s,errors<=0.01")[1].limit == 0.01


@pytest.mark.parametrize(
    "text",
    ["", "ttft_p99<300ms", "ttft_p100<=3ms", "latency_p99<=3ms", "ttft_p99<=0ms", "errors<=5%",
     "ttft_p99<=3ms,ttft_p99<=4ms", "errors<=150%,ttft_p99<=1s", "gap_p99<=2x"],
)  # fmt: skip
def test_parse_slo_rejects(text: str) -> None:
    with pytest.raises(slo.SloError, match=r"^--slo: "):
        slo.parse_slo(text)


def test_configs_knobs_and_flags() -> None:
    c = slo.parse_config("small: chunked=on max-num-batched-tokens=512")
    assert c.name == "small"
    assert c.flags == ("--enable-chunked-prefill", "--max-num-batched-tokens", "512")
    off = slo.parse_config("chunked=off", embedded=True)
    assert off.name == "chunked-off"
    assert off.flags == ("--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192")
    assert slo.parse_config("chunked=off").flags == ("--no-enable-chunked-prefill",)
    assert slo.parse_config("plain").flags == ()
    grid = slo.parse_grid(["chunked=on,off", "max_num_batched_tokens=512,2048"])
    assert [g.name for g in grid] == ["chunked-on_mnbt-512", "chunked-on_mnbt-2048", "chunked-off_mnbt-512",
                                      "chunked-off_mnbt-2048"]  # fmt: skip
    lptt = slo.parse_config("x: long-prefill-token-threshold=256,max-num-seqs=8")
    assert lptt.flags == ("--long-prefill-token-threshold", "256", "--max-num-seqs", "8")


@pytest.mark.parametrize(
    ("text", "match"),
    [("a: foo=1", "unknown knob"), ("a: chunked=maybe", "on or off"), ("a: max-num-seqs=0", "at least 1"),
     ("a: max-num-seqs=x", "whole number"), ("bad name!: chunked=on", "configuration name")],
)  # fmt: skip
def test_config_rejects(text: str, match: str) -> None:
    with pytest.raises(slo.SloError, match=f"^--config: .*{match}"):
        slo.parse_config(text)


def test_sweep_files(tmp_path: Path) -> None:
    js = tmp_path / "s.json"
    doc = {"configs": [{"name": "base", "knobs": {}}], "grid": {"max-num-batched-tokens": [512, 8192]}}
    js.write_text(json.dumps(doc))
    assert [c.name for c in slo.parse_sweep_file(str(js))] == ["base", "mnbt-512", "mnbt-8192"]
    toml = tmp_path / "s.toml"
    toml.write_text('[[configs]]\nname = "off"\nknobs = { chunked = false }\n')
    assert slo.parse_sweep_file(str(toml))[0].flags == ("--no-enable-chunked-prefill",)
    empty = tmp_path / "e.json"
    empty.write_text('{"configs": []}')
    with pytest.raises(slo.SloError, match=r"^--sweep: .*empty"):
        slo.parse_sweep_file(str(empty))
    bad = tmp_path / "b.json"
    bad.write_text('{"grid": {"warp-speed": [1]}}')
    with pytest.raises(slo.SloError, match=r"^--sweep: unknown knob"):
        slo.parse_sweep_file(str(bad))


# ------------------------------------------------------------------------------------------- verdicts


def _attempt(values: list[float], errors: int = 0, stopped: str | None = None, rate: float = 10.0) -> slo.ProbeAttempt:
    """Requests sent at ``rate`` in order, each with the TTFT given (gap half of it, total ten times)."""
    recs = [record(trace_id=i, ttft_from_intended_ms=v, worst_gap_ms=v / 2, total_from_intended_ms=v * 10,
                   intended_s=i / rate, end_s=i / rate + v / 100) for i, v in enumerate(values)]  # fmt: skip
    return slo.ProbeAttempt(recs, sent=len(values) + errors, errors=errors, stopped_early=stopped)


def test_requests_the_early_stop_cut_off_are_not_in_the_error_share() -> None:
    """Six errors, then the error budget stops the run and cuts off the seventh in flight: it has no outcome,
    so the share is 6 of 6, not 6 of 7 (which would understate the server's error rate)."""
    limits = slo.parse_slo("ttft_p99<=1s,errors<=10%")
    attempt = replace(_attempt([], errors=7, stopped="error budget spent"), cancelled=1, errors=6)
    check = slo.check_probe([attempt], limits, sustained=False)[1][1]
    assert (check.key, check.n, check.point) == ("errors", 6, 1.0) and check.verdict == "fail"
    older = replace(attempt, cancelled=0)  # no count of the cut-off requests: read before the field existed
    assert slo.check_probe([older], limits, sustained=False)[1][1].n == 7
    all_cut = replace(attempt, errors=0, cancelled=7)  # the stop came before anything ended
    verdict, checks = slo.check_probe([all_cut], limits, sustained=False)
    assert checks[1].verdict == "not_enough_data" and verdict == "fail"  # failed for stopping, not on errors


def test_a_repeated_workload_is_not_new_evidence_but_a_new_sample_is() -> None:
    """Two runs of one workload on a server that repeats itself exactly carry the evidence of one: their
    build-ups fall in the same blocks. A second sample of the workload (another seed) is independent."""
    limits = slo.parse_slo("ttft_p99<=300ms")
    rng = np.random.default_rng(3)
    vals = rng.uniform(50, 100, 2000)
    vals[400:440] = 450.0  # one queue build-up: 2% of the requests over the limit, all in one stretch
    once = slo.check_probe([_attempt(vals.tolist())], limits, sustained=False)[1][0]
    same = [replace(_attempt(vals.tolist()), workload=7), replace(_attempt(vals.tolist()), workload=7)]
    twice = slo.check_probe(same, limits, sustained=False)[1][0]
    assert twice.n == 2 * once.n and twice.n_effective == pytest.approx(once.n_effective, rel=0.05)
    other = np.roll(vals, 1000)  # the same build-up elsewhere in another sample
    new = [replace(_attempt(vals.tolist()), workload=7), replace(_attempt(other.tolist()), workload=1007)]
    assert slo.check_probe(new, limits, sustained=False)[1][0].n_effective > 1.5 * once.n_effective


def test_verdicts_carry_distribution_free_bounds() -> None:
    """Fixed-n Clopper-Pearson (``sequential=False``): the order-statistic bounds of one look."""
    limits = slo.parse_slo("ttft_p99<=300ms,errors<=5%")
    rng = np.random.default_rng(1)
    low = rng.uniform(50, 100, 300).tolist()
    verdict, checks = slo.check_probe([_attempt(low)], limits, sequential=False)
    assert verdict == "pass", checks
    ttft = checks[0]
    assert ttft.low <= ttft.point <= ttft.high <= 300 and ttft.n == 300  # at n=300 the upper bound is the max
    assert ttft.high == pytest.approx(max(low), abs=0.05)
    assert checks[-1].key == "sustained" and checks[-1].verdict == "pass"
    high = rng.uniform(400, 500, 300).tolist()
    verdict, checks = slo.check_probe([_attempt(high)], limits, sequential=False)
    assert verdict == "fail" and checks[0].low > 300
    assert slo.binding_limit(checks) == "ttft_p99"
    # the tail straddles the limit: not enough data, never a silent pass
    edge = rng.uniform(50, 100, 295).tolist() + rng.uniform(250, 350, 5).tolist()
    rng.shuffle(edge)
    verdict, checks = slo.check_probe([_attempt(edge)], limits, sequential=False)
    assert verdict == "not_enough_data" and checks[0].verdict == "not_enough_data" and "straddles" in checks[0].reason
    # too few requests for any 95% bound on a p99, however good they look
    verdict, checks = slo.check_probe([_attempt(low[:200])], limits, sequential=False)
    assert verdict == "not_enough_data" and checks[0].high is None and "299" in checks[0].reason
    # errors: fail on the lower bound; a probe stopped early fails whatever its percentiles
    verdict, checks = slo.check_probe([_attempt(low, errors=60)], limits)
    assert verdict == "fail" and slo.binding_limit(checks) == "errors"
    assert slo.check_probe([_attempt(low, stopped="queue")], limits)[0] == "fail"
    # an error limit finer than n can resolve: 0 errors pass on the point, the bound is still reported
    verdict, checks = slo.check_probe(
        [_attempt(low, errors=0)], slo.parse_slo("ttft_p99<=300ms,errors<=0.5%"), sequential=False
    )
    assert verdict == "pass" and checks[1].high > 0.005
    verdict, checks = slo.check_probe([_attempt(low, errors=2)], slo.parse_slo("ttft_p99<=300ms,errors<=0.5%"))
    assert verdict == "not_enough_data" and checks[1].verdict == "not_enough_data"


def test_sequential_verdicts_keep_their_confidence_at_every_look() -> None:
    """Looking after every 100 requests and stopping at the first decided verdict: with the share exactly at
    the limit, fixed-n Clopper-Pearson passes far more often than its 5%; the confidence sequence does not."""
    from tailgate.tailbounds import min_n_for_sequence, seq_below, share_upper

    rng = np.random.default_rng(11)
    runs, looks = 300, range(100, 3001, 100)
    seq_false = cp_false = 0
    for _ in range(runs):
        over = np.cumsum(rng.random(3000) < 0.01)
        seq_false += any(seq_below(int(over[n - 1]), n, 0.01, 0.05) for n in looks)
        cp_false += any(share_upper(int(over[n - 1]), n, 0.05) <= 0.01 for n in looks)
    assert seq_false / runs <= 0.07 < 0.1 <= cp_false / runs, (seq_false, cp_false)
    # the price: a first pass needs 449 independent requests, none over, instead of 299
    assert min_n_for_sequence(0.99, 0.95) == 449
    low = np.random.default_rng(1).uniform(50, 100, 449).tolist()
    assert slo.check_probe([_attempt(low)], slo.parse_slo("ttft_p99<=300ms"))[0] == "pass"
    assert slo.check_probe([_attempt(low[:440])], slo.parse_slo("ttft_p99<=300ms"))[0] == "not_enough_data"


def test_clustered_exceedances_count_as_less_evidence() -> None:
    """The same three slow requests in one burst (one stall) weigh less than spread out: the design effect."""
    limits = slo.parse_slo("ttft_p99<=300ms")
    rng = np.random.default_rng(5)
    base = rng.uniform(50, 100, 1000)
    spread, burst = base.copy(), base.copy()
    spread[[560, 760, 960]] = 400
    burst[[760, 761, 762]] = 400
    c_spread = slo.check_probe([_attempt(spread.tolist())], limits, sustained=False, sequential=False)[1][0]
    c_burst = slo.check_probe([_attempt(burst.tolist())], limits, sustained=False, sequential=False)[1][0]
    assert c_burst.n_effective < c_spread.n_effective == c_spread.n
    assert c_spread.verdict == "pass" and c_burst.verdict != "pass"


def test_absorbed_burst_is_never_a_pass() -> None:
    """Requests arrive faster than they complete: TTFT from intended climbs through the probe. One sample that
    falls behind is never a pass; a second sample of the workload that does too fails the rate, where the
    percentile alone would not have. A re-run of the first sample repeats its arrivals and says nothing new."""
    limits = slo.parse_slo("ttft_p99<=60s")
    vals = [50 + 40 * i for i in range(400)]  # a queue that grows by 40 ms a request
    first = replace(_attempt(vals, rate=24), workload=7)
    verdict, checks = slo.check_probe([first], limits)
    assert verdict == "not_enough_data" and checks[-1].key == "sustained", checks[-1]
    assert "trends upward" in checks[-1].reason and "one sample" in checks[-1].reason
    assert slo.check_probe([first, first], limits)[0] == "not_enough_data"
    assert slo.check_probe([first], limits)[1][-1].over == 1  # one sample behind, counted for the search
    verdict, checks = slo.check_probe([first, replace(first, workload=1007)], limits)
    assert verdict == "fail" and checks[-1].verdict == "fail" and "trends upward" in checks[-1].reason
    assert checks[-1].over == 2 and checks[0].verdict != "fail"  # the percentile alone would not have failed it


def test_a_queue_excursion_far_under_the_limit_is_not_a_failure_to_keep_up() -> None:
    """Near capacity a queue builds for a while: TTFT rises (a rank test calls it a trend) by 300 ms against a
    1 s limit while every request completes in the window. Not a failure; the same rise with completions
    falling behind is one."""
    limits = slo.parse_slo("ttft_p99<=1s")
    vals = [20 + 0.8 * i for i in range(500)]
    excursion = _attempt(vals, rate=10)
    for r in excursion.measured:  # each stream ends half a second after its first token
        r.end_s = r.intended_s + r.ttft_from_intended_ms / 1000 + 0.5
    checks = slo.check_probe([excursion], limits)[1]
    assert checks[-1].key == "sustained" and checks[-1].verdict == "pass", checks[-1]
    lagging = _attempt(vals, rate=10)
    for r in lagging.measured[250:]:
        r.end_s += 100.0  # completions fell behind: most requests of the window end after it
    assert slo.check_probe([lagging, replace(lagging, workload=1)], limits)[1][-1].verdict == "fail"


def test_long_streams_ending_after_a_short_window_are_not_a_server_falling_behind() -> None:
    """A CPU vLLM at 16 req/s for 60 s: streams of ~9 s end 85% of the window's arrivals inside it, and TTFT rises
    by ~150 ms (a rank test calls it a trend) against a 4-s limit. On one day that server kept up with 17 req/s
    over 4,000 requests, on another it fell behind at 16: a minute cannot tell, so the verdict is not enough
    data, not a failure. Had most of the requests that were due ended after the window, it fell behind, and fails."""
    limits = slo.parse_slo("ttft_p99<=4s")
    rng = random.Random(3)
    means = (34, 55, 98, 82, 44, 63, 119, 90, 192, 285)  # that minute's TTFT, ms, by tenths of the window
    vals = [m * rng.uniform(0.5, 1.5) for m in means for _ in range(96)]
    long_streams = _attempt(vals, rate=16)
    for r in long_streams.measured:
        r.end_s = r.intended_s + r.ttft_from_intended_ms / 1000 + 9.0
    row = slo.sustain_check([long_streams], 16, 2000).attempts[0]
    assert row.keep_up is not None and row.keep_up < 0.9 and row.ttft_trend and row.ttft_trend.rise < 2000
    sustained = slo.check_probe([long_streams], limits, rate=16)[1][-1]
    assert sustained.verdict == "not_enough_data" and "too short to tell" in sustained.reason, sustained
    late = _attempt(vals, rate=16)
    for r in late.measured[480:]:  # the second half's streams end far after the window: a server fallen behind
        r.end_s = r.intended_s + 100.0
    assert slo.check_probe([late, replace(late, workload=1)], limits, rate=16)[1][-1].verdict == "fail"


def test_requests_in_flight_show_a_server_falling_behind_without_its_gauge() -> None:
    """No waiting-queue samples: the records themselves give the requests in flight at each arrival. First
    tokens come at once but each stream ends 0.11 s after the one before (one slot, 9 req/s served, 10 offered):
    in flight grows without bound, and the probe fails on it."""
    limits = slo.parse_slo("ttft_p99<=1s")
    attempt = _attempt([30.0] * 600, rate=10)
    end = 0.0
    for r in attempt.measured:
        end = max(end, r.intended_s) + 0.11
        r.end_s = end
    sustained = slo.check_probe([attempt, replace(attempt, workload=1)], limits)[1][-1]
    assert sustained.verdict == "fail" and "requests in flight trends upward" in sustained.reason, sustained
    row = slo.sustain_check([attempt], 10, 500).attempts[0]
    assert row.queue_source == "requests in flight" and row.queue_trend is not None and row.queue_trend.trend
    assert row.completion_rate is not None and row.arrival_rate is not None
    assert row.completion_rate < row.arrival_rate


def test_an_attempt_too_short_to_tell_is_settled_by_a_longer_one_that_kept_up() -> None:
    """Streams lasting 8 s in 60-s windows: a tenth or more of each window's arrivals is still running at its end,
    which cannot tell a sustained rate from an absorbed burst. A longer attempt at the same rate that kept up
    settles it; a trend in two samples of the workload still fails the rate, and short attempts alone stay undecided."""

    def attempt(seconds: int, stream_s: float = 8.0) -> slo.ProbeAttempt:
        a = _attempt([30.0] * (8 * seconds), rate=8)
        for r in a.measured:
            r.end_s = r.intended_s + stream_s
        return a

    short, long = attempt(60), attempt(240)
    assert slo.sustain_check([short], 8).verdict == "not_enough_data"
    assert slo.sustain_check([short, short], 8).verdict == "not_enough_data"  # more of the same says no more
    both = slo.sustain_check([short, long], 8)
    assert both.verdict == "pass" and "1 of 2 too short" in both.reason, both
    assert [r.verdict for r in both.attempts] == ["not_enough_data", "pass"]
    rising = _attempt([30.0 + 2.0 * i for i in range(960)], rate=8)  # TTFT climbing 2 ms per arrival
    assert slo.sustain_check([short, long, rising], 8, 500).verdict == "not_enough_data"  # one sample behind
    again = replace(rising, workload=1)
    assert slo.sustain_check([short, long, rising, again], 8, 500).verdict == "fail"


def test_extensions_grow_to_four_times_the_probe_within_the_budget_left() -> None:
    """A rate extended needs several times its data: each extension doubles the attempt before it, up to four
    times the plan's count, never past the budget left nor under the plan's count."""
    plan = slo.SloPlan(limits=slo.parse_slo("ttft_p99<=300ms"), configs=[slo.parse_config("a")], n=200,
                       duration=60, warmup=3)  # fmt: skip
    assert plan.probe_n(8) == 480
    assert [plan.attempt_n(8, k) for k in (1, 2, 3, 4)] == [None, 960, 1920, 1920]
    assert plan.attempt_n(8, 3, left_s=100.0) == (100 - 15) * 8 - 3  # what the budget left still holds
    assert plan.attempt_n(8, 3, left_s=30.0) is None  # never under the plan's own count
    assert plan.attempt_n(8, 1, length=2.0) == 960  # a confirmation probe's length, first attempt
    traced = replace(plan, locust_args=["--trace-file", "t.jsonl"])
    assert traced.attempt_n(8, 3) is None  # the file sets the count


def test_a_rate_only_too_short_to_tell_is_on_track_but_one_that_fell_behind_is_not() -> None:
    tails = [slo.Check("ttft_p99", 4000.0, 1100.0, None, None, 480, "not_enough_data"),
             slo.Check("errors", 0.0, 0.0, None, 0.006, 483, "pass")]  # fmt: skip

    def sustained(verdict: str, behind: int | None = None) -> slo.Check:
        return slo.Check("sustained", 0.9, 0.86, None, None, 480, verdict, over=behind)

    assert lacks_only_data("not_enough_data", [*tails, sustained("not_enough_data")])
    assert lacks_only_data("not_enough_data", [*tails, sustained("not_enough_data", behind=0)])
    assert lacks_only_data("not_enough_data", [*tails, sustained("pass")])
    assert not lacks_only_data("not_enough_data", [*tails, sustained("fail")])
    # one sample fell behind: undecided, but more data can only fail it or leave it open, never pass it
    assert not lacks_only_data("not_enough_data", [*tails, sustained("not_enough_data", behind=1)])
    over = [replace(tails[0], point=4100.0), tails[1], sustained("pass")]
    assert not lacks_only_data("not_enough_data", over)
    assert over_a_limit("not_enough_data", over)  # what sends the search's data to a lower rate on track
    assert not over_a_limit("fail", over)  # a decided rate is not undecided over its limit
    assert not over_a_limit("not_enough_data", [*tails, sustained("pass")])
    over_on_errors_only = [tails[0], replace(tails[1], point=0.01), sustained("fail")]
    assert not over_a_limit("not_enough_data", over_on_errors_only)  # errors and falling behind are no tail point


def test_more_data_goes_to_the_highest_rate_it_can_decide_in_the_time_left() -> None:
    """A CPU server's search: 2, 4 and 8 req/s lack only data, needing ~1,170, ~457 and ~721 s more. With 800 s
    left the highest that fits (8) gets it; with 500 s, 4; with 400 s none fits, and the nearest to deciding does."""
    est: dict[float, float | None] = {2.0: 1170.0, 4.0: 457.0, 8.0: 721.0}
    assert worth_extending(est, 800.0) == [4.0, 8.0]
    assert worth_extending(est, 500.0) == [4.0]
    assert worth_extending(est, 400.0) == [4.0]
    assert worth_extending({**est, 8.0: None}, 900.0) == [4.0]  # beyond estimate: not where the time goes
    assert worth_extending({2.0: None, 4.0: None}, 100.0) == [2.0, 4.0]  # nothing to go by: all of them
    assert worth_extending(est, None) == [2.0, 4.0, 8.0]  # no budget: every rate lacking only data
    kw: dict[str, Any] = {"start": 2, "max_rate": 16, "min_rate": 1, "resolution": slo.Resolution(0.25, True)}
    verdicts = {2.0: "not_enough_data", 4.0: "not_enough_data", 8.0: "not_enough_data", 10.0: "fail"}
    assert slo.next_probe(verdicts, on_track=worth_extending(est, 500.0), **kw) == slo.ProbeNext(4.0, "extend")
    assert slo.next_probe(verdicts, on_track=worth_extending(est, 800.0), **kw) == slo.ProbeNext(8.0, "extend")


def test_the_time_a_rate_needs_counts_every_attempt_there_not_only_its_latest(tmp_path: Path) -> None:
    """4 req/s probed twice (100 s each) has 200 effective requests pooled: 2.44 times its data would decide it,
    ~290 s more at the pace of both attempts. With 250 s left it does not fit (counting only the latest attempt, 144
    s, would say it does); 2 req/s, needing 15 s, does."""
    from tailgate.slo.state import AttemptRow

    plan = slo.SloPlan(limits=slo.parse_slo("ttft_p99<=300ms"), configs=[slo.parse_config("a")], time_budget=900)
    runner = slo.SloRunner(plan, RecordingController(), tmp_path, log=lambda _line: None)
    now = [1000.0]
    runner.clock = lambda: now[0]
    runner._config_t0 = 1000.0 - 650.0  # 650 s spent of 900

    def entry(index: int, rate: float, seconds: float, n_effective: float) -> ProbeEntry:
        checks = [slo.Check("ttft_p99", 300.0, 120.0, None, None, 500, "not_enough_data", n_effective=n_effective,
                            over=0),
                  slo.Check("sustained", 0.9, 0.97, None, None, 500, "pass")]  # fmt: skip
        return ProbeEntry(index, rate, "extend", attempts=[AttemptRow(f"a{index}", 7, seconds=seconds)],
                          verdict="not_enough_data", checks=checks)  # fmt: skip

    state = runner._config_state(plan.configs[0])
    state.probes += [entry(1, 4.0, 100.0, 100.0), entry(2, 2.0, 60.0, 400.0), entry(3, 4.0, 100.0, 200.0)]
    assert runner._on_track(plan.configs[0]) == [2.0]
    now[0] += -150.0  # 400 s left: both fit, and the search takes the higher
    assert runner._on_track(plan.configs[0]) == [2.0, 4.0]


def test_the_time_to_decide_a_rate_is_estimated_from_its_effective_requests() -> None:
    """No request over the limit in 100 effective requests: a first anytime-valid bound needs 449, so about 4.5
    times the data (in steps of 1.25), at the pace of the 60 s spent there."""
    undecided = slo.Check("ttft_p99", 4000.0, 1100.0, None, None, 480, "not_enough_data", n_effective=100.0, over=0)
    more = seconds_to_decide([undecided], 60.0, 0.95)
    assert more is not None and (449 / 100 - 1) * 60 <= more <= (449 * 1.25 / 100 - 1) * 60, more
    decided = replace(undecided, verdict="pass")
    assert seconds_to_decide([decided], 60.0, 0.95) == 0.0  # only the keep-up test lacked: one longer attempt
    at_the_limit = replace(undecided, n=10_000, n_effective=10_000.0, over=100)  # exactly 1% over: never decides
    assert seconds_to_decide([at_the_limit], 60.0, 0.95) is None


def test_a_stall_that_sets_many_streams_worst_gaps_is_one_cluster_however_long_they_lived() -> None:
    """Streams living 8 s at 10 req/s; four stalls each set the worst gap of the 80 streams alive then. By send
    time the victims of one stall spread over 8 s, nearly three of a 60-s probe's 3-s blocks, and read as several
    clusters; by when their worst gap ended they are one, and the effective count falls accordingly."""
    rate, life, stalls = 10, 8.0, (10.0, 25.0, 40.0, 55.0)
    recs = []
    for i in range(600):
        sent = i / rate
        hit = [s for s in stalls if sent < s <= sent + life]
        recs.append(record(trace_id=i, ttft_from_intended_ms=30.0, worst_gap_ms=300.0 if hit else 20.0,
                           total_from_intended_ms=life * 1000, intended_s=sent, end_s=sent + life,
                           worst_gap_end_s=hit[0] if hit else sent + life / 2))  # fmt: skip
    limits = slo.parse_slo("gap_p99<=250ms")
    by_end = slo.check_probe([slo.ProbeAttempt(recs, sent=600, errors=0)], limits, sustained=False)[1][0]
    unknown_end = [replace(r, worst_gap_end_s=None) for r in recs]  # records without the instant: by send time
    by_send = slo.check_probe([slo.ProbeAttempt(unknown_end, sent=600, errors=0)], limits, sustained=False)[1][0]
    assert by_end.over == by_send.over == 320
    assert by_end.n_effective is not None and by_send.n_effective is not None
    assert by_end.n_effective < 0.5 * by_send.n_effective, (by_end.n_effective, by_send.n_effective)


def test_pooled_runs_narrow_the_bounds() -> None:
    limits = slo.parse_slo("ttft_p99<=300ms")
    rng = np.random.default_rng(3)
    one = [_attempt(rng.exponential(40, 600).tolist())]
    four = [*one, *(_attempt(rng.exponential(40, 600).tolist()) for _ in range(3))]
    w1 = slo.check_probe(one, limits)[1][0]
    w4 = slo.check_probe(four, limits)[1][0]
    assert 0.8 * 2400 <= w4.n <= 2400 and (w4.high - w4.low) < (w1.high - w1.low)  # less any start-up cut


# --------------------------------------------------------------------------------------------- search


def _fake(capacity: float, uncertain_band: float = 0.0) -> tuple[Any, list[float]]:
    seen: list[float] = []

    def probe(rate: float, phase: str) -> str:
        seen.append(rate)
        if uncertain_band and abs(rate - capacity) <= uncertain_band:
            return "not_enough_data"
        return "pass" if rate <= capacity else "fail"

    return probe, seen


def test_search_doubles_then_bisects() -> None:
    probe, seen = _fake(13.0)
    out = slo.search(probe, start=2, max_rate=64, min_rate=0.25, resolution=slo.Resolution(1, False), max_probes=20)
    assert [s.phase for s in out.steps][:4] == ["double"] * 4 and seen[:4] == [2, 4, 8, 16]
    assert all(s.phase == "bisect" for s in out.steps[4:]) and len(out.steps) > 4
    assert out.status == "bracketed" and out.best <= 13 < out.first_fail and out.first_fail - out.best <= 1
    assert seen[4] == 12  # midpoint of the bracket [8, 16]


def test_search_edges() -> None:
    probe, seen = _fake(0.7)
    out = slo.search(probe, start=4, max_rate=64, min_rate=0.1, resolution=slo.Resolution(0.5, True), max_probes=20)
    assert seen[:4] == [4, 2, 1, 0.5] and [s.phase for s in out.steps[:4]] == ["double", "halve", "halve", "halve"]
    assert out.best is not None and out.best <= 0.7 < out.first_fail
    probe, _ = _fake(1000)
    out = slo.search(probe, start=4, max_rate=20, min_rate=1, resolution=slo.Resolution(1, False), max_probes=20)
    assert out.status == "max_rate" and out.best == 20 and [s.rate for s in out.steps] == [4, 8, 16, 20]
    probe, _ = _fake(0.01)
    out = slo.search(probe, start=4, max_rate=20, min_rate=1, resolution=slo.Resolution(1, False), max_probes=20)
    assert out.status == "below_min" and out.best is None
    probe, _ = _fake(13)
    out = slo.search(probe, start=2, max_rate=64, min_rate=1, resolution=slo.Resolution(0.01, False), max_probes=6)
    assert out.status == "probe_limit" and len(out.steps) == 6
    # not enough data never counts as meeting the SLO, and never closes the bracket either: the search probes
    # above it until a rate fails, then narrows; what stays undecided inside the bracket is listed
    probe, _ = _fake(8.0, uncertain_band=0.1)
    out = slo.search(probe, start=2, max_rate=64, min_rate=1, resolution=slo.Resolution(1, False), max_probes=20)
    assert out.best is not None and out.best < 8 < out.first_fail  # type: ignore[operator]
    assert any(s.verdict == "not_enough_data" and s.rate == 8 for s in out.steps)
    assert out.status == "probe_limit" and out.undecided == [8] and len(out.steps) == 20
    assert any(s.phase == "extend" and s.rate == 8 for s in out.steps)  # more data where the capacity is


def test_next_probe_decides_one_typed_step_or_the_end() -> None:
    kw: dict[str, Any] = {"start": 4, "max_rate": 20, "min_rate": 1, "resolution": slo.Resolution(1, False)}
    assert slo.next_probe({}, **kw) == slo.ProbeNext(4, "double")
    assert slo.next_probe({4: "pass", 8: "fail"}, **kw) == slo.ProbeNext(6, "bisect")
    assert slo.next_probe({4: "fail"}, **kw) == slo.ProbeNext(2, "halve")
    assert slo.next_probe({1: "fail"}, **kw) == slo.SearchEnds("below_min")
    assert slo.next_probe({20: "pass"}, **kw) == slo.SearchEnds("max_rate")
    assert slo.next_probe({6: "pass", 7: "fail"}, **kw) == slo.SearchEnds("bracketed")


def test_with_no_lower_end_the_highest_rate_lacking_only_data_is_extended() -> None:
    """Every rate undecided and the top one not kept up: more data at the highest rate whose points already meet
    the limits buys the most requests a second and the highest lower end; without such a rate, the lowest."""
    kw: dict[str, Any] = {"start": 1, "max_rate": 8, "min_rate": 1, "resolution": slo.Resolution(0.25, True)}
    undecided = {r: "not_enough_data" for r in (1.0, 2.0, 4.0, 8.0)}
    assert slo.next_probe(undecided, **kw) == slo.ProbeNext(1.0, "extend")
    assert slo.next_probe(undecided, on_track=[1.0, 2.0, 4.0], **kw) == slo.ProbeNext(4.0, "extend")
    # a failure above: the upper end is narrowed first, then the highest on-track rate under it gets the data
    assert slo.next_probe({1.0: "not_enough_data", 2.0: "not_enough_data", 2.2: "fail"}, on_track=[1.0, 2.0],
                          **kw) == slo.ProbeNext(2.0, "extend")  # fmt: skip


def test_with_no_lower_end_a_top_rate_leaning_to_fail_sends_the_data_to_the_rate_on_track() -> None:
    """A lent H100's search: 5 and 10 req/s on track, 13.1 and 15 undecided with TTFT points over the limit, 17.5
    failed. Bisecting 15..17.5 narrows an upper end the points already place lower; the lower end is open, and more
    data at 10 is what can close it. With the top undecided rate on track, the wide upper end is still bisected."""
    kw: dict[str, Any] = {"start": 5, "max_rate": 40, "min_rate": 2.5, "resolution": slo.Resolution(0.15, True)}
    verdicts = {5.0: "not_enough_data", 10.0: "not_enough_data", 13.105: "not_enough_data",
                15.0: "not_enough_data", 17.5: "fail", 20.0: "fail"}  # fmt: skip
    over = [13.105, 15.0]
    assert slo.next_probe(verdicts, on_track=[5.0, 10.0], over_limit=over, **kw) == slo.ProbeNext(10.0, "extend")
    assert slo.next_probe(verdicts, on_track=[5.0, 10.0, 13.105, 15.0], **kw) == slo.ProbeNext(16.25, "bisect")
    assert slo.next_probe(verdicts, over_limit=over, **kw) == slo.ProbeNext(16.25, "bisect")  # none on track
    # a top rate under every limit, only too slow to decide in the time left (a CPU vLLM search: 8 req/s with the
    # failure at 16 and only 4 on track): the gap over it is bisected, as before
    cpu = {2.0: "not_enough_data", 4.0: "not_enough_data", 8.0: "not_enough_data", 16.0: "fail"}
    kw = {"start": 2, "max_rate": 24, "min_rate": 1, "resolution": slo.Resolution(0.25, True)}
    assert slo.next_probe(cpu, on_track=[4.0], over_limit=[], **kw) == slo.ProbeNext(12.0, "bisect")


def test_search_narrows_on_both_sides_of_an_undecided_band() -> None:
    """Probes within 3% of the capacity cannot decide; the search closes in on that band from both sides,
    so the bracket ends within a resolution step of it (not at the doubling's coarse steps)."""
    probe, seen = _fake(16.5, uncertain_band=0.5)
    out = slo.search(probe, start=2, max_rate=64, min_rate=1, resolution=slo.Resolution(0.05, True), max_probes=14)
    assert out.best is not None and out.first_fail is not None
    assert out.best <= 16.5 < out.first_fail and (out.first_fail - out.best) / 16.5 <= 0.15, seen
    assert 16 in out.undecided and any(s.phase == "above" for s in out.steps)
    repeats = [s for i, s in enumerate(out.steps) if s.rate in {t.rate for t in out.steps[:i]}]
    assert all(s.phase == "extend" for s in repeats)  # a rate comes back only for more data


def test_search_spends_its_probes_after_an_undecided_doubling_step() -> None:
    """2 passes, 4 is undecided, 4.4 passes: the search goes on until a rate fails and the bracket meets the
    resolution (it used to stop there with half its probes unused and an open bracket)."""
    verdicts = {2.0: "pass", 4.0: "not_enough_data"}

    def probe(rate: float, phase: str) -> str:
        return verdicts.get(rate, "pass" if rate <= 8.07 else "fail")

    out = slo.search(probe, start=2, max_rate=64, min_rate=1, resolution=slo.Resolution(0.1, True), max_probes=8)
    assert [s.rate for s in out.steps][:4] == [2, 4, 4.4, 8.8]  # closes the open bracket by probing above
    assert out.first_fail is not None and out.best is not None and out.best <= 8.07 < out.first_fail
    assert out.status == "bracketed" and (out.first_fail - out.best) <= 0.1 * out.best + 1e-9


def test_search_stops_on_the_budget_with_the_bracket_so_far() -> None:
    calls: list[float] = []

    def probe(rate: float, phase: str) -> str:
        if len(calls) == 3:
            raise slo.SearchStopped("no time left")
        calls.append(rate)
        return "pass" if rate <= 5 else "fail"

    out = slo.search(probe, start=2, max_rate=64, min_rate=1, resolution=slo.Resolution(0.1, True), max_probes=20)
    assert (out.best, out.first_fail, out.status) == (4, 8, "time_budget") and out.width == 4


def test_search_ends_when_a_checked_model_settles() -> None:
    """A model checked against the probes that meets the resolution ends the search before its budget; the
    measured bracket is what the probes so far gave, and the status says why it ended."""
    probe, seen = _fake(13.0)
    out = slo.search(probe, start=2, max_rate=64, min_rate=1, resolution=slo.Resolution(0.05, True), max_probes=20,
                     settled=lambda: len(seen) >= 5)  # fmt: skip
    assert out.status == "settled" and len(out.steps) == 5 and out.best == 12 and out.first_fail == 16
    out = slo.search(probe, start=2, max_rate=64, min_rate=1, resolution=slo.Resolution(0.05, True), max_probes=20,
                     settled=lambda: False)  # fmt: skip
    assert out.status == "bracketed"


def test_pooling_across_rates_decides_what_one_rate_cannot() -> None:
    """Two rates whose measured shares break the monotone order are one isotonic block: 5 req/s alone (0.3%
    of 300 effective) cannot pass, but pooled with 6 req/s (no exceedance in 600) it passes, and so
    does every rate below; a pass never comes from a lower rate's data."""

    def entry(rate: float, over: int, n: int, verdict: str) -> ProbeEntry:
        check = slo.Check("ttft_p99", 500.0, None, None, None, n, verdict, n_effective=float(n), over=over)
        return ProbeEntry(0, rate, "search", verdict=verdict, checks=[check])

    probes = [entry(5, 1, 300, "not_enough_data"), entry(6, 0, 600, "pass"), entry(8, 40, 400, "fail")]
    assert [b.rates for b in slo.isotonic_blocks([(5, 1, 300), (6, 0, 600), (8, 40, 400)])] == [[5, 6], [8]]
    assert slo.pooled_verdicts(probes, {"ttft_p99": 0.01}, 0.95) == {5: "pass", 6: "pass", 8: "fail"}
    ordered = [entry(5, 0, 300, "not_enough_data"), entry(6, 1, 600, "not_enough_data")]
    assert slo.pooled_verdicts(ordered, {"ttft_p99": 0.01}, 0.95) == {5: "not_enough_data", 6: "not_enough_data"}


# ---------------------------------------------------------------------------------------- controllers


def test_command_server_fills_in_quoted_flags(tmp_path: Path) -> None:
    log = tmp_path / "calls"
    srv = CommandServer("http://127.0.0.1:9", f"echo {{config}} {{flags}} >> {log}")
    srv.use_config("mnbt-512")
    srv.start(["--max-num-batched-tokens", "512", "--x", "a b;rm -rf /"])
    assert log.read_text().strip() == "mnbt-512 --max-num-batched-tokens 512 --x a b;rm -rf /"
    assert "'a b;rm -rf /'" in (srv.last_command or "")
    with pytest.raises(ValueError):
        CommandServer("http://127.0.0.1:9", "restart.sh")


def test_compose_override_really_carries_the_flags(tmp_path: Path) -> None:
    calls: list[list[str]] = []

    def runner(argv: Any, env: Any) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv))
        out = json.dumps({"services": {"vllm": {"command": ["--model", "m", "--port", "8000"]}}})
        return subprocess.CompletedProcess(argv, 0, out if "config" in argv else "", "")

    c = ComposeWithFlags("vllm", ["docker-compose.yml"], tmp_path, runner=runner)
    c.use_config("nochunk")
    c.restart(["--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192"])
    override = tmp_path / "compose-nochunk.yml"
    cmd = json.loads(override.read_text())["services"]["vllm"]["command"]
    assert cmd == ["--model", "m", "--port", "8000", "--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192"]
    up = [a for a in calls if "up" in a][-1]
    assert up[-3:] == ["up", "-d", "vllm"] and str(override) in up


# ------------------------------------------------------------------------------------ the runner, faked


def _fake_runner(
    tmp_path: Path, capacity: float, edge: float, **plan: Any
) -> tuple[slo.SloRunner, RecordingController]:
    """A runner whose Locust runs are replaced by a latency model: TTFT p99 crosses 300 ms at ``capacity``,
    and probes within ``edge`` req/s of it straddle the limit."""
    ctl = RecordingController()
    p = slo.SloPlan(limits=slo.parse_slo("ttft_p99<=300ms"), configs=[slo.parse_config("a: max-num-seqs=8")],
                    start_rate=2, max_rate=64, min_rate=1, resolution=slo.Resolution(1, False), n=500, warmup=0,
                    resamples=300, **plan)  # fmt: skip
    runner = slo.SloRunner(p, ctl, tmp_path, log=lambda _line: None)
    now = [0.0]
    runner.clock = lambda: now[0]

    def run_child(
        config: Any, rate: float, seed: int, out: Path, n: int | None = None, warmup: bool | None = None
    ) -> slo.ProbeMark:
        out.mkdir(parents=True)
        now[0] += 500 / rate + slo.PROBE_OVERHEAD_S  # what the probe would have taken
        mark = {"rate": rate, "seed": seed, "stopped_early": None, "waiting_max": 0.0, "seconds": 1.0}
        (out / slo.PROBE_MARK).write_text(json.dumps(mark))  # a mark with fewer keys, as older versions wrote
        return slo.ProbeMark.from_json(mark)

    def attempt_data(out: Path, mark: slo.ProbeMark) -> slo.ProbeAttempt:
        rate = mark.rate
        if out.parent.name == "stage-warmup":  # a fresh server's first rounds stall once, then settle
            stall = {"a_w1": 900.0, "a_w2": 80.0}.get(out.name, 70.0)
            return _attempt([50.0] * 20 + [2 * stall])
        rng = np.random.default_rng(mark.seed + int(rate * 1000))
        if abs(rate - capacity) <= edge:
            vals = rng.permutation(np.r_[rng.uniform(50, 100, 490), rng.uniform(200, 400, 10)])
        else:
            vals = rng.uniform(50, 100 if rate < capacity else 1000, 500)
        return _attempt(vals.tolist())

    runner._run_child = run_child  # type: ignore[method-assign]
    runner._attempt_data = attempt_data  # type: ignore[method-assign]
    return runner, ctl


def test_runner_records_reruns_and_resumes(tmp_path: Path) -> None:
    runner, ctl = _fake_runner(tmp_path, capacity=12, edge=0.6, reruns=1, extend=1, max_probes=10)
    runner.run()
    state = json.loads((tmp_path / slo.SLO_FILE).read_text())
    c = state["configs"][0]
    assert ctl.restarted == [["--max-num-seqs", "8"]] and c["server"]["flags_applied"] is True
    assert [p["rate"] for p in c["probes"]][:4] == [2, 4, 8, 16]
    r = c["result"]
    assert r["best_rate"] < 12 <= r["first_fail_rate"] and r["binding"] == "ttft_p99"
    assert r["width"] == pytest.approx(r["first_fail_rate"] - r["best_rate"], abs=1e-6)
    undecided = [p for p in c["probes"] if p["verdict"] == "not_enough_data"]
    # a first call re-runs once (the same workload), then extends once (a new sample), the attempts pooled;
    # a later call at the same rate goes on with new samples, pooled with the earlier ones
    first_calls = [p for p in undecided if p["phase"] != "extend"]
    assert first_calls and all([a["seed"] for a in p["attempts"]] == [7, 7, 1007] for p in first_calls)
    for p in undecided:
        assert p["undecided_reason"] and "ttft_p99" in p["undecided_reason"]
        assert p["pooled_attempts"] >= len(p["attempts"])
    assert all(u["n_effective"] is not None and u["reason"] for u in r["undecided"])
    assert state["plan"]["look_confidence"] == 0.95  # anytime-valid: no share of the error per look
    assert all(0.8 * 500 * p["pooled_attempts"] <= p["checks"][0]["n"] <= 500 * p["pooled_attempts"]
               for p in c["probes"])  # fmt: skip
    # a second run finds every attempt on disk and never restarts the server
    again, ctl2 = _fake_runner(tmp_path, capacity=12, edge=0.6, reruns=1, extend=1, max_probes=10)
    again.run()
    assert ctl2.restarted == []
    assert json.loads((tmp_path / slo.SLO_FILE).read_text())["configs"][0]["result"] == r


def test_runner_time_budget_keeps_the_bracket(tmp_path: Path) -> None:
    # 2, 4, 8 req/s take 250 + 125 + 62.5 s of arrivals plus overheads; 16 req/s would not fit in 520 s
    runner, _ = _fake_runner(tmp_path, capacity=12, edge=0.0, time_budget=520, reruns=0, extend=0)
    runner.run()
    c = json.loads((tmp_path / slo.SLO_FILE).read_text())["configs"][0]
    assert [p["rate"] for p in c["probes"]] == [2, 4, 8]
    r = c["result"]
    assert r["status"] == "time_budget" and r["best_rate"] == 8 and r["first_fail_rate"] is None


def test_resume_refuses_a_changed_plan_after_an_interrupted_first_probe(tmp_path: Path) -> None:
    """The plan is in slo.json before the first probe starts, and an attempt folder on disk is measured data:
    a changed SLO is refused even though no probe reached the file's list."""
    from tailgate.slo.command import resume_refusal

    plan = slo.SloPlan(limits=slo.parse_slo("ttft_p99<=300ms"), configs=[slo.parse_config("a")], n=500)
    runner = slo.SloRunner(plan, RecordingController(), tmp_path, log=lambda _line: None)

    def interrupted(config: Any) -> dict[str, Any]:  # the first attempt ended, then the command was stopped
        out = tmp_path / slo.probe_dir_name("a", plan.start_rate, 1)
        out.mkdir()
        (out / slo.PROBE_MARK).write_text("{}")
        raise KeyboardInterrupt

    runner.run_config = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    assert not json.loads((tmp_path / slo.SLO_FILE).read_text())["configs"]
    changed = slo.SloPlan(limits=slo.parse_slo("ttft_p99<=500ms"), configs=[slo.parse_config("a")], n=800)
    why = resume_refusal(tmp_path, changed)
    assert why is not None and "slo" in why and "n" in why
    assert resume_refusal(tmp_path, plan) is None


def test_resume_refuses_a_damaged_slo_json_in_one_line(tmp_path: Path) -> None:
    """A probe row of the wrong shape is named (file, place, key) before any server starts, not met later as a
    traceback; an unknown key beside the known ones survives a read and a write."""
    from tailgate.runmeta import SloMeta
    from tailgate.slo.command import resume_refusal
    from tailgate.slo.state import AttemptRow, SloState

    plan = slo.SloPlan(limits=slo.parse_slo("ttft_p99<=300ms"), configs=[slo.parse_config("a")])
    probe = {"index": 1, "rate": 4, "phase": "double", "attempts": [{"dir": "d1", "seed": 7, "sent": 30, "later": 1}]}
    good = {"created": "t", "plan": plan.describe(), "configs": [{"name": "a", "probes": [probe], "mine": [1]}]}
    (tmp_path / slo.SLO_FILE).write_text(json.dumps(good))
    assert resume_refusal(tmp_path, plan) is None
    written = json.dumps(SloState.from_meta(SloMeta.read(tmp_path / slo.SLO_FILE)).to_dict())
    config = json.loads(written)["configs"][0]
    assert config["mine"] == [1] and config["probes"][0]["rate"] == 4  # an integer rate stays one
    assert config["probes"][0]["attempts"][0] == {**AttemptRow("d1", 7, sent=30).to_dict(), "later": 1}
    probe["rate"] = "four"
    (tmp_path / slo.SLO_FILE).write_text(json.dumps(good))
    why = resume_refusal(tmp_path, plan)
    assert why == (f"{tmp_path / slo.SLO_FILE} configs[0] probes[0]: key 'rate' should be a number, got 'four' (str); "
                   "repair it or use a new --results folder")  # fmt: skip


# ------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--server", "url"], "--slo"),
        (["--slo", "ttft_p99<=3furlongs", "--server", "url"], "--slo"),
        (["--slo", "ttft_p99<=1s", "--knob", "warp=1", "--server", "url"], "--knob"),
        (["--slo", "ttft_p99<=1s", "--knob", "chunked=", "--server", "url"], "--knob"),
        (["--slo", "ttft_p99<=1s", "--sweep", "{empty}", "--server", "url"], "--sweep"),
        (["--slo", "ttft_p99<=1s", "--config", "a", "--config", "b", "--server", "url"], "--config"),
        (["--slo", "ttft_p99<=1s", "--resolution", "0"], "--resolution"),
        (["--slo", "ttft_p99<=1s", "--server", "command"], "--restart-command"),
        (["--slo", "ttft_p99<=1s", "--server", "url", "--host", "ftp://x"], "--host"),
        (["--slo", "ttft_p99<=1s", "--server", "url", "--host", "http://[::1"], "--host"),
        (["--slo", "ttft_p99<=1s", "--server", "url", "--start-rate", "8", "--max-rate", "4"], "--max-rate"),
        (["--slo", "ttft_p99<=1s", "--server", "url", "--n", "0"], "--n"),
        (["--slo", "ttft_p99<=1s", "--server", "url", "--n", "10", "--warmup", "25"], "--n"),
        (["--slo", "ttft_p99<=1s", "--server", "url", "--trace-file", "/nonexistent/t.jsonl"], "--trace-file"),
        (["--slo", "ttft_p99<=1s", "--server", "warp"], "--server"),
        (["--slo", "ttft_p99<=1s", "--embedded", "--server", "url"], "--embedded"),
        (["--slo", "ttft_p99<=1s", "--server", "url", "--locust-arg=--prompts=dataset"], "--dataset"),
        (["--slo", "ttft_p99<=1s", "--server", "url", "--locust-arg=--prompts=bogus"], "--prompts"),
    ],
)
def test_bad_input_one_line_exit_2(tmp_path: Path, args: list[str], option: str) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    args = [str(empty) if a == "{empty}" else a for a in args]
    done = subprocess.run([sys.executable, "-m", "tailgate.cli", "slo", *args, "--results", str(tmp_path / "r")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and option in lines[0] and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "r" / "slo.json").exists()


# ------------------------------------------------------------------------------------- report section


def test_report_section_from_synthetic_state(tmp_path: Path) -> None:
    from tailgate.postprocess.slo import recommendation, slo_rows, slo_section, table_markdown

    def probe(i: int, rate: float, verdict: str, ttft: float) -> dict[str, Any]:
        check = {"key": "ttft_p99", "limit": 300.0, "point": ttft, "low": ttft * 0.9, "high": ttft * 1.1,
                 "n": 200, "verdict": verdict}  # fmt: skip
        return {"index": i, "rate": rate, "phase": "double", "verdict": verdict, "checks": [check],
                "binding": None if verdict == "pass" else "ttft_p99",
                "p99": {"ttft": ttft, "gap": 50.0, "total": 900.0},
                "attempts": [{"dir": f"x_r{rate:g}", "waiting_max": 30 if verdict == "fail" else 0,
                              "preemptions_delta": 0, "n_measured": 200, "errors": 0,
                              "stopped_early": None}]}  # fmt: skip

    state = {
        "plan": {"slo": "ttft_p99<=300ms", "limits": [{"key": "ttft_p99", "metric": "ttft", "p": 99, "limit": 300.0}],
                 "start_rate": 5, "max_rate": 64, "resolution": "25%", "n": 200, "warmup": 25,
                 "confidence": 0.95, "resamples": 2000, "reruns": 1},
        "configs": [
            {"name": "a", "flags": [], "server": {"flags_applied": True}, "probes": [
                probe(1, 5, "pass", 100), probe(2, 10, "pass", 200), probe(3, 20, "fail", 600)],
             "result": {"best_rate": 10, "first_fail_rate": 20, "status": "bracketed", "binding": "ttft_p99"}},
            {"name": "b", "flags": ["--max-num-batched-tokens", "512"], "server": {}, "probes": [
                probe(1, 5, "fail", 400)],
             "result": {"best_rate": None, "first_fail_rate": 5, "status": "below_min", "binding": "ttft_p99"}},
        ],
    }  # fmt: skip
    (tmp_path / "slo.json").write_text(json.dumps(state))
    rows = slo_rows(state, pd.DataFrame())
    assert rows[0]["mechanism"] == "admission queueing" and rows[0]["p99"]["ttft"] == 200
    assert recommendation(rows, "ttft_p99<=300ms").startswith("Run a (")
    # brackets that overlap never rank, however the passing rates compare
    overlapping = [dict(rows[0]), {**rows[0], "config": "c", "best_rate": 7.5, "first_fail_rate": 15}]
    text = recommendation(overlapping, "ttft_p99<=300ms")
    assert text.startswith("Not distinguishable at this n; run longer") and "overlap" in text
    unresolved = [dict(rows[0]), {**rows[0], "config": "d", "best_rate": 5, "first_fail_rate": None,
                                  "status": "unresolved"}]  # fmt: skip
    assert "d did not close a bracket" in recommendation(unresolved, "ttft_p99<=300ms")
    section = slo_section(tmp_path, pd.DataFrame(), tmp_path / "report")
    assert section is not None
    assert 'id="slo"' in section.html and "admission queueing" in section.html
    assert (tmp_path / "report" / "slo_rate.png").stat().st_size > 0
    assert (tmp_path / "report" / "slo_p99.svg").stat().st_size > 0
    assert "| a |" in section.table_md.read_text()
    # an extension drew a second sample of the workload: the table names both seeds
    state["configs"][0]["probes"][1]["attempts"] += [{"dir": "x_r10_a2", "seed": 7}, {"dir": "x_r10_a3", "seed": 1007}]
    assert "3 (5; seeds 7, 1007)" in table_markdown(slo_rows(state, pd.DataFrame()), "ttft_p99<=300ms")


# ------------------------------------------------------------------------------------ end to end, CPU vLLM


def _follows_the_search(probes: list[dict[str, Any]], **rules: Any) -> None:
    """Each recorded probe is the one the search asks for, given the verdicts before it: the recorded
    verdicts replayed through :func:`slo.search` ask for the same rates in the same phases."""
    from tailgate.slo.model import binding_model

    verdicts = iter(p["verdict"] for p in probes)
    asked: list[tuple[float, str]] = []
    limits = {lim["key"]: lim["limit"] for lim in rules.pop("limits") if lim.get("p") is not None}
    tails = {k: 0.01 for k in limits}

    def replay(rate: float, phase: str) -> str:
        asked.append((rate, phase))
        return next(verdicts, "fail")

    def so_far() -> list[ProbeEntry]:
        return [ProbeEntry.from_dict(p) for p in probes[: len(asked)]]

    def pooled() -> dict[float, str]:
        return slo.pooled_verdicts(list({p.rate: p for p in so_far()}.values()), tails, 0.95)

    def guess() -> float | None:
        return getattr(binding_model(so_far(), limits), "capacity", None)

    def on_track() -> list[float]:
        latest = {p.rate: p for p in so_far()}
        return sorted(rate for rate, p in latest.items() if lacks_only_data(p.verdict, p.checks))

    slo.search(replay, pooled=pooled, guess=guess, on_track=on_track, **rules)
    assert [(p["rate"], p["phase"]) for p in probes] == asked[: len(probes)]


@pytest.mark.vllm
def test_embedded_slo_end_to_end(tmp_path: Path) -> None:
    """Scaled down: short requests, one in flight at most, so arrivals above the server's pace are dropped
    (and count as errors); the error limit then fails at high rates on any machine, however busy."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"prompt_tokens": 16, "max_tokens": 24}) + "\n" for _ in range(13)))
    results = tmp_path / "slo"
    cmd = [sys.executable, "-m", "tailgate.cli", "slo", "--embedded", "--results", str(results),
           "--slo", "ttft_p99<=60s,gap_p99<=30s,errors<=30%", "--config", "seqs4: max-num-seqs=4",
           "--trace-file", str(trace), "--warmup", "1", "--start-rate", "1", "--min-rate", "1", "--max-rate", "16",
           "--resolution", "50%", "--max-probes", "6", "--reruns", "1", "--extend", "0",
           "--locust-arg=--settle=0", "--locust-arg=--max-in-flight=1", "--model-replicates", "2",
           "--model-requests", "2000"]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    out = done.stdout + done.stderr
    state = json.loads((results / "slo.json").read_text())
    config = state["configs"][0]
    result = config["result"]
    # 3 only when the lowest rate reached was shown to fail; nothing decided either way is "undecided" (5)
    lowest = result["verdicts"][min(result["verdicts"], key=float)]
    assert done.returncode == (0 if result["best_rate"] is not None else 3 if lowest == "fail" else 5), out[-4000:]
    assert "Traceback" not in out
    # the effective server command carries the knob
    command = config["server"]["command"]
    assert config["server"]["flags_applied"] and "--max-num-seqs" in command and "4" in command
    assert "--enforce-eager" in command
    # every probe recorded, none discarded: one folder per attempt, a verdict with intervals per probe
    probes = config["probes"]
    assert 1 <= len(probes) <= 6
    for p in probes:
        assert p["verdict"] in ("pass", "fail", "not_enough_data")
        for a in p["attempts"]:
            assert (results / a["dir"] / "slo-probe.json").exists()
        assert len(p["attempts"]) == (2 if p["verdict"] == "not_enough_data" else len(p["attempts"]))
        for ch in p["checks"]:
            if ch["point"] is not None and ch["low"] is not None and ch["high"] is not None:
                assert ch["low"] <= ch["point"] + 1e-6 and ch["point"] <= ch["high"] + 1e-6
    _follows_the_search(probes, start=1.0, max_rate=16.0, min_rate=1.0, resolution=slo.Resolution(0.5, True),
                        max_probes=6, limits=state["plan"]["limits"])  # fmt: skip
    verdicts = [p["verdict"] for p in probes]
    if "pass" in verdicts and any(v != "pass" for v in verdicts) and len(probes) < 6:
        assert any(p["phase"] in ("bisect", "halve", "above") for p in probes)  # doubling then narrowing
    if result["first_fail_rate"] is not None:
        assert result["binding"] in ("ttft_p99", "gap_p99", "errors", "sustained")
    # the step loop fitted to the real engine's streams: labelled, and either an interval or why there is none
    fitted = result["fitted"]
    assert fitted["label"] == "model estimate, not a measurement" and fitted["why"]
    assert fitted["bracket"] is None or fitted["usable"]
    # 12 measured requests can support no bound on a p99 (an anytime-valid 95% one needs 449): never a pass,
    # and the command says why
    assert all(p["verdict"] != "pass" for p in probes) and "below the 449 an anytime-valid 95% bound" in out
    # the report has the section, its table and charts
    html = (results / "report" / "report.html").read_text()
    assert 'id="slo"' in html and "Capacity under the SLO" in html and "seqs4" in html
    assert (results / "report" / "slo_table.md").exists() and (results / "report" / "slo_rate.png").exists()
    # and a second run reuses every probe instead of sending anything
    again = subprocess.run([*cmd, "--no-report"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == done.returncode, (again.stdout + again.stderr)[-3000:]
    assert "restarting" not in again.stdout and again.stdout.count("already done") == sum(
        len(p["attempts"]) for p in probes
    )


def test_imports_stay_on_their_side() -> None:
    """The search drives children and reads JSONL without pandas; its report section never pulls in gevent."""
    code = (
        "import sys\n"
        "import tailgate.slo, tailgate.servers.sweep\n"
        "assert not ({'pandas', 'gevent', 'locust'} & set(sys.modules))\n"
        "import tailgate.postprocess.slo\n"
        "assert not ({'gevent', 'locust'} & set(sys.modules))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


def test_mechanism_at_the_limit() -> None:
    """The same evidence as the diagnosis: the preemption counter, the queue and TTFT growth, gap growth."""
    from tailgate.postprocess.slo import mechanism

    def cfg(binding: str, p99_low: dict[str, float], p99_high: dict[str, float], **attempt: Any) -> dict[str, Any]:
        a = {"dir": "none", "waiting_max": 0, "preemptions_delta": 0, "schedule_lag_p99": 1.0, **attempt}
        return {"probes": [{"rate": 5, "verdict": "pass", "p99": p99_low, "attempts": [dict(a)]},
                           {"rate": 10, "verdict": "fail", "binding": binding, "p99": p99_high, "attempts": [a]}],
                "result": {"best_rate": 5, "first_fail_rate": 10}}  # fmt: skip

    flat, slow = {"ttft": 100, "gap": 100}, {"ttft": 110, "gap": 400}
    assert mechanism(cfg("gap_p99", flat, slow, preemptions_delta=7), pd.DataFrame())["mechanism"] == "preemption"
    assert mechanism(cfg("gap_p99", flat, slow), pd.DataFrame())["mechanism"] == "prefill insertion"
    queued = mechanism(cfg("ttft_p99", flat, {"ttft": 900, "gap": 110}), pd.DataFrame())
    assert queued["mechanism"] == "admission queueing" and "×9" in queued["text"]
    lagging = mechanism(cfg("ttft_p99", flat, {"ttft": 900, "gap": 110}, schedule_lag_p99=50.0), pd.DataFrame())
    assert "load generator fell behind" in lagging["text"]
    # one sample with one request waiting, in one attempt of two, names no mechanism
    blip = cfg("ttft_p99", flat, {"ttft": 130, "gap": 110}, waiting_max=1, waiting_share=0.02)
    blip["probes"][1]["attempts"].append({**blip["probes"][1]["attempts"][0], "waiting_max": 0, "waiting_share": 0.0})
    assert mechanism(blip, pd.DataFrame())["mechanism"] == "unattributed"
    # preemption only when the counter moved in every attempt, the counts shown per attempt
    once = cfg("gap_p99", flat, slow, preemptions_delta=7)
    once["probes"][1]["attempts"].append({**once["probes"][1]["attempts"][0], "preemptions_delta": 0})
    m = mechanism(once, pd.DataFrame())
    assert m["mechanism"] != "preemption" and "7 / 0" in m["text"]
    none = mechanism({"probes": [], "result": {"best_rate": 5, "first_fail_rate": None}}, pd.DataFrame())
    assert none["mechanism"] == "none"


def test_mechanism_needs_evidence_that_differs_from_the_passing_rate() -> None:
    """The preemption counter rose as much at the passing rate as at the failing one: it explains neither.
    The queue, non-empty half the time where the SLO broke and rarely where it held, names admission."""
    from tailgate.postprocess.slo import mechanism

    def probe(rate: float, verdict: str, preempt: int, share: float, ttft: float) -> dict[str, Any]:
        attempt = {"dir": "none", "waiting_max": 9, "preemptions_delta": preempt, "n_measured": 1000,
                   "waiting_share": share, "schedule_lag_p99": 1.0}  # fmt: skip
        return {"rate": rate, "verdict": verdict, "binding": None if verdict == "pass" else "ttft_p99",
                "p99": {"ttft": ttft, "gap": 20.0}, "attempts": [attempt]}  # fmt: skip

    cfg = {"probes": [probe(2, "pass", 1, 0.01, 60), probe(6, "pass", 30, 0.05, 120), probe(8, "fail", 30, 0.48, 1100)],
           "result": {"best_rate": 6, "first_fail_rate": 8}}  # fmt: skip
    m = mechanism(cfg, pd.DataFrame())
    assert m["mechanism"] == "admission queueing", m
    assert "at the passing 6 req/s" in m["text"] and "30.0 here" in m["text"]
    cfg["probes"][2]["attempts"][0].update(preemptions_delta=400, waiting_share=0.05)
    assert mechanism(cfg, pd.DataFrame())["mechanism"] == "preemption"


def test_terminal_and_report_show_both_ends_width_and_why_undecided(tmp_path: Path) -> None:
    from tailgate.postprocess.slo import slo_section
    from tailgate.slo.answer import answer_line, check_text, result_of
    from tailgate.slo.result import SearchResult

    def check(key: str, verdict: str, point: float, n_eff: float | None = 139.0) -> dict[str, Any]:
        return {"key": key, "limit": 500.0 if key != "sustained" else 0.9, "point": point,
                "low": None if key == "sustained" else point * 0.8, "high": None, "n": 1875,
                "verdict": verdict, "reason": "effective n 139 (n 1875, design effect 13.5) is below the 449 needed",
                "n_effective": None if key == "sustained" else n_eff, "excluded": 0, "over": 12}  # fmt: skip

    def probe(i: int, rate: float, verdict: str) -> dict[str, Any]:
        checks = [check("ttft_p99", verdict, 370.3), check("sustained", "pass", 0.995)]
        return {"index": i, "rate": rate, "phase": "double", "verdict": verdict, "checks": checks,
                "binding": None if verdict == "pass" else "ttft_p99",
                "undecided_reason": "ttft_p99: effective n 139" if verdict == "not_enough_data" else None,
                "p99": {"ttft": 370.3, "gap": 3.0, "total": 900.0},
                "attempts": [{"dir": f"d{i}", "seed": 7, "seconds": 120.0, "n_measured": 1875, "errors": 0,
                              "stopped_early": None}]}  # fmt: skip

    probes = [probe(1, 4, "pass"), probe(2, 6, "not_enough_data"), probe(3, 8, "fail")]
    outcome = slo.SearchOutcome(4, 8, "time_budget", [], {4: "pass", 6: "not_enough_data", 8: "fail"})
    plan = slo.SloPlan(limits=slo.parse_slo("ttft_p99<=500ms"), configs=[], resolution=slo.Resolution(0.1, True))
    result = result_of(outcome, [ProbeEntry.from_dict(p) for p in probes], plan)
    line = answer_line(result)
    assert "[4, 8] req/s (4 req/s wide, 100% of the lower end)" in line and "unresolved" not in line
    assert "not enough data at 6 req/s (effective n 139 of 1875)" in line
    sustained = check_text(probes[0]["checks"][1])
    assert "None" not in sustained and "at least 90%" in sustained and sustained.endswith("pass")
    stopped = check_text({**probes[0]["checks"][1], "point": None, "verdict": "fail", "reason": "stopped early: queue"})
    assert stopped == "sustained: stopped early: queue: fail"
    logged: list[str] = []
    table = SloState(plan={"slo": "ttft_p99<=500ms"}, configs=[ConfigSearch("a", result=result)])
    slo.print_table(table, logged.append)
    assert "[4, 8] req/s" in logged[1] and "ttft p99 370.3 ms" in logged[1]  # the table's own figure
    state = {"plan": {"slo": "ttft_p99<=500ms", "limits": [{"key": "ttft_p99", "metric": "ttft", "p": 99,
                                                              "limit": 500.0}], "start_rate": 2, "max_rate": 64,
                      "resolution": "10%", "n": 400, "warmup": 25, "confidence": 0.95},
             "configs": [{"name": "a", "flags": [], "server": {}, "probes": probes, "result": result}]}  # fmt: skip
    result.model = {"key": "ttft_p99", "mu": 9.0, "base": 40.0, "scale": 30.0, "capacity": 8.2,
                       "consistent": 3, "checked": 3, "label": "model estimate, not a measurement"}  # fmt: skip
    assert "model estimate (not a measurement): capacity ~8.2 req/s" in answer_line(result)
    (tmp_path / "slo.json").write_text(json.dumps(state, default=lambda r: r.to_json()))
    assert SearchResult.from_json(json.loads((tmp_path / "slo.json").read_text())["configs"][0]["result"]) == result
    section = slo_section(tmp_path, pd.DataFrame(), tmp_path / "report")
    assert section is not None
    html = str(section.html)
    assert "Dotted: the model" in html and "Model estimate (not a measurement): capacity ~8.2 req/s" in html
    assert "None" not in html and "unresolved" not in html and "bootstrap" not in html
    assert "lowest failing rate above it" in html and "4 req/s (100%)" in html and "370.3" in html
    assert "effective n 139.0 of 1875" in html and "effective n 139 of 1875" in html
    # the fitted step loop: labelled wherever it is shown, its narrowed bracket only when its checks held
    fitted = {
        "label": "model estimate, not a measurement",
        "capacity": 6.6,
        "interval": [6.3, 6.9],
        "usable": True,
        "why": "every check held",
        "bracket": [6.3, 6.9],
        "slots_reached": True,
        "streams": 5600,
        "engine": {
            "slots": 4,
            "step_ms": 0.5,
            "step_ms_per_seq": 0.5,
            "prefill_ms_per_token": 0.005,
            "chunked": False,
            "chunk_tokens": 512,
        },
        "replay": [
            {
                "rate": 4,
                "key": "ttft_p99",
                "measured": 370.3,
                "model": 360.0,
                "low": 300.0,
                "high": None,
                "inside": True,
            }
        ],
        "curve": [{"rate": r, "ttft": [v, v * 0.9, v * 1.1]} for r, v in ((4, 360), (6, 450), (8, 700))],
        "single_runs": {"requests": 4000, "runs": 72, "middle_95": [6.1, 6.8], "capacities": [6.1, 6.5, 6.8]},
    }
    result.fitted = fitted
    line = answer_line(result)
    assert "fitted step loop (model estimate, not a measurement): capacity 6.6 req/s" in line
    assert "one run of 4,000 requests alone crosses at 6.1-6.8 req/s in the model (95% of 72 simulated runs)" in line
    assert "bracket narrowed by the model: [6.3, 6.9] req/s (10% wide)" in line
    (tmp_path / "slo.json").write_text(json.dumps(state, default=lambda r: r.to_json()))
    section = slo_section(tmp_path, pd.DataFrame(), tmp_path / "report")
    assert section is not None
    html = str(section.html)
    assert "Fitted step loop (model estimate, not a measurement)" in html and "the bracket narrowed by it" in html
    assert "one run of 4,000 requests alone crosses at\n6.1-6.8 req/s in 95% of the\nmodel's 72 runs" in html
    assert "[6.3, 6.9] (10%)" in section.table_md.read_text()
    svg = (tmp_path / "report" / "slo_p99.svg").read_text()
    assert "a (fitted step loop, model)" in svg
    result.fitted = {**fitted, "usable": False, "bracket": None, "why": "its replay of 8 req/s gives more"}
    assert "the model narrows nothing: its replay of 8 req/s gives more" in answer_line(result)


def test_rate_model_recovers_a_known_curve_and_is_checked_against_the_probes() -> None:
    """Points on base + scale * rate / (mu - rate) give back its capacity; a probe whose interval misses the
    model is counted as such; too few rates give no model (and never a verdict)."""
    from tailgate.slo.model import Point, fit

    def true(r: float) -> float:
        return 40 + 25 * r / (10 - r)

    pts = [Point(r, true(r), true(r) * 0.9, true(r) * 1.1) for r in (2, 4, 6, 8, 9)]
    m = fit([*pts, Point(12, None, None, None, sustained=False)], limit=500)
    assert m is not None and m.capacity is not None
    assert m.capacity == pytest.approx(10 * 460 / 485, rel=0.02) and m.consistent == m.checked == 5
    wrong = fit([*pts[:4], Point(9, 50, 45, 55)], limit=500)  # lower than at 8 req/s: no such curve
    assert wrong is not None and wrong.consistent < wrong.checked
    assert fit(pts[:2], limit=500) is None
    assert "not a measurement" in m.as_dict()["label"]


def test_a_rate_where_one_sample_fell_behind_bounds_the_model_as_a_failure_does() -> None:
    """Its verdict stays open, but its percentile is no point on a steady state's curve: the model takes it as
    a rate not sustained, where a rate merely too short to tell is a point like any other."""
    from tailgate.slo.model import points_of

    def entry(rate: float, verdict: str, behind: int | None) -> ProbeEntry:
        checks = [slo.Check("ttft_p99", 4000.0, 900.0, 700.0, None, 480, "not_enough_data"),
                  slo.Check("sustained", 0.9, 0.8, None, None, 480, verdict, over=behind)]  # fmt: skip
        return ProbeEntry(0, rate, "double", verdict="not_enough_data", checks=checks)

    probes = [entry(8, "not_enough_data", 0), entry(12, "not_enough_data", None), entry(16, "not_enough_data", 1),
              entry(20, "fail", 2)]  # fmt: skip
    assert [p.sustained for p in points_of(probes, "ttft_p99")] == [True, True, False, False]


def test_stage_warmup_loads_the_highest_rate_until_no_first_time_pause(tmp_path: Path) -> None:
    """Rounds at --max-rate before the first probe: the first round's worst gap (a first-time pause) is well
    above the second's, the third is within 25% of the second, so the warm-up stops there; kept aside from the
    cells, recorded, and not run again on a resume."""
    runner, _ = _fake_runner(tmp_path, capacity=12, edge=0.0, stage_warmup=50, max_probes=2)
    rates: list[float] = []
    run_child = runner._run_child

    def spy(
        config: Any, rate: float, seed: int, out: Path, n: int | None = None, warmup: bool | None = None
    ) -> slo.ProbeMark:
        rates.append(rate if n is None or warmup else -rate)
        return run_child(config, rate, seed, out, n)

    runner._run_child = spy  # type: ignore[method-assign]
    runner.run()
    c = json.loads((tmp_path / slo.SLO_FILE).read_text())["configs"][0]
    assert rates[:3] == [-64, -64, -64] and rates[3] == 2  # the warm-up rounds come first, at the top rate
    warm = c["stage_warmup"]
    assert [r["worst_gap_ms"] for r in warm["rounds"]] == [900, 80, 70] and warm["settled"] is True
    assert (tmp_path / "stage-warmup" / "a_w1" / slo.PROBE_MARK).exists()
    again, _ = _fake_runner(tmp_path, capacity=12, edge=0.0, stage_warmup=50, max_probes=2)
    again.run()
    assert json.loads((tmp_path / slo.SLO_FILE).read_text())["configs"][0]["stage_warmup"] == warm


def test_an_attempt_measures_how_busy_the_machine_was_beside_its_server() -> None:
    """The CPU other processes take while an attempt runs against a server on this machine: a busy loop beside
    a sleeping "server" and "Locust child" shows as about a core; a server elsewhere is not measured."""
    import subprocess
    import sys
    import time

    from tailgate.slo.attempt import ProbeMark
    from tailgate.slo.busy import BUSY_OTHER_CORES, MachineWatch, busy_line

    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    server, child = subprocess.Popen(sleeper), subprocess.Popen(sleeper)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        watch = MachineWatch(server.pid)
        watch.on_start(child.pid)
        time.sleep(2.0)
        others = watch.stop()
    finally:
        for p in (server, child, busy):
            p.kill()
            p.wait()
    assert others is not None and others >= BUSY_OTHER_CORES, others
    assert busy_line(others) is not None and busy_line(0.05) is None and busy_line(None) is None
    elsewhere = MachineWatch(None)
    elsewhere.on_start(child.pid)
    assert elsewhere.stop() is None
    mark = ProbeMark(4.0, 7, others_busy_cores=others)
    assert ProbeMark.from_json(mark.to_json()) == mark
    assert ProbeMark.from_json({"rate": 4, "seed": 7}).others_busy_cores is None  # a mark written before


def test_the_answer_says_when_the_machine_was_busy() -> None:
    from tailgate.slo.answer import answer_line
    from tailgate.slo.result import SearchResult

    quiet = SearchResult(4.0, 8.0, "bracketed", resolution="10%")
    busy = SearchResult(4.0, 8.0, "bracketed", resolution="10%", busy_attempts=2, others_busy_cores_max=1.4)
    assert "busy" not in answer_line(quiet)
    assert "the machine was busy during 2 attempt(s): other processes took up to 1.4 core(s)" in answer_line(busy)
    assert SearchResult.from_json(busy.to_json()) == busy
    from tailgate.postprocess.slo import recommendation

    row = {"config": "chunked", "flags": "(defaults)", "best_rate": 4.0, "first_fail_rate": 8.0,
           "status": "bracketed", "binding": "ttft_p99", "mechanism": "admission queueing",
           "mechanism_text": "queue", "uncertain": []}  # fmt: skip
    assert "busy" not in recommendation([row], "TTFT p99 <= 1 s")
    said = recommendation([{**row, "busy_attempts": 2, "others_busy_cores_max": 1.4}], "TTFT p99 <= 1 s")
    assert "The machine was busy during 2 attempt(s) of chunked: other processes took up to 1.4 core(s)" in said
