"""The reference server over several workers on one port, and the self-check's verdict on a late side.

Real processes on free ports, small loads (the machine has two cores and shares them): what is asserted is
behaviour (ids unique across workers, one merged log the join reads exactly, a reference that falls behind
refused and named), never how fast this machine is. The lateness bound of the normal run is made generous for
the same reason: a busy 2-core host may be late by milliseconds in its tail; a reference made to fall behind
is late by about a second.
"""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import pytest
from recordkit import record

from tailgate.clientbound import MERGED, judge
from tailgate.verify.groundtruth import DEFAULT_MODEL, start_server_process
from tailgate.verify.groundtruth.workers import merge_parts
from tailgate.verify.join import join_records
from tailgate.verify.lateness import late_sides, schedule_findings, verdict_of
from tailgate.verify.selfcheck import EXIT_WARN, SelfCheckConfig, main, run_selfcheck
from tailgate.verify.selfcheckrun import accounting_problem

# the busy pass (scripts/test.sh) runs these again: their verdicts depend on when things happen
pytestmark = pytest.mark.timing


def _stream(port: int, tokens: int) -> str:
    """One streamed completion on a fresh connection; its response id."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        body = {"model": DEFAULT_MODEL, "prompt": "a b c", "max_tokens": tokens, "stream": True}
        conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"content-type": "application/json"})
        resp = conn.getresponse()
        text = resp.read().decode()
        assert resp.status == 200, text
        return text.split('"id":"', 1)[1].split('"', 1)[0]
    finally:
        conn.close()


def test_workers_on_one_port_number_requests_apart_and_leave_one_merged_log(tmp_path: Path) -> None:
    log = tmp_path / "chunklog.json"
    with start_server_process(workers=3, chunk_log=log, ttft_ms=2, gap_ms=2) as server:
        assert server.port != 5557 and len(server.pids()) == 4  # the parent and its three workers
        ids = [_stream(server.port, 4) for _ in range(30)]
        # one worker's settings or log alone would mislead: refused, with the reason
        status, _, body = server.request("POST", "/_control", {"ttft_ms": 5})
        assert status == 409 and b"3 workers" in body
        assert server.request("GET", "/_chunklog")[0] == 409
        dump = server.dump()  # stops the server: the logs are merged then
    seqs = [int(rid.removeprefix("cmpl-")) for rid in ids]
    assert len(set(seqs)) == 30
    assert len({seq % 3 for seq in seqs}) >= 2  # the kernel spread the connections over the workers
    assert dump["workers"] == 3 and dump["workers_lost"] == [] and len(dump["worker_pids"]) == 3
    assert sum(dump["worker_chunks"]) == len(dump["chunks"]) == 30 * 4
    assert len(dump["chunk_targets"]) == len(dump["chunk_write_begin"]) == len(dump["chunks"])
    by_seq: dict[int, list[int]] = {}
    for seq, idx, _ in dump["chunks"]:
        by_seq.setdefault(seq, []).append(idx)
    assert {s: sorted(v) for s, v in by_seq.items()} == {s: [0, 1, 2, 3] for s in seqs}
    assert sorted(row[0] for row in dump["requests"]) == sorted(seqs)
    assert [p.name for p in tmp_path.iterdir()] == ["chunklog.json"]  # the workers' parts were merged away


def test_merged_columns_join_exactly() -> None:
    """Two workers' columns, merged, are one log the join matches chunk for chunk."""
    ms = 1_000_000

    def part(seq: int, start: int) -> dict:
        times = [start + k * 10 * ms for k in range(3)]
        return {"pid": 100 + seq, "seq": [seq] * 3, "idx": [0, 1, 2], "t_ns": times,
                "begin_ns": [t - 1000 for t in times], "target_ns": times,
                "requests": [[seq, start - 20 * ms, start]], "backpressured": 0}  # fmt: skip

    dump = merge_parts([part(0, 100 * ms), part(1, 130 * ms)], 2, [])
    records = [
        record(trace_id=seq, response_id=f"cmpl-{seq}", sent_mono_ns=start - 21 * ms,
               chunk_offsets_ms=[21.1, 31.1, 41.1], ttft_ms=21.1, worst_gap_ms=10.0, schedule_lag_ms=0.1)
        for seq, start in ((0, 100 * ms), (1, 130 * ms))
    ]  # fmt: skip
    j = join_records(records, dump)
    assert j.exact and j.matched_chunks == 6 and j.write_lateness_ms == [0.0] * 6


