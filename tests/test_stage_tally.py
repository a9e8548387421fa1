"""Stage summaries come from what the load processes report, and say what the record files say.

The coordinator never reads the record files back during a run: each stage's summary is built from the
records reported for it (a one-process order's DONE, a distributed run's record stream). A real run with one
and with two load processes checks that every figure derived from the records equals the one the same rules
give from the files.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from conftest import ROOT, write_trace
from recordkit import record
from runkit import assert_no_traceback, check_nothing_lost, start_locust, summaries

from tailgate.load.distributed import master_port_args
from tailgate.load.plan import Stage
from tailgate.load.runfiles import stage_accounting
from tailgate.load.stage_workload import workload_summary
from tailgate.load.tally import StageTally
from tailgate.records import WORKER_LOST, RequestRecord, _one_per_request, read_records
from tailgate.stats import summarize_stage

SESSION = ROOT / "tailgate" / "load" / "session.py"


def _row(stage: int, trace_id: int, error_class: str | None = None, **more: Any) -> RequestRecord:
    return record(run_id="r", stage=stage, trace_id=trace_id, error_class=error_class, **more)


def test_the_tally_keeps_one_record_per_request_as_the_files_reader_does() -> None:
    rows = [
        _row(0, 1, WORKER_LOST), _row(0, 1, None, total_ms=5.0),  # the worker's own record after the master's
        _row(0, 2, None, total_ms=7.0), _row(0, 2, WORKER_LOST),  # a late worker_lost never replaces a record
        _row(0, 3, None, total_ms=1.0), _row(0, 3, None, total_ms=2.0),  # a second copy: the first stays
        _row(1, 1, "timeout"),
    ]  # fmt: skip
    from_files, _ = _one_per_request(rows)
    tally = StageTally()
    tally.add_many(rows)
    kept = tally.records(0) + tally.records(1)
    assert sorted(kept, key=lambda r: (r.stage, r.trace_id)) == sorted(from_files, key=lambda r: (r.stage, r.trace_id))
    assert tally.keys() == {(0, 1), (0, 2), (0, 3), (1, 1)}
    assert tally.records(2) == []


def test_the_tally_leaves_out_the_per_chunk_lists() -> None:
    tally = StageTally()
    lists = ("chunk_offsets_ms", "chunk_read_delays_ms", "chunk_read_offsets_ms")
    tally.add(_row(0, 0, None, chunks=3, **{name: [1.0, 2.0, 3.0] for name in lists}))
    (row,) = tally.records(0)
    assert row.chunks == 3 and all(getattr(row, name) is None for name in lists)


def test_the_coordinator_never_reads_the_record_files() -> None:
    """Neither directly nor through :func:`lost_in_flight`, which reads them unless given what was recorded."""
    tree = ast.parse(SESSION.read_text(encoding="utf-8"))
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert not names & {"read_records", "iter_record_lines", "record_files", "load_records"}
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "lost_in_flight"]
    assert calls and all(any(k.arg == "recorded" for k in c.keywords) for c in calls)


RECORD_FIGURES = (
    "n", "sent", "errors", "errors_by_class", "achieved_rate", "completion_tokens", "client_coalesced_streams",
    "read_delay_measured", "max_read_delay_p99", "max_read_delay_max", "max_events_per_read_max",
    "ttft_p50", "ttft_p99", "gap_p50", "gap_p99", "total_p50", "total_p99", "ttft_from_intended_p50",
    "ttft_from_intended_p99", "total_from_intended_p99", "schedule_lag_p50", "schedule_lag_p99",
    "schedule_lag_max", "chunks_p50",
)  # fmt: skip


def from_files(results: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """Every summary figure derived from the records, recomputed from the files by the summary's own rules."""
    records = [r for r in read_records(results).records if r.stage == summary["stage"]]
    figures = summarize_stage(
        records, arm=summary["arm"], rate_or_batch=summary["rate_or_batch"], started=summary["started"],
        warmup=summary["warmup"], warmup_rule=summary["warmup_rule"],
    )  # fmt: skip
    out = {k: figures[k] for k in RECORD_FIGURES}
    stage = cast(Stage, SimpleNamespace(index=summary["stage"], size=summary["planned"], arm=summary["arm"]))
    accounting = stage_accounting(results, stage, records)
    out.update({k: getattr(accounting, k) for k in ("planned", "sent", "recorded", "lost_in_flight", "never_sent")})
    out["ran_short"] = accounting.ran_short
    workload = SimpleNamespace(prompts=summary["prompts"], endpoint=summary["endpoint"], arrivals="poisson")
    checked = workload_summary(cast(Any, workload), stage, records, None, None)
    out.update({k: v for k, v in vars(checked).items() if k.startswith("prompt_tokens_")})
    start, end = min(r.sent_s for r in records), max(r.end_s or r.sent_s for r in records)
    chunks = sum(r.chunks for r in records)
    out.update({
        "window_start_s": start, "window_end_s": end, "chunks_per_s": round(chunks / (end - start), 1),
        "negative_latencies": sum(1 for r in records for v in (r.ttft_ms, r.total_ms, r.worst_gap_ms)
                                  if (v or 0) < 0),
    })  # fmt: skip
    return out


