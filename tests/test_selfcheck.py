"""The self-check: its statistics against known values, its join on hand-made logs, and one real run.

The real run is small (5 req/s, 20 streams of 20 chunks) and its error bound generous (20 ms),
because CI shares two cores with other work: what it proves is that a real Locust process and
the ground-truth server are joined exactly, chunk for chunk, not how small the error is here.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import pytest
from recordkit import record
from runkit import stall_locust_mid_stage

from tailgate.records import RequestRecord
from tailgate.verify.selfcheck import (
    EXIT_USAGE,
    SelfCheckConfig,
    join_records,
    kolmogorov_sf,
    ks_exponential,
    main,
    render,
    run_selfcheck,
)

# the busy pass (scripts/test.sh) runs these again: their verdicts depend on when things happen
pytestmark = pytest.mark.timing

# ---------------------------------------------------------------------------------------- statistics


@pytest.mark.parametrize(
    ("x", "expected"),
    [
        (1.3581, 0.05),  # the 5% critical value of the Kolmogorov distribution
        (1.6276, 0.01),  # the 1% critical value
        (1.2238, 0.10),
        (0.8276, 0.50),  # its median
    ],
)
def test_kolmogorov_survival_matches_critical_values(x: float, expected: float) -> None:
    assert kolmogorov_sf(x) == pytest.approx(expected, abs=5e-4)


def test_kolmogorov_survival_limits() -> None:
    assert kolmogorov_sf(0.0) == 1.0
    assert kolmogorov_sf(0.1) == 1.0
    assert kolmogorov_sf(5.0) < 1e-20
    xs = [0.3 + 0.05 * i for i in range(60)]
    values = [kolmogorov_sf(x) for x in xs]
    assert all(a >= b for a, b in itertools.pairwise(values))


def test_ks_statistic_by_hand() -> None:
    # F(x) = 1 - e^-x at 0.5, 1, 2 is 0.3935, 0.6321, 0.8647; the largest distance is F(0.5) - 0 = 0.3935
    r = ks_exponential([2.0, 0.5, 1.0], rate=1.0)
    assert r.n == 3
    assert r.statistic == pytest.approx(1 - math.exp(-0.5), abs=1e-12)
    root = math.sqrt(3)
    assert r.p_value == pytest.approx(kolmogorov_sf((root + 0.12 + 0.11 / root) * r.statistic))


def test_ks_statistic_one_sample_at_the_median() -> None:
    median = math.log(2) / 4.0
    assert ks_exponential([median], rate=4.0).statistic == pytest.approx(0.5)


def test_ks_accepts_exponential_and_rejects_others() -> None:
    rng = random.Random(1)
    exp5 = [rng.expovariate(5.0) for _ in range(2000)]
    assert ks_exponential(exp5, 5.0).p_value > 0.01
    assert ks_exponential(exp5, 10.0).p_value < 1e-6  # right shape, wrong rate
    uniform = [rng.uniform(0.0, 0.4) for _ in range(2000)]  # mean 0.2 like Exp(5), wrong shape
    assert ks_exponential(uniform, 5.0).p_value < 1e-6
    constant = [0.2] * 500  # a fixed-interval sender: the classic closed-loop give-away
    assert ks_exponential(constant, 5.0).p_value < 1e-6


def test_ks_rejects_a_bad_rate() -> None:
    with pytest.raises(ValueError):
        ks_exponential([1.0], 0.0)


# ---------------------------------------------------------------------------------------------- join


def _dump(streams: dict[int, list[int]], received: dict[int, int]) -> dict:
    chunks = [[seq, i, t] for seq, times in streams.items() for i, t in enumerate(times)]
    return {
        "chunks": chunks,
        "chunk_targets": [t for _, _, t in chunks],
        "chunk_write_begin": [t - 1000 for _, _, t in chunks],
        "requests": [[seq, recv, times[0]] for seq, times in streams.items() for recv in [received[seq]]],
    }


def _record(seq: int, sent_ns: int, offsets_ms: list[float], **extra: object) -> RequestRecord:
    gaps = [b - a for a, b in itertools.pairwise(offsets_ms)]
    fields: dict[str, object] = {
        "trace_id": seq, "response_id": f"cmpl-{seq}", "sent_mono_ns": sent_ns, "chunk_offsets_ms": offsets_ms,
        "ttft_ms": offsets_ms[0], "worst_gap_ms": max(gaps) if gaps else 0.0, "schedule_lag_ms": 0.1,
    }  # fmt: skip
    return record(**{**fields, **extra})


def test_join_matches_every_chunk_and_derives_the_errors() -> None:
    ms = 1_000_000
    sent = {0: 1_000 * ms, 1: 1_050 * ms}
    # server writes: ttft 20 ms then gaps of 10 ms, stream 1 with one 30 ms stall
    streams = {0: [sent[0] + 20 * ms + k * 10 * ms for k in range(3)]}
    streams[1] = [sent[1] + 20 * ms, sent[1] + 30 * ms, sent[1] + 60 * ms]
    dump = _dump(streams, {0: sent[0] + ms // 2, 1: sent[1] + ms // 2})
    # the client sees every chunk 0.25 ms late, and the last chunk of stream 1 another 1 ms late
    records = [
        _record(0, sent[0], [20.25, 30.25, 40.25]),
        _record(1, sent[1], [20.25, 30.25, 61.25]),
    ]
    j = join_records(records, dump)
    assert j.exact
    assert (j.requests, j.matched_requests, j.client_chunks, j.server_chunks, j.matched_chunks) == (2, 2, 6, 6, 6)
    assert sorted(round(e, 6) for e in j.chunk_error_ms) == [0.25] * 5 + [1.25]
    assert [round(e, 6) for e in j.ttft_error_ms] == [0.25, 0.25]
    assert [round(t, 6) for t in j.true_ttft_ms] == [20.0, 20.0]
    assert [round(g, 6) for g in j.true_worst_gap_ms] == [10.0, 30.0]
    assert [round(e, 6) for e in j.worst_gap_error_ms] == [0.0, 1.0]
    # each write call took 1 us: a gap up to 1 us longer than the writes' is still the server's
    assert [round(e, 6) for e in j.worst_gap_beyond_write_ms] == [0.0, 0.999]
    assert [round(u, 6) for u in j.upload_ms] == [0.5, 0.5]


def test_join_reports_missing_chunks_failures_and_strangers() -> None:
    ms = 1_000_000
    streams = {0: [20 * ms, 30 * ms, 40 * ms], 1: [25 * ms], 7: [99 * ms]}
    dump = _dump(streams, {0: 0, 1: 0, 7: 0})
    records = [
        _record(0, 0, [20.1, 30.1]),  # the client lost a chunk
        _record(1, 0, [25.1], error_class="stream_truncated", error="no [DONE]"),
    ]
    j = join_records(records, dump)
    assert not j.exact
    assert j.failed == 1
    assert j.client_chunks == 2 and j.server_chunks == 3
    assert j.unclaimed_server_requests == 2  # seq 1 belongs to the failed record, seq 7 to nobody
    assert any("client saw 2 chunks, server wrote 3" in p for p in j.problems)


def test_join_refuses_records_without_the_monotonic_send() -> None:
    dump = _dump({0: [10]}, {0: 0})
    j = join_records([_record(0, 0, [0.0], sent_mono_ns=None)], dump)
    assert not j.exact and j.problems


# ------------------------------------------------------------------------------------------ real run


def test_selfcheck_joins_a_real_locust_run_exactly(tmp_path: Path) -> None:
    cfg = SelfCheckConfig(rate=5.0, n=20, tokens=20, gap_ms=10.0, ttft_ms=20.0, keep_dir=str(tmp_path / "run"))
    result = run_selfcheck(cfg)
    join = result["join"]
    assert join["problems"] == []
    assert join["exact"], join
    assert join["requests"] == join["matched_requests"] == 20
    assert join["client_chunks"] == join["server_chunks"] == join["matched_chunks"] == 20 * 20
    assert result["chunk_error_ms"]["n"] == 400
    # no bound on the error itself: on a busy machine the server can be preempted between handing a chunk
    # to the kernel and logging it, and the client between receiving and reading it; benchmarks/ measure it
    assert result["ttft_error_ms"]["n"] == 20 and result["worst_gap_error_ms"]["n"] == 20
    # the true TTFT can only exceed the server's schedule, by connect, upload and its own lateness
    assert result["true_ttft_ms"]["min"] >= 20.0
    assert result["schedule_lag_ms"]["n"] == 20
    assert result["interarrival_ks"]["n"] == 19
    assert result["locust"]["exit_code"] == 0
    assert result["cpu"] is not None and result["cpu"]["load_cpu_s"] > 0
    assert 0.0 <= result["cpu"]["host_steal_share"] <= 1.0  # the hypervisor's share, apart from busy time
    table = render(result)
    assert "client-added error per chunk" in table and "verdict:" in table
    assert "stolen by the host" in table
    stolen = render({**result, "cpu": {**result["cpu"], "host_steal_share": 0.2}})
    calm = render({**result, "cpu": {**result["cpu"], "host_steal_share": 0.0}})
    assert "HOST STEAL: the hypervisor held back 20%" in stolen and "HOST STEAL" not in calm
    json.dumps(result)  # the --json document is plain JSON
    records = (tmp_path / "run" / "results").glob("records-*.jsonl")
    rows = [json.loads(line) for path in records for line in path.read_text().splitlines()]
    assert all(isinstance(r["sent_mono_ns"], int) for r in rows)


def test_selfcheck_bad_values_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--n", "1"]) == EXIT_USAGE
    assert main(["--rate", "0"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "--n" in err and "--rate" in err


def test_a_client_that_stalls_fails_the_self_check(tmp_path: Path) -> None:
    """Every stream in flight during the stop has a worst gap the client made (kernel receive stamps), so the
    verdict must breach its bounds and the command exit 1."""
    out, code = stall_locust_mid_stage(tmp_path / "run", ["--chunk-stamp", "kernel"])
    assert code == 1, out
    assert "verdict: FAIL" in out and "worst-gap error max" in out and "BREACHED" in out
