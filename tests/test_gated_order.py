"""Gated batches reach the server in trace order, and the send path is in the records.

The ground-truth server logs when it had each request's whole body (``body_received_ns``) and
numbers requests in that order (``cmpl-<seq>``), so the order the server saw is read from the
server, not inferred from the client's stamps.
"""

from __future__ import annotations

import gevent

from pathlib import Path

import pytest
from conftest import load_records, run_locust, write_trace

from tailgate.load.batch import BatchGate
from tailgate.verify.groundtruth import start_server_process

#: Short and long prompts mixed: a 6000-word body (36 KB) does not fit one send on a fresh connection,
#: so a write that yields half-way must still not let a later request overtake it.
MIX = [(16, 4), (6000, 4), (200, 4), (1000, 4)]


def _seq(record: dict) -> int:
    return int(record["response_id"].removeprefix("cmpl-"))


def test_gated_batches_arrive_in_trace_order(tmp_path: Path) -> None:
    n, b = 48, 16
    trace = write_trace(tmp_path / "trace.jsonl", (MIX * n)[:n])
    out = tmp_path / "gated"
    with start_server_process(ttft_ms=5, gap_ms=2) as server:
        done = run_locust(
            "gated.py", server.base_url, out, "--batch-size", str(b), "--trace-file", str(trace), "--warmup", "0",
            "--sample-metrics", "0", "--settle", "0", timeout=240,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        received = {row[0]: row[1] for row in server.dump()["requests"]}
    records = load_records(out)
    assert sorted(r["trace_id"] for r in records) == list(range(n))
    assert all(r["error_class"] is None for r in records), [r["error"] for r in records if r["error_class"]]
    for k in range(n // b):
        batch = sorted((r for r in records if r["batch"] == k), key=lambda r: r["trace_id"])
        ids = [r["trace_id"] for r in batch]
        assert ids == list(range(k * b, (k + 1) * b))
        # the server's own arrival order (when it had the whole body) is trace order
        by_arrival = sorted(batch, key=lambda r: received[_seq(r)])
        assert [r["trace_id"] for r in by_arrival] == ids
        # and so is its numbering, and the client's write instants
        assert [_seq(r) for r in batch] == sorted(_seq(r) for r in batch)
        written = [r["request_written_s"] for r in batch]
        assert written == sorted(written)
        # every connection of the batch was up before the first request went out
        assert max(r["connected_s"] for r in batch) <= min(written)
        for r in batch:
            assert r["sent_s"] <= r["connected_s"] <= r["request_written_s"] <= r["headers_s"]
            assert r["reads"] >= 1 and r["max_events_per_read"] >= 1
            assert r["client_coalesced"] is False or r["late_coalesced_reads"] > 0


def test_continuous_records_carry_the_send_path(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", [(16, 3)] * 6)
    out = tmp_path / "cont"
    with start_server_process(ttft_ms=5, gap_ms=2) as server:
        done = run_locust(
            "continuous.py", server.base_url, out, "--rates", "20", "--trace-file", str(trace), "--warmup", "0",
            "--sample-metrics", "0", "--settle", "0",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for r in load_records(out):
        assert r["sent_s"] <= r["connected_s"] <= r["request_written_s"] <= r["first_chunk_s"]
        assert r["max_read_delay_ms"] is not None and r["max_read_delay_ms"] >= 0


class _Sock:
    """Stands in for a connected socket; records the order of writes."""

    def __init__(self, name: int, log: list[int], fail: bool = False) -> None:
        self.name, self.log, self.fail = name, log, fail

    def sendall(self, data: bytes) -> None:
        if self.fail:
            raise BrokenPipeError("peer went away")
        self.log.append(self.name)
        gevent.sleep(0)  # a write that yields must not let the next one overtake it


def test_gate_writes_in_slot_order_whatever_order_connections_finish() -> None:
    log: list[int] = []
    gate = BatchGate(5)
    outcome: dict[int, object] = {}

    def request(i: int, connect_s: float) -> None:
        try:
            gevent.sleep(connect_s)
            if i == 2:
                return  # failed to connect: it never writes
            outcome[i] = gate.writer(i)(_Sock(i, log, fail=i == 3), b"x")
        except OSError as e:
            outcome[i] = type(e).__name__
        finally:
            gate.leave(i)

    # the later a request starts, the sooner it connects: the reverse of trace order
    greenlets = [gevent.spawn(request, i, 0.01 * (5 - i)) for i in range(5)]
    gate.flush()
    gevent.joinall(greenlets, timeout=5, raise_error=True)
    assert log == [0, 1, 4]
    assert outcome[3] == "BrokenPipeError"
    assert all(isinstance(outcome[i], int) for i in (0, 1, 4))
    assert outcome[0] <= outcome[1] <= outcome[4]  # type: ignore[operator]
    assert 2 not in outcome


def test_gate_of_no_requests_does_not_wait() -> None:
    with gevent.Timeout(1):
        BatchGate(0).flush()


@pytest.mark.vllm
def test_gated_arrival_order_at_a_real_vllm(tmp_path: Path) -> None:
    """vLLM logs ``Received request cmpl-<X-Request-Id>-0`` as its API server takes each request in.

    The request ids the client sends name the trace item, so the log's order is the server's
    arrival order. Identical short prompts keep tokenization from reordering what arrived in order.
    """
    from tailgate.servers import LocalVllmServer, ensure_tiny_model, ensure_vllm_venv

    python = ensure_vllm_venv()
    model = ensure_tiny_model(python=python)
    log_path = tmp_path / "vllm.log"
    server = LocalVllmServer(python, model, extra_args=["--enforce-eager", "--enable-log-requests"], log_path=log_path)
    n, b = 24, 8
    trace = write_trace(tmp_path / "trace.jsonl", [(32, 4)] * n)
    out = tmp_path / "gated"
    with server:
        done = run_locust(
            "gated.py", server.base_url, out, "--batch-size", str(b), "--trace-file", str(trace), "--warmup", "0",
            "--ignore-eos", "--settle", "0", timeout=400,
        )  # fmt: skip
        text = server.log_text()
    assert done.returncode == 0, done.stderr[-3000:]
    records = load_records(out)
    run_id = records[0]["run_id"]
    order = []
    for line in text.splitlines():
        marker = f"Received request cmpl-tg-{run_id}-0-"
        if marker in line:
            order.append(int(line.split(marker, 1)[1].split("-", 1)[0]))
    assert sorted(order) == list(range(n)), text[-3000:]
    assert order == list(range(n))
    for k in range(n // b):
        batch = sorted((r for r in records if r["batch"] == k), key=lambda r: r["trace_id"])
        written = [r["request_written_s"] for r in batch]
        assert written == sorted(written)
        for r in batch:
            assert r["response_id"].startswith(f"cmpl-tg-{run_id}-0-{r['trace_id']}"), r["response_id"]