@pytest.mark.parametrize("processes", [1, 2])
def test_stage_summaries_from_reports_equal_the_files(tmp_path: Path, processes: int) -> None:
    from tailgate.verify.groundtruth import start_server_process

    n = 16
    trace = write_trace(tmp_path / "trace.jsonl", [(8, 12)] * n)
    results = tmp_path / "results"
    extra = ["--processes", "2", *master_port_args()] if processes > 1 else []
    with start_server_process(ttft_ms=20, gap_ms=10) as server:
        locust = start_locust(
            "continuous.py", server.base_url, results, tmp_path / "logs", *extra, "--rates", "8,16",
            "--trace-file", str(trace), "--n", str(n), "--warmup", "2", "--no-metrics", "--settle", "0",
            "--record-chunks",
        )  # fmt: skip
        assert locust.wait(240) == 0, locust.stderr[-3000:]
    assert_no_traceback(locust.stdout, locust.stderr)
    records, _ = check_nothing_lost(results, 2 * n)
    assert all(r.chunk_offsets_ms for r in records if r.error_class is None)  # the files keep them
    by_label = summaries(results)
    assert sorted(by_label) == ["cont_r16", "cont_r8"]
    for label, summary in by_label.items():
        assert summary["load_processes"] == processes, label
        expected = from_files(results, summary)
        got = {k: summary[k] for k in expected}
        assert got == expected, label


def test_the_report_counts_a_stage_as_its_summary_did(tmp_path: Path) -> None:
    """One accounting: a stage with a lost load process's records, a request sent but never recorded and part
    of its plan never sent is counted the same by the load path (the summary) and by the report."""
    import pandas as pd

    from tailgate.postprocess.accounting import COLUMNS, account
    from tailgate.postprocess.runfolders import RunDir
    from tailgate.records import SendJournal, account_stage

    journal = SendJournal(tmp_path, "w1")
    for trace in range(6):  # planned 8: 6 sent, 2 never sent
        journal.sent(0, trace)
    journal.close()
    records = [_row(0, 0), _row(0, 1, "timeout"), _row(0, 2, WORKER_LOST), _row(0, 3, WORKER_LOST), _row(0, 4)]
    stage = cast(Stage, SimpleNamespace(index=0, size=8))
    summary = stage_accounting(tmp_path, stage, records)  # trace 5: sent, no record
    assert (summary.planned, summary.sent, summary.recorded, summary.lost_in_flight, summary.never_sent) == (
        8, 6, 3, 3, 2,
    )  # fmt: skip
    assert summary.ran_short
    frame = pd.DataFrame([{"run_dir": ".", "stage": r.stage, "trace_id": r.trace_id, "error_class": r.error_class}
                          for r in records])  # fmt: skip
    summaries = pd.DataFrame([{"run_dir": ".", "stage": 0, "planned": 8, "arm": "continuous"}])
    reported = account(summaries, frame, [RunDir(tmp_path, ".", {})]).iloc[0]
    assert [reported[c] for c in COLUMNS] == [8, 6, 3, 3, 2]
    # without a journal: the records count as sent, and what was lost cannot be told from never sent
    blind = account_stage(8, None, [0, 1, 4])
    assert (blind.sent, blind.lost_in_flight, blind.never_sent) == (3, None, 5)
