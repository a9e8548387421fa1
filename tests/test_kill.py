"""The load generator itself killed (SIGKILL) with requests in flight.

Nothing can write a record for a request whose process is gone, so the promise is narrower and
checked exactly: every record on disk is a complete JSON line (a cut last line is skipped and
counted), the sent journal says how many requests were in flight and lost, and the analysis
reports that number instead of quietly summarizing fewer requests.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from conftest import write_trace
from runkit import LocustProcess, count_lines, start_locust, wait_until

from tailgate.postprocess.report import build_report
from tailgate.postprocess.runfolders import load_records, load_summaries
from tailgate.records import (
    OPTIONAL_ON_DISK,
    RECORD_FIELDS,
    InFlightLoss,
    RecordError,
    RecordWriter,
    RequestRecord,
    SendJournal,
    lost_in_flight,
    read_records,
    read_sent,
)
from tailgate.verify.groundtruth import ServerProcess, start_server_process

# the busy pass (scripts/test.sh) runs these again: their verdicts depend on when things happen
pytestmark = pytest.mark.timing

TTFT_MS, GAP_MS, MAX_TOKENS = 50.0, 100.0, 25  # about 2.5 s per stream: plenty in flight at any moment
N = 12


@pytest.fixture(scope="module")
def slow_server() -> Iterator[ServerProcess]:
    with start_server_process(ttft_ms=TTFT_MS, gap_ms=GAP_MS) as server:
        yield server


def processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains ``text`` (the test's own results folder: only what it started)."""
    pids = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if text in " ".join(proc.info["cmdline"] or ()):
            pids.append(proc.pid)
    return pids


def complete_lines_parse(path: Path) -> tuple[int, bytes]:
    """Every newline-terminated line is one JSON record; returns their count and the unterminated rest."""
    data = path.read_bytes()
    cut = data.rfind(b"\n") + 1
    lines = data[:cut].splitlines()
    for line in lines:
        obj = json.loads(line)
        missing = set(RECORD_FIELDS) - OPTIONAL_ON_DISK - set(obj)
        assert not missing, sorted(missing)
    return len(lines), data[cut:]


@pytest.mark.parametrize("kill_stage", [0, 1], ids=["first-stage", "second-stage"])
def test_killed_generator_leaves_valid_records_and_a_count_of_what_was_lost(
    slow_server: ServerProcess, tmp_path: Path, kill_stage: int
) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", [(4, MAX_TOKENS)] * N)
    out = tmp_path / "results"
    locust: LocustProcess = start_locust(
        "continuous.py", slow_server.base_url, out, tmp_path, "--rates", "6,5", "--trace-file", str(trace),
        "--warmup", "0", "--settle", "0.5",
    )  # fmt: skip
    try:

        def in_flight() -> bool:
            sent, ended = count_lines(out, "sent-*.log"), count_lines(out, "records-*.jsonl")
            started = sent > N * kill_stage + 3 and (kill_stage == 0 or (out / "summary-cont_r6.json").exists())
            return started and ended > N * kill_stage and sent - ended >= 3

        wait_until(in_flight, 90, f"requests in flight in stage {kill_stage}", locust)
        os.kill(locust.pid, signal.SIGKILL)
        assert locust.wait(30) == -signal.SIGKILL
    finally:
        if locust.proc.poll() is None:
            locust.proc.kill()

    # records on disk: whole JSON lines, every one a full record
    files = sorted(out.glob("records-*.jsonl"))
    assert len(files) == 1
    lines, tail = complete_lines_parse(files[0])
    scan = read_records(out)
    assert len(scan.records) == lines and scan.partial_lines == (1 if tail.strip() else 0)

    # the journal says exactly how many were in flight, all in the stage that was running
    journal = read_sent(out)
    assert len(journal) == count_lines(out, "sent-*.log")
    loss = lost_in_flight(out)
    assert loss.sent == len(journal) and loss.recorded == len(scan.records)
    assert loss.lost == len(journal) - len(scan.records) >= 3
    assert loss.lost_by_stage == {kill_stage: loss.lost}
    assert json.loads((out / "run.json").read_text())["status"] == "running"  # never got to say more

    # the /metrics sampler the generator started does not outlive it
    deadline = time.monotonic() + 10
    while processes_mentioning(str(out)) and time.monotonic() < deadline:
        time.sleep(0.2)
    leftover = processes_mentioning(str(out))
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    assert not leftover, "a process of the killed run is still running"

    # the analysis summarizes the cut stage from its records and says how many requests it lost
    summaries = load_summaries(out).set_index("stage")
    assert sorted(summaries.index) == list(range(kill_stage + 1))
    cut = summaries.loc[kill_stage]
    assert cut["summary_source"] == "records" and cut["lost_in_flight"] == loss.lost
    assert cut["sent"] == len([r for r in scan.records if r.stage == kill_stage])
    if kill_stage:
        assert summaries.loc[0, "summary_source"] == "summary" and summaries.loc[0, "sent"] == N
    assert load_records(out).attrs["lost_in_flight_by_run"] == {".": loss.lost}
    notes = build_report(out).notes
    assert any(f"{loss.lost} request(s) sent but never recorded" in n for n in notes), notes
    assert any("status is 'running'" in n and "coordinator died" in n for n in notes), notes  # it was killed


