"""``--processes auto`` sized from this host's calibration: the rules, the cache per host, the commands that take
it, and bad input.

The calibration itself runs once here (a few seconds, in ``tmp_path``'s own ``TAILGATE_HOME``); what is
asserted is where its answer goes and when it is reused, never how fast this machine is.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from tailgate.load import hostcapacity, processes
from tailgate.load.hostcapacity import (
    FALLBACK_CHUNKS_PER_PROCESS_BY_STAMP,
    FALLBACK_CHUNKS_PER_TRUTH_WORKER,
    HostCapacity,
    calibration_path,
    host_capacity,
    host_key,
)
from tailgate.optiontable import OptionError, parse_processes
from tailgate.verify.selfcheck import EXIT_USAGE, main


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``TAILGATE_HOME`` of the test's own, calibration on, nothing remembered from another test."""
    monkeypatch.setenv("TAILGATE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TAILGATE_CALIBRATION", raising=False)
    hostcapacity.forget()
    yield tmp_path / "home"
    hostcapacity.forget()


def test_capacities_follow_the_cpu_a_chunk_costs() -> None:
    fast, slow = HostCapacity(10.0, 10.0, "measured"), HostCapacity(20.0, 25.0, "measured")
    assert fast.per_process("kernel") == pytest.approx(
        hostcapacity.CORE_SHARE_BY_STAMP["kernel"] * 1e6 / (10.0 * hostcapacity.PROCESS_OVER_READ_PATH)
    )
    assert slow.per_process("kernel") == pytest.approx(fast.per_process("kernel") / 2)
    assert fast.per_process("recv") == fast.per_process("kernel") == fast.per_process("no such stamp")
    # capture: more CPU per chunk, but reads need not be on time, so a larger share of a core
    assert fast.per_process("capture") > fast.per_process("kernel")
    assert slow.per_truth_worker() == pytest.approx(0.5e6 / 25.0)
    table = HostCapacity()
    assert table.per_process("capture") == FALLBACK_CHUNKS_PER_PROCESS_BY_STAMP["capture"]
    assert table.per_truth_worker() == FALLBACK_CHUNKS_PER_TRUTH_WORKER
    assert "16-core host's table" in table.line()


def test_counts_from_the_capacity_never_above_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    cap = HostCapacity(10.0, 20.0, "measured")  # 17,391 chunks/s per process, 25,000 per reference worker
    monkeypatch.setattr(processes, "host_capacity", lambda measure=False, log=None: cap)
    assert processes.auto_processes(1000.0, cores=16) == 1
    assert processes.auto_processes(200_000.0, cores=16) == 12
    assert processes.auto_processes(10_000_000.0, cores=16) == 16
    assert processes.truth_workers(1000.0, cores=16) == 1
    assert processes.truth_workers(400_000.0, cores=16) == 8  # 16 asked for, half the cores at most
    assert processes.truth_workers(400_000.0, cores=2) == 1


def test_auto_gives_the_load_the_cores_the_reference_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    """Load processes and reference workers never outnumber the cores together: past that, both sides queue."""
    from tailgate.verify import selfcheckrun

    cap = HostCapacity(10.0, 20.0, "measured")  # 17,391 chunks/s per process, 25,000 per reference worker
    monkeypatch.setattr(processes, "host_capacity", lambda measure=False, log=None: cap)
    monkeypatch.setattr(selfcheckrun, "host_capacity", lambda measure=False, log=None: cap)
    monkeypatch.setattr(selfcheckrun.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(processes.os, "cpu_count", lambda: 16)
    said: list[str] = []
    small = selfcheckrun.size_run(selfcheckrun.SelfCheckConfig(rate=100, processes=0), "kernel", said.append)
    assert (small.processes, small.truth_workers) == (1, 1) and said == []
    # 400,000 chunks/s wants 23 load processes and 16 reference workers: 8 workers (half), the load the other 8
    big = selfcheckrun.size_run(selfcheckrun.SelfCheckConfig(rate=4000, processes=0), "kernel", said.append)
    assert (big.processes, big.truth_workers) == (8, 8)
    assert len(said) == 1 and "16 cores" in said[0] and "which side fell behind" in said[0]


def test_off_uses_the_table_and_says_so(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAILGATE_CALIBRATION", "off")
    cap = host_capacity()
    assert cap.source == "table" and "TAILGATE_CALIBRATION=off" in cap.note
    assert not calibration_path().exists()


def test_a_calibration_of_another_host_is_not_used(home: Path) -> None:
    other = {**host_key(), "cpu_model": "some other CPU"}
    home.mkdir(parents=True)
    measured = {"read_us_per_chunk": 5.0, "server_us_per_chunk": 6.0}
    calibration_path().write_text(json.dumps({"key": other, "measured": measured}))
    cap = host_capacity(measure=False)  # a load process at a stage's end never starts the calibration
    assert cap.source == "table" and "not calibrated" in cap.note
    calibration_path().write_text(json.dumps({"key": host_key(), "measured": measured, "at": "then"}))
    hostcapacity.forget()
    assert host_capacity(measure=False).read_us_per_chunk == 5.0


def test_selfcheck_takes_auto_and_the_calibration_is_written_then_reused(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "result.json"
    code = main(["--rate", "10", "--n", "12", "--tokens", "10", "--processes", "auto", "--no-host-watch",
                 "--json", str(out)])  # fmt: skip
    printed = capsys.readouterr()
    assert code in (0, 1), printed.err[-2000:]  # the verdict is this busy machine's; the sizing is what is tested
    result = json.loads(out.read_text())
    assert result["config"]["processes"] == 0 and result["load_processes"] == 1
    assert result["truth_server"] == {**result["truth_server"], "workers": 1, "auto": True}
    assert result["capacity"]["source"] == "measured" and result["join"]["exact"]
    assert "auto: capacity from this host's calibration (measured)" in printed.out
    assert "calibrating this host once" in printed.err
    doc = json.loads(calibration_path().read_text())
    assert doc["key"] == host_key() and doc["measured"]["read_us_per_chunk"] > 0
    assert doc["measured"]["server_us_per_chunk"] > 0

    def no_second_measurement(log: object) -> dict:
        raise AssertionError("measured again although this host's calibration is cached")

    monkeypatch.setattr(hostcapacity, "_measure", no_second_measurement)
    hostcapacity.forget()  # as a new command would: from the file, not this process's memory
    cap = host_capacity()
    assert cap.source == "cached" and cap.read_us_per_chunk == doc["measured"]["read_us_per_chunk"]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--processes", "zero"], "--processes: a count or auto, got 'zero'"),
        (["--processes", "0"], "--processes: must be at least 1 (or auto), got 0"),
        (["--truth-workers", "-2"], "--truth-workers: must be at least 1 (or auto), got -2"),
        (["--hosts", "2", "--processes", "1"], "--processes: 1 cannot cover --hosts 2"),
        (["--max-server-late-p99-ms", "-1"], "--max-server-late-p99-ms: must be 0 or more"),
    ],
)
def test_bad_counts_are_one_line_and_exit_2(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == EXIT_USAGE == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err


def test_parse_processes() -> None:
    assert parse_processes("auto") == parse_processes(" AUTO ") == 0 and parse_processes("3") == 3
    for bad in ("0", "-1", "1.5", "many", ""):
        with pytest.raises(OptionError):
            parse_processes(bad)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        ([sys.executable, "-m", "tailgate.slo", "--slo", "ttft_p99<=300ms", "--processes", "lots"],
         "--processes: a count or auto, got 'lots'"),
        ([sys.executable, "-m", "tailgate.verify.groundtruth", "--workers", "0"], "a count of at least 1, got 0"),
    ],
)  # fmt: skip
def test_other_commands_refuse_bad_counts_in_one_line(argv: list[str], said: str) -> None:
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr and done.stderr.strip().count("\n") == 0, done.stderr