def test_a_lost_worker_makes_the_join_inexact() -> None:
    dump = merge_parts([], 2, [{"worker": 1, "pid": 9, "exit": -9}])
    j = join_records([], dump)
    assert not j.exact and any("worker 1 ended" in p for p in j.problems)


def test_the_verdict_names_the_side_that_fell_behind() -> None:
    clean = judge({MERGED: 0})
    on_time = schedule_findings(0.3, 0.2, 2.5, 10.0)
    text, ok = verdict_of(True, clean, on_time)
    assert ok and text == "OK: all 3 bounds held" and late_sides(on_time) == {"server": False, "client": False}
    server = schedule_findings(7200.0, 0.2, 2.5, 10.0)
    text, ok = verdict_of(True, clean, server, {"server_write_lateness_p99_ms": 7000.0})
    assert not ok and "the reference server fell behind: write lateness p99 7200.000 ms > bound 2.500 ms" in text
    assert "measured against a queue" in text and late_sides(server) == {"server": True, "client": False}
    tail = verdict_of(True, clean, server, {"server_write_lateness_p99_ms": 0.1})[0]
    assert "the reference server was late in its tail" in tail
    client = schedule_findings(0.3, 40.0, 2.5, 10.0)
    text, ok = verdict_of(True, clean, client, {"schedule_lag_p99_ms": 30.0})
    assert not ok and "the client fell behind its schedule: schedule lag p99 40.000 ms" in text
    assert late_sides(client) == {"server": False, "client": True}


def test_a_run_whose_accounting_disagrees_with_its_records_is_not_ok() -> None:
    exact = {"planned": 20, "sent": 20, "recorded": 20, "lost_in_flight": 0, "never_sent": 0, "errors": 0}
    assert accounting_problem(20, 20, exact) is None
    late_tally = {**exact, "recorded": 19, "lost_in_flight": 1}  # a record the stage's summary never counted
    problem = accounting_problem(20, 20, late_tally)
    assert problem is not None and "19 recorded, 1 lost in flight" in problem
    text, ok = verdict_of(True, judge({MERGED: 0}), (), {}, problem)
    assert not ok and text.startswith("FAIL: the run's accounting is not exact: 20 planned, 20 records read back")
    assert accounting_problem(20, 18, exact) is not None


def test_a_selfcheck_over_two_workers_joins_exactly_and_finds_no_late_reference(tmp_path: Path) -> None:
    cfg = SelfCheckConfig(rate=10.0, n=24, tokens=10, gap_ms=10.0, ttft_ms=20.0, truth_workers=2,
                          server_late_p99_ms=200.0, lag_p99_ms=500.0, keep_dir=str(tmp_path / "run"),
                          host_watch=False)  # fmt: skip
    result = run_selfcheck(cfg)
    join = result["join"]
    assert join["exact"], join
    assert join["requests"] == join["matched_requests"] == 24 and join["server_chunks"] == 240
    truth = result["truth_server"]
    assert truth["workers"] == 2 and not truth["auto"] and truth["workers_lost"] == []
    assert sum(truth["worker_chunks"]) == 240
    rows = [json.loads(line) for p in (tmp_path / "run" / "results").glob("records-*.jsonl")
            for line in p.read_text().splitlines()]  # fmt: skip
    assert len({r["response_id"] for r in rows}) == 24
    assert result["accounting"]["planned"] == result["accounting"]["recorded"] == 24
    assert result["late"]["server"] is False and "reference server" not in result["verdict"]
    assert result["server_write_lateness_ms"]["n"] == 240


def test_a_reference_that_falls_behind_is_refused_and_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each write holds the reference's loop 5 ms: 400 chunks/s ask for 2 s of it per second, so its writes fall
    further behind with every chunk. The client's figures stay exact against the actual writes; the verdict must
    still refuse, say the reference fell behind, and the command exit 1."""
    out = tmp_path / "result.json"
    code = main(["--rate", "20", "--n", "30", "--tokens", "20", "--truth-workers", "1", "--server-write-delay-us",
                 "5000", "--max-server-late-p99-ms", "200", "--max-lag-p99-ms", "500", "--no-host-watch",
                 "--json", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == EXIT_WARN == 1, printed
    assert "the reference server fell behind" in printed and "measured against a queue" in printed
    result = json.loads(out.read_text())
    assert result["join"]["exact"] and result["late"] == {"server": True, "client": False}
    assert result["server_write_lateness_ms"]["p50"] > 200.0