# ----------------------------------------------------------------------------------- the files alone


def record(trace_id: int, stage: int = 0) -> RequestRecord:
    return RequestRecord(
        run_id="r", worker="w", trace_id=trace_id, stage=stage, stage_label="cont_r1", arm="continuous",
        rate_or_batch=1.0, batch=None, prompt_tokens_planned=4, max_tokens=4, ignore_eos=False,
        intended_s=1.0 + trace_id, sent_s=1.0 + trace_id, schedule_lag_ms=0.0, in_flight_at_send=0,
        end_s=2.0 + trace_id, ttft_ms=10.0, worst_gap_ms=5.0, total_ms=30.0, chunks=4,
    )  # fmt: skip


def test_read_records_skips_and_counts_a_partial_last_line(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text('{"status": "running"}')
    writer, journal = RecordWriter(tmp_path, "w-1"), SendJournal(tmp_path, "w-1")
    for i in range(5):
        journal.sent(0, i)
    for i in range(3):
        writer.write(record(i))
    writer.close()
    # request 3 died mid-write, request 4 before its record was started
    with open(writer.path, "a", encoding="utf-8") as f:
        f.write(record(3).to_json()[:57])
    journal.close()
    scan = read_records(tmp_path)
    assert [r.trace_id for r in scan.records] == [0, 1, 2] and scan.partial_lines == 1
    loss = lost_in_flight(tmp_path)
    assert loss == InFlightLoss(sent=5, recorded=3, lost=2, lost_by_stage={0: 2}, unreadable_lines=1)
    # pairs a caller already read give the same answer without parsing the records again
    given = lost_in_flight(tmp_path, recorded=[(0, 0), (0, 1), (0, 2)])
    assert given.lost == 2 and given.unreadable_lines is None
    # the analysis reader agrees
    frame = load_records(tmp_path)
    assert len(frame) == 3 and frame.attrs["unreadable_lines"] == 1
    assert frame.attrs["lost_in_flight_by_run"] == {".": 2}


def test_a_record_is_read_back_typed_and_a_line_that_is_not_one_is_counted(tmp_path: Path) -> None:
    """What a file holds comes back as a RequestRecord: optional fields filled, a newer schema's keys ignored; a
    JSON object without the fields every record carries is not a record, whatever else it holds."""
    full = record(0)
    newer = {**full.to_dict(), "trace_id": 1, "a_later_field": [1, 2]}
    without = {k: v for k, v in record(2).to_dict().items() if k != "intended_s"}
    lines = [full.to_json(), json.dumps(newer), json.dumps(without), json.dumps({"a": 1}), json.dumps([1, 2])]
    (tmp_path / "records-w-1.jsonl").write_text("".join(line + "\n" for line in lines))
    scan = read_records(tmp_path)
    assert [r.trace_id for r in scan.records] == [0, 1] and scan.partial_lines == 3
    assert scan.records[0] == full and scan.records[1].prompt_source == full.prompt_source
    with pytest.raises(RecordError, match="intended_s"):
        RequestRecord.from_dict(without)
    assert full.for_summary() is full  # nothing to drop: not copied
    listed = replace(full, chunk_offsets_ms=[1.0], chunk_read_delays_ms=[0.1])
    assert listed.for_summary().chunk_offsets_ms is None and listed.chunk_offsets_ms == [1.0]


def test_a_cut_journal_line_is_not_read_as_another_request(tmp_path: Path) -> None:
    (tmp_path / "sent-w-1.log").write_text("0 1\n0 12\n1 3")  # "1 3" could be the start of "1 30"
    assert read_sent(tmp_path) == {(0, 1), (0, 12)}
    (tmp_path / "sent-w-2.log").write_text("0 7\ngarbage\n\n0 x\n")
    assert read_sent(tmp_path) == {(0, 1), (0, 12), (0, 7)}
