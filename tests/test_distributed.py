"""Distributed load generation across real (namespaced) hosts: one writer, synced clocks, no hangs.

A Locust master and its workers each run in their own network namespace (:mod:`netns`), joined by
veth pairs on a bridge, with the ground-truth server beside the master logging when each request
body arrived (monotonic clock). One worker's wall clock is shifted by seconds with libfaketime.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, write_trace
from netns import Hosts, NetnsUnavailable

from tailgate.load.distributed import (
    DEADLINE_MARGIN_S,
    WORKER_LOST,
    ClockSync,
    MasterSink,
    auto_processes,
    free_port,
    master_port_args,
    to_master_clock,
)
from tailgate.load.plan import poisson_offsets
from tailgate.records import read_records, read_sent

FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SHIFT_S = 7
SCHEDULE_BOUND_MS = 50.0
"""Largest |arrival - schedule| at the server tolerated on this (shared, 2-core) machine; one process
is held to the same bound."""
JOIN_WHEN_TOLD = """
import sys, time
from pathlib import Path
import locust.main, tailgate.load.hooks, tailgate.shapes.base  # paid before the stage: see the test
flag, deadline = Path(sys.argv[1]), time.monotonic() + 120
while not flag.exists() and time.monotonic() < deadline:
    time.sleep(0.02)
sys.argv = ["locust", *sys.argv[2:]]
locust.main.main()
"""
"""A worker that connects when a file appears. Its imports (about a CPU-second) happen before: on this
2-core machine they would otherwise steal the running workers' CPU, which separate hosts would not."""
REQUEST_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 2.0


# -- pure parts ----------------------------------------------------------------------------------------
def test_auto_processes_from_cores_and_chunk_rate() -> None:
    assert auto_processes(100, cores=8) == 1
    assert auto_processes(12_000, cores=8) == 3
    assert auto_processes(1e9, cores=4) == 4


def test_free_port_args_move_master_and_children_together() -> None:
    args = master_port_args()
    assert args[0::2] == ["--master-bind-port", "--master-port"] and args[1] == args[3] != "5557"
    assert free_port() != 5557


def test_records_return_on_the_masters_clock() -> None:
    row = {"intended_s": 1.7e9 + 7.5, "sent_s": 1.7e9 + 7.6, "schedule_lag_ms": 3.0, "end_s": None}
    out = to_master_clock(dict(row), 7.0)
    assert out["intended_s"] == pytest.approx(1.7e9 + 0.5) and out["sent_s"] == pytest.approx(1.7e9 + 0.6)
    assert out["schedule_lag_ms"] == 3.0 and out["end_s"] is None


def test_lost_worker_share_is_exactly_accounted(tmp_path: Path) -> None:
    sink = MasterSink(tmp_path, ClockSync(runner=None))
    folder = str(tmp_path)
    order = {
        "run_id": "r", "stage": 0, "stage_label": "cont_r1", "arm": "continuous", "rate_or_batch": 1.0,
        "t0_master": 1.7e9, "config": {"ignore_eos": True}, "items": [[i, 8, 20, float(i), None] for i in range(5)],
    }  # fmt: skip
    for i in range(3):
        sink.on_sent("n1", {"folder": folder, "worker": "w1", "sent": [0, i, 1.7e9 + i]})
    row = {"stage": 0, "trace_id": 0, "intended_s": 1.7e9, "error_class": None}
    sink.on_records("n1", {"folder": folder, "worker": "w1", "records": [row]})
    assert sink.lose("n1", order, "gone") == (2, 2)
    sink.on_records("n1", {"folder": folder, "worker": "w1", "records": [{**row, "trace_id": 1}]})  # too late
    sink.close()
    records = read_records(tmp_path).records
    assert sorted((r["trace_id"], r["error_class"]) for r in records) == [(0, None), (1, WORKER_LOST), (2, WORKER_LOST)]
    assert read_sent(tmp_path) == {(0, 0), (0, 1), (0, 2)}


# -- namespaced hosts -------------------------------------------------------------------------------------
needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("ip") is None,
    reason="network namespaces need root and iproute2's ip command",
)


@pytest.fixture
def hosts() -> Any:
    h = Hosts(workers=2)
    try:
        h.create()
    except NetnsUnavailable as e:
        pytest.skip(f"the kernel refused network namespaces: {e}")
    try:
        yield h
    finally:
        h.remove()