def test_slo_takes_auto_per_probe() -> None:
    import argparse

    from tailgate.slo import add_slo_arguments
    from tailgate.slo.command import build_plan

    parser = argparse.ArgumentParser()
    add_slo_arguments(parser)
    assert build_plan(parser.parse_args(["--slo", "ttft_p99<=300ms", "--processes", "auto"])).processes == 0
    assert build_plan(parser.parse_args(["--slo", "ttft_p99<=300ms"])).processes == 1


def test_locusts_own_processes_option_sizes_auto_from_the_runs_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import argparse

    from tailgate.load import autosize

    cap = HostCapacity(10.0, 10.0, "measured")  # 17,391 chunks/s per process
    monkeypatch.setattr(processes, "host_capacity", lambda measure=False, log=None: cap)
    monkeypatch.setattr(processes.os, "cpu_count", lambda: 16)
    trace = tmp_path / "long.jsonl"
    trace.write_text("".join(f'{{"id": {i}, "prompt_tokens": 4, "max_tokens": 100}}\n' for i in range(4)))

    def opts(**kw: object) -> argparse.Namespace:
        base = {"locustfile": "locustfiles/continuous.py", "rates": "1,5", "batch_size": 16, "trace_file": "",
                "chunk_stamp": "kernel", "worker": False}  # fmt: skip
        return argparse.Namespace(**{**base, **kw})

    assert autosize.locust_processes(opts()) is None  # one process: Locust forks nothing
    assert autosize.locust_processes(opts(rates="100,600", trace_file=str(trace))) == 4  # 60,000 chunks/s
    assert autosize.locust_processes(opts(locustfile="locustfiles/gated.py", batch_size=1000)) == 6  # 100,000
    with pytest.raises(ValueError, match="a worker cannot size itself"):
        autosize.locust_processes(opts(worker=True))


def test_locust_runs_with_processes_auto_and_refuses_a_bad_count(tmp_path: Path) -> None:
    from tailgate.load.processes import master_port_args
    from tailgate.verify.groundtruth import DEFAULT_MODEL, start_server_process

    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(f'{{"id": {i}, "prompt_tokens": 4, "max_tokens": 5}}\n' for i in range(6)))
    with start_server_process(ttft_ms=5, gap_ms=5) as server:
        cases = (("auto", "auto", 0, "--processes auto: 1 load process(es)"),
                 ("bad", "many", 2, "argument --processes: a count or auto, got 'many'"))  # fmt: skip
        for name, count, code, said in cases:
            cmd = [sys.executable, "-m", "tailgate.locustcmd", "-f", "locustfiles/continuous.py", "--headless",
                   "--only-summary", "--host", server.base_url, "--results-dir", str(tmp_path / name),
                   "--trace-file", str(trace), "--n", "6", "--warmup", "0", "--rates", "5", "--model", DEFAULT_MODEL,
                   "--settle", "0", "--sample-metrics", "0", *master_port_args(), "--processes", count]  # fmt: skip
            done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert done.returncode == code and said in done.stderr, done.stderr[-2000:]
