"""Every record says how much of its timing the client could have hidden.

A client that reads late gets several events in one read and stamps them all at once: their gaps
then describe the client. The record carries the evidence (events per read, the kernel's receive
stamp against the read), the stage summary counts such streams, and the report marks the cell.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pandas as pd
import pytest
from recordkit import records_of

from tailgate.load.client import StreamTiming, Target, build_payload, stream_completion
from tailgate.postprocess.table import NOT_A_MEASUREMENT, summary_table, table_markdown
from tailgate.stats import client_quality
from tailgate.verify.groundtruth import DEFAULT_MODEL, ServerProcess, start_server_process

# the busy pass (scripts/test.sh) runs these again: their verdicts depend on when things happen
pytestmark = pytest.mark.timing


@pytest.fixture(scope="module")
def gt() -> Iterator[ServerProcess]:
    with start_server_process(ttft_ms=5, gap_ms=5) as server:
        yield server


def _late_writer(delay_s: float):  # type: ignore[no-untyped-def]
    """A ``write`` that sends, then keeps the client away from its socket: every chunk piles up unread."""

    def write(sock, data: bytes) -> int:  # type: ignore[no-untyped-def]
        sock.sendall(data)
        written = time.perf_counter_ns()
        time.sleep(delay_s)
        return written

    return write


def test_a_late_client_flags_its_stream(gt: ServerProcess) -> None:
    target = Target.parse(gt.base_url)
    t = stream_completion(target, build_payload(DEFAULT_MODEL, "a b", 10), StreamTiming(), write=_late_writer(0.3))
    assert t.error_class is None and t.chunks == 10
    assert t.max_events_per_read >= 2
    assert t.max_read_delay_ns is not None and t.max_read_delay_ns > 100_000_000
    assert t.late_coalesced_reads >= 1
    # the events of one read share one stamp: the merged gaps read zero, which is what the flag warns about
    assert t.worst_gap_ns < 5_000_000


def test_server_side_coalescing_is_counted_but_not_blamed_on_a_prompt_client(gt: ServerProcess) -> None:
    gt.control({"faults": [{"match": {"all": True}, "kind": "multi_event_writes", "events_per_write": 3}]})
    try:
        target = Target.parse(gt.base_url)
        t = stream_completion(target, build_payload(DEFAULT_MODEL, "a b", 9), StreamTiming())
    finally:
        gt.control({"faults": []})
    assert t.error_class is None and t.chunks == 9
    assert t.max_events_per_read >= 3
    assert t.max_read_delay_ns is not None  # measured; small unless this machine stalled the reader


def test_kernel_stamp_predates_the_late_read(gt: ServerProcess) -> None:
    target = Target.parse(gt.base_url)
    body = build_payload(DEFAULT_MODEL, "a b", 4)
    recv = stream_completion(target, body, StreamTiming(), write=_late_writer(0.2), stamp="recv")
    kernel = stream_completion(target, body, StreamTiming(), write=_late_writer(0.2), stamp="kernel")
    assert recv.error_class is None and kernel.error_class is None
    # the server finished within ~25 ms of the request; a read 200 ms later stamps 200 ms, the kernel ~25 ms
    assert (recv.last_chunk_ns - recv.written_ns) > 150_000_000  # type: ignore[operator]
    assert (kernel.last_chunk_ns - kernel.written_ns) < 150_000_000  # type: ignore[operator]


def test_stage_summary_counts_flagged_streams() -> None:
    records = [
        {"client_coalesced": True, "max_read_delay_ms": 12.0, "max_events_per_read": 4},
        {"client_coalesced": False, "max_read_delay_ms": 0.1, "max_events_per_read": 1},
        {"max_events_per_read": 1},  # a record from before these fields existed
    ]
    q = client_quality(records_of(records))
    assert q["client_coalesced_streams"] == 1
    assert q["read_delay_measured"] == 2 and q["max_read_delay_max"] == 12.0
    assert q["max_events_per_read_max"] == 4


def test_table_marks_a_cell_with_coalesced_streams() -> None:
    base = {"config": "chunked", "arm": "continuous", "n": 10, "run_dir": ".", "stage": 0}
    summaries = pd.DataFrame(
        [
            {**base, "cell": "chunked_cont_r5", "rate_or_batch": 5.0, "client_coalesced_streams": 0},
            {**base, "cell": "chunked_cont_r10", "rate_or_batch": 10.0, "client_coalesced_streams": 3, "stage": 1},
        ]
    )
    md = table_markdown(summary_table(summaries))
    lines = [line for line in md.splitlines() if line.startswith("| chunked_cont")]
    assert lines[0].startswith("| chunked_cont_r5 |")
    assert lines[1].startswith(f"| chunked_cont_r10{NOT_A_MEASUREMENT} |") and "| 3 |" in lines[1]
    assert "coalesced by client" in md
    stolen = summaries.assign(host_steal_share=[0.0, 0.22])  # the hypervisor paused the machine in that cell
    row = next(x for x in table_markdown(summary_table(stolen)).splitlines() if x.startswith("| chunked_cont_r10"))
    assert row.startswith("| chunked_cont_r10 (not a measurement: the host stole 22% of the CPU) |")