class Cluster:
    """The server, master and workers of one test, every child ended at the end."""

    def __init__(self, hosts: Hosts, tmp: Path) -> None:
        self.hosts = hosts
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self.results = tmp / "results"
        self.chunk_log = tmp / "chunklog.json"
        self.master_port = free_port()
        self.server: subprocess.Popen[bytes] | None = None
        self.server_port = 0

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with open(self.tmp / f"{name}.out", "wb") as out:
            proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc

    def output(self, name: str) -> str:
        return (self.tmp / f"{name}.out").read_text(errors="replace")

    def start_server(self, ttft_ms: float, gap_ms: float) -> None:
        port_file = self.tmp / "port"
        argv = [sys.executable, "-m", "tailgate.verify.groundtruth", "--host", self.hosts.master_ip, "--port", "0",
                "--port-file", str(port_file), "--chunk-log", str(self.chunk_log), "--ttft-ms", str(ttft_ms),
                "--gap-ms", str(gap_ms), "--accept-any-model"]  # fmt: skip
        self.server = self.spawn("server", self.hosts.command(self.hosts.master, argv))
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            assert self.server.poll() is None, self.output("server")
            assert time.monotonic() < deadline, "the ground-truth server did not start"
            time.sleep(0.05)
        self.server_port = int(port_file.read_text())

    def server_log(self) -> dict[str, Any]:
        assert self.server is not None
        self.server.send_signal(signal.SIGTERM)
        self.server.wait(20)
        return json.loads(self.chunk_log.read_text())

    def server_control(self) -> dict[str, Any]:
        url = f"http://{self.hosts.master_ip}:{self.server_port}/_control"
        code = f"import urllib.request;print(urllib.request.urlopen({url!r},timeout=10).read().decode())"
        out = subprocess.run(self.hosts.command(self.hosts.master, [sys.executable, "-c", code]),
                             capture_output=True, text=True, timeout=30)  # fmt: skip
        return json.loads(out.stdout)

    def start_master(self, workers: int, *args: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles" / "continuous.py"), "--master",
                "--headless", "--only-summary", "--expect-workers", str(workers),
                "--master-bind-host", self.hosts.master_ip, "--master-bind-port", str(self.master_port),
                "--host", f"http://{self.hosts.master_ip}:{self.server_port}", "--results-dir", str(self.results),
                "--no-metrics", "--warmup", "0", "--settle", "0.5", "--request-timeout", str(REQUEST_TIMEOUT_S),
                "--connect-timeout", str(CONNECT_TIMEOUT_S), *args]  # fmt: skip
        return self.spawn("master", self.hosts.command(self.hosts.master, argv))

    def start_worker(
        self, name: str, ns: str, env: dict[str, str] | None = None, when: Path | None = None
    ) -> subprocess.Popen[bytes]:
        args = ["-f", str(ROOT / "locustfiles" / "continuous.py"), "--worker",
                "--master-host", self.hosts.master_ip, "--master-port", str(self.master_port)]  # fmt: skip
        head = [sys.executable, "-m", "locust"] if when is None else [sys.executable, "-c", JOIN_WHEN_TOLD, str(when)]
        return self.spawn(name, self.hosts.command(ns, [*head, *args], env))

    def sent_lines(self) -> int:
        return sum(p.read_bytes().count(b"\n") for p in self.results.glob("sent-*.log"))

    def wait_until(self, condition: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            master = self.procs[1] if len(self.procs) > 1 else None
            if master is not None and master.poll() is not None:
                raise AssertionError(f"master exited before {what}:\n{self.output('master')[-3000:]}")
            assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{self.output('master')[-3000:]}"
            time.sleep(0.05)

    def end(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def cluster(hosts: Hosts, tmp_path: Path) -> Any:
    c = Cluster(hosts, tmp_path)
    try:
        yield c
    finally:
        c.end()


def summaries(results: Path) -> dict[str, dict[str, Any]]:
    return {p.stem.removeprefix("summary-"): json.loads(p.read_text()) for p in results.glob("summary-*.json")}


def arrival_errors_ms(received_ns: list[int], planned_s: list[float]) -> list[float]:
    """Each arrival at the server minus its place on the schedule, after removing the one common shift."""
    got = sorted(received_ns)
    plan = sorted(planned_s)
    diffs = sorted((g - got[0]) / 1e6 - (p - plan[0]) * 1000 for g, p in zip(got, plan, strict=True))
    shift = diffs[len(diffs) // 2]
    return [abs(d - shift) for d in diffs]


@needs_root
@pytest.mark.skipif(not FAKETIME_LIB.exists(), reason="libfaketime is not installed (scripts/setup.sh installs it)")
def test_shifted_clock_on_schedule_and_joiner_waits(cluster: Cluster, tmp_path: Path) -> None:
    """Worker 1's wall clock is 7 s ahead: the arrivals still land on the one schedule. A third worker
    joining mid-stage cancels nothing and takes a share only from the next stage."""
    n, rate = 30, 10.0
    trace = write_trace(tmp_path / "trace.jsonl", [(8, 10)] * n)
    cluster.start_server(ttft_ms=20, gap_ms=20)
    master = cluster.start_master(2, "--rates", "10,8", "--trace-file", str(trace), "--n", str(n),
                                  "--api-key", "sekrit-at-connect")  # fmt: skip
    cluster.start_worker("w0", cluster.hosts.worker(0))
    shifted = {"LD_PRELOAD": str(FAKETIME_LIB), "FAKETIME": f"+{SHIFT_S}s", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    cluster.start_worker("w1", cluster.hosts.worker(1), shifted)
    join = tmp_path / "join-now"
    cluster.start_worker("joiner", cluster.hosts.worker(1), when=join)
    cluster.wait_until(lambda: cluster.sent_lines() >= 8, 120, "the first stage to be under way")
    join.touch()
    assert master.wait(180) == 0, cluster.output("master")[-4000:]

    run = json.loads((cluster.results / "run.json").read_text())
    assert run["status"] == "completed", run
    offsets = sorted(w["clock_offset_ms"] for w in run["workers"].values())
    assert len(offsets) == 3
    assert abs(offsets[-1] - SHIFT_S * 1000) < 200, offsets  # the shifted worker, measured
    assert all(abs(o) < 200 for o in offsets[:-1]), offsets
    assert all(w["clock_rtt_ms"] >= 0 and w["lost"] is None for w in run["workers"].values())
    joined = sorted(w["joined_stage"] for w in run["workers"].values())
    assert joined == ["cont_r10", "cont_r10", "cont_r8"], joined

    records = read_records(cluster.results).records
    by_stage = {label: [r for r in records if r["stage_label"] == label] for label in ("cont_r10", "cont_r8")}
    for label, rows in by_stage.items():
        assert sorted(r["trace_id"] for r in rows) == list(range(n)), label
        assert all(r["error_class"] is None for r in rows), [r for r in rows if r["error_class"]]
        s = summaries(cluster.results)[label]
        assert (s["planned"], s["sent"], s["recorded"], s["lost_in_flight"], s["never_sent"]) == (n, n, n, 0, 0)
    assert len({r["worker"] for r in by_stage["cont_r10"]}) == 2  # the joiner waited for the next stage
    assert len({r["worker"] for r in by_stage["cont_r8"]}) == 3

    # records on the master's clock: intended times are the schedule exactly, whoever's clock sent them
    for label, r in (("cont_r10", rate), ("cont_r8", 8.0)):
        rows = sorted(by_stage[label], key=lambda x: x["trace_id"])
        got = [x["intended_s"] - rows[0]["intended_s"] for x in rows]
        assert got == pytest.approx(poisson_offsets(n, r, 7), abs=2e-3), label
        assert max(abs(x["sent_s"] - x["intended_s"]) for x in rows) < SCHEDULE_BOUND_MS / 1000

    control = cluster.server_control()
    assert control["last_authorization"].get("/v1/completions") == "Bearer sekrit-at-connect"
    log = cluster.server_log()
    received = sorted(row[1] for row in log["requests"])
    assert len(received) == 2 * n
    first = received[:n]  # stage 1 (stage 2 starts after every stage-1 request ended)
    errors = arrival_errors_ms(first, poisson_offsets(n, rate, 7))
    assert max(errors) < SCHEDULE_BOUND_MS, errors


@needs_root
def test_kill9_worker_mid_stage_ends_within_deadline(cluster: Cluster, tmp_path: Path) -> None:
    """kill -9 of one worker mid-stage: the stage ends within its deadline, the dead worker's in-flight
    requests are worker_lost records and its unsent arrivals are counted never sent, exactly."""
    n, rate = 50, 10.0
    trace = write_trace(tmp_path / "trace.jsonl", [(8, 20)] * n)
    cluster.start_server(ttft_ms=20, gap_ms=50)  # 1 s streams: several in flight at the kill
    master = cluster.start_master(2, "--rates", f"{rate:g}", "--trace-file", str(trace), "--n", str(n))
    cluster.start_worker("w0", cluster.hosts.worker(0))
    victim = cluster.start_worker("w1", cluster.hosts.worker(1))
    cluster.wait_until(lambda: cluster.sent_lines() >= 16, 120, "the stage to be under way")
    victim.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    plan_s = poisson_offsets(n, rate, 7)[-1]
    bound = plan_s + REQUEST_TIMEOUT_S + CONNECT_TIMEOUT_S + DEADLINE_MARGIN_S
    assert master.wait(bound + 30) == 0, cluster.output("master")[-4000:]
    assert time.monotonic() - killed_at < bound + 15  # the summary, report and exit follow the deadline
    out = cluster.output("master")
    assert "lost in cont_r10" in out and WORKER_LOST in out, out[-3000:]

    run = json.loads((cluster.results / "run.json").read_text())
    assert run["status"] == "completed" and len(run["workers_lost"]) == 1, run
    s = summaries(cluster.results)["cont_r10"]
    assert s["planned"] == n == s["recorded"] + s["lost_in_flight"] + s["never_sent"], s
    assert s["lost_in_flight"] >= 1 and s["never_sent"] >= 1 and len(s["workers_lost"]) == 1, s
    records = read_records(cluster.results).records
    keys = [(r["stage"], r["trace_id"]) for r in records]
    assert len(keys) == len(set(keys)), "a request has two records"
    assert set(keys) == read_sent(cluster.results)  # every announced send has exactly one record
    assert sum(r["error_class"] == WORKER_LOST for r in records) == s["lost_in_flight"]
    assert len(records) == s["sent"] == n - s["never_sent"]
    # the server saw exactly the requests that were sent, no more (nothing never-sent went out)
    assert len(cluster.server_log()["requests"]) == s["sent"]



@needs_root
def test_worker_loss_stops_the_run_when_asked(cluster: Cluster, tmp_path: Path) -> None:
    """``--on-worker-loss stop``: the stage with the loss is summarized, accounted, and the run ends there."""
    n = 30
    trace = write_trace(tmp_path / "trace.jsonl", [(8, 20)] * n)
    cluster.start_server(ttft_ms=20, gap_ms=50)
    master = cluster.start_master(2, "--rates", "10,5", "--trace-file", str(trace), "--n", str(n),
                                  "--on-worker-loss", "stop")  # fmt: skip
    cluster.start_worker("w0", cluster.hosts.worker(0))
    victim = cluster.start_worker("w1", cluster.hosts.worker(1))
    cluster.wait_until(lambda: cluster.sent_lines() >= 8, 120, "the stage to be under way")
    victim.send_signal(signal.SIGKILL)
    assert master.wait(120) == 0, cluster.output("master")[-4000:]
    run = json.loads((cluster.results / "run.json").read_text())
    assert run["status"] == "stopped after cont_r10: load process(es) lost", run["status"]
    assert run["on_worker_loss"] == "stop" and len(run["workers_lost"]) == 1
    by_label = summaries(cluster.results)
    assert set(by_label) == {"cont_r10"}  # the second stage never started
    s = by_label["cont_r10"]
    assert s["planned"] == n == s["recorded"] + s["lost_in_flight"] + s["never_sent"] and s["never_sent"] >= 1, s
    assert "the run stops after this stage" in cluster.output("master")


def test_kill9_of_a_local_worker_process_does_not_hang(tmp_path: Path) -> None:
    """The same guarantee without namespaces (where the kernel refuses them): ``--processes 2`` on a free
    port, one forked worker killed with SIGKILL mid-stage; the run ends, accounted, within the deadline."""
    import psutil
    from runkit import start_locust

    from tailgate.verify.groundtruth import start_server_process

    n, rate = 40, 10.0
    trace = write_trace(tmp_path / "trace.jsonl", [(8, 20)] * n)
    results = tmp_path / "results"
    with start_server_process(ttft_ms=20, gap_ms=50) as server:
        locust = start_locust(
            "continuous.py", server.base_url, results, tmp_path / "logs", "--processes", "2", *master_port_args(),
            "--rates", f"{rate:g}", "--trace-file", str(trace), "--n", str(n), "--warmup", "0", "--no-metrics",
            "--settle", "0", "--request-timeout", str(REQUEST_TIMEOUT_S), "--connect-timeout", str(CONNECT_TIMEOUT_S),
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while sum(p.read_bytes().count(b"\n") for p in results.glob("sent-*.log")) < 12:
                assert locust.proc.poll() is None, locust.stderr[-3000:]
                assert time.monotonic() < deadline, "the stage never got under way"
                time.sleep(0.05)
            victim = psutil.Process(locust.pid).children()[0]
            victim.send_signal(signal.SIGKILL)
            bound = poisson_offsets(n, rate, 7)[-1] + REQUEST_TIMEOUT_S + CONNECT_TIMEOUT_S + DEADLINE_MARGIN_S
            assert locust.wait(bound + 30) == 0, locust.stderr[-3000:]
        finally:
            if locust.proc.poll() is None:
                locust.proc.kill()
                locust.proc.wait()
    s = summaries(results)["cont_r10"]
    assert s["planned"] == n == s["recorded"] + s["lost_in_flight"] + s["never_sent"] and s["never_sent"] >= 1, s
    assert len(s["workers_lost"]) == 1
    run = json.loads((results / "run.json").read_text())
    assert run["status"] == "completed" and len(run["workers_lost"]) == 1

WORKER_FAILS = """
import json, sys, gevent
from types import SimpleNamespace
from tailgate.load.worker import DONE_MESSAGE, OrderRunner

sent = []
runner = SimpleNamespace(send_message=lambda kind, data, client_id=None: sent.append((kind, data)))
orders = OrderRunner(SimpleNamespace(runner=runner))
orders.submit({"order_id": "0:0:0", "run_id": "r", "stage": 0, "config": {"host": "http://127.0.0.1:9"}})
gevent.sleep(0.2)
orders.submit({"order_id": "1:0:0", "run_id": "r", "stage": 1, "config": {}})
gevent.sleep(0.2)
print(json.dumps([[kind, data.get("stage"), data.get("error")] for kind, data in sent]))
"""


def test_an_order_that_fails_in_a_worker_still_reports_done_with_the_error() -> None:
    """Without the DONE the master would wait for this order until its deadline; with it, the error reaches the
    master's output (``load process ... failed``) and the next order still runs."""
    done = subprocess.run([sys.executable, "-c", WORKER_FAILS], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    sent = json.loads(done.stdout.strip().splitlines()[-1])
    assert [(kind, stage) for kind, stage, _ in sent] == [("tailgate_done", 0), ("tailgate_done", 1)]
    # an order missing its keys fails its contract on arrival, naming what it lacks
    assert all(error and error.startswith("ContractError: order lacks 'stage_label'") for _, _, error in sent), sent


def test_processes_option_takes_auto() -> None:
    from tailgate.cli import parse_processes
    from tailgate.load.options import OptionError
    from tailgate.suite import Cell, cell_processes

    assert parse_processes("auto") == 0 and parse_processes("3") == 3
    with pytest.raises(OptionError):
        parse_processes("0")
    assert cell_processes(Cell("chunked", "continuous", 1.0), 0) == 1
    assert cell_processes(Cell("chunked", "continuous", 1.0), 2) == 2


def test_report_says_how_many_processes_would_have_kept_up() -> None:
    """Run in a fresh interpreter: the analysis must not share this one's imports (gevent)."""
    code = """
import pandas as pd
from tailgate.postprocess.report import _data_notes
summaries = pd.DataFrame([
    {"cell": "chunked-cont-r80", "schedule_lag_p99": 40.0, "processes_to_keep_up": 3, "summary_source": "summary",
     "errors": 0, "errors_by_class": {}, "preemption_counter_reset": False},
    {"cell": "chunked-cont-r5", "schedule_lag_p99": 0.5, "processes_to_keep_up": 1, "summary_source": "summary",
     "errors": 0, "errors_by_class": {}, "preemption_counter_reset": False}])
table = pd.DataFrame({"preemptions_disagree": [False, False], "cell": ["a", "b"], "errors": [0, 0]})
print("\\n".join(_data_notes([], summaries, pd.DataFrame(), table)))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "load processes that would have kept up: chunked-cont-r80 3" in done.stdout, done.stdout
    assert "chunked-cont-r5 1" not in done.stdout
