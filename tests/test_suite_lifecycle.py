"""How a suite ends, against the ground-truth server (seconds, no vLLM): every signal, bad folders, secrets.

The suite is run as a user runs it (``python -m tailgate.cli suite``, ``--server url``), and stopped
the way a terminal, ``kill`` or a CI timeout stops it. After each end the test checks what the
suite promises: the exit code, suite.json and run.json saying how the run ended, and no process
left that the suite started (found by the results folder on their command lines, which is unique
to this test).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import ROOT, write_trace

from tailgate.lifecycle import stop_process_tree
from tailgate.verify.groundtruth import ServerProcess, start_server_process

# the busy pass (scripts/test.sh) runs these again: their verdicts depend on when things happen
pytestmark = pytest.mark.timing

KEY = "sk-lifecycle-SECRET-9876"


@pytest.fixture(scope="module")
def gt() -> Iterator[ServerProcess]:
    """About 1.5 s per stream, so a stage always has requests in flight when the signal comes."""
    with start_server_process(ttft_ms=50, gap_ms=60) as server:
        yield server


def suite_cmd(gt: ServerProcess, results: Path, trace: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "tailgate.cli", "suite", "--server", "url", "--host", gt.base_url,
        "--configs", "chunked", "--rates", "8", "--no-gated", "--nochunk-rates", "none", "--preempt-rate", "none",
        "--n", "2", "--warmup", "0", "--results", str(results), "--no-report", "--stage-warmup", "0",
        f"--locust-arg=--trace-file={trace}", "--locust-arg=--settle=0", *extra,
    ]  # fmt: skip


def mentioning(text: str) -> list[psutil.Process]:
    """Live processes (not this one) whose command line contains ``text``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if text in " ".join(proc.info["cmdline"] or ()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def start(cmd: list[str], logs: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    out = open(logs, "wb")
    try:
        return subprocess.Popen(
            cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, start_new_session=True,
        )  # fmt: skip
    finally:
        out.close()


def wait_for(condition, proc: subprocess.Popen[bytes], logs: Path, what: str, timeout: float = 120) -> None:
    """Poll until ``condition`` holds; fail at once if the suite exits first (the wait ends with the child)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"suite exited ({proc.returncode}) before {what}:\n{logs.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{logs.read_text()[-3000:]}"
        time.sleep(0.05)


def records_in(cell: Path) -> int:
    return sum(p.read_bytes().count(b"\n") for p in cell.glob("records-*.jsonl"))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_mid_cell_stops_everything_and_says_so(gt: ServerProcess, tmp_path: Path, sig: int) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", [(4, 25)] * 40)
    results, logs = tmp_path / "suite", tmp_path / "suite.log"
    proc = start(suite_cmd(gt, results, trace), logs)
    cell = results / "chunked_cont_r8"
    wait_for(lambda: records_in(cell) >= 2, proc, logs, "the first records")
    children = [p.pid for p in mentioning(str(results))]
    assert children, "no Locust child seen"
    t0 = time.monotonic()
    proc.send_signal(sig)
    code = proc.wait(timeout=90)
    took = time.monotonic() - t0
    output = logs.read_text()
    assert code == 128 + sig, output[-3000:]
    assert "Traceback" not in output and "greenlet" not in output.lower(), output[-3000:]
    assert f"[suite] {signal.Signals(sig).name}: stopping everything" in output
    assert "--resume" in output
    suite = json.loads((results / "suite.json").read_text())
    assert (suite["status"], suite["exit_code"], suite["end_detail"]) == ("interrupted", 128 + sig, sig.name)
    assert suite["ended"]
    run = json.loads((cell / "run.json").read_text())
    assert run["status"] in ("stopped", "interrupted") and run["ended"]
    assert not [p for p in children if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert mentioning(str(results)) == []
    assert took < 30, f"{took:.1f} s from {sig.name} to exit"


def test_a_finished_folder_is_never_reused_without_resume(gt: ServerProcess, tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", [(4, 3)] * 4)
    results = tmp_path / "suite"
    cmd = suite_cmd(gt, results, trace)
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    suite = json.loads((results / "suite.json").read_text())
    assert (suite["status"], suite["exit_code"]) == ("completed", 0)
    before = {p: p.stat().st_mtime_ns for p in results.rglob("*") if p.is_file()}

    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr.count("\n") == 1 and "holds a finished suite" in again.stderr and "--resume" in again.stderr
    assert {p: p.stat().st_mtime_ns for p in results.rglob("*") if p.is_file()} == before

    changed = [*cmd, "--resume", "--seed", "8"]
    refused = subprocess.run(changed, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--resume: seed was 7" in refused.stderr

    resumed = subprocess.run([*cmd, "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert "already done, skipped" in resumed.stdout

    # a Locust run into a folder that holds a run is refused the same way
    locust = subprocess.run(
        [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles" / "continuous.py"), "--headless",
         "--host", gt.base_url, "--results-dir", str(results / "chunked_cont_r8"), "--rates", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert locust.returncode == 2 and "already holds run" in locust.stderr, locust.stderr[-2000:]


def test_bad_combinations_are_one_line_and_exit_2(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "tailgate.cli", "suite"]
    cases = {
        "--server": [*base, "--embedded", "--server", "compose", "--results", str(tmp_path / "a")],
        "--nochunk-flags": [*base, "--server", "compose", "--nochunk-flags", "--foo", "--results", str(tmp_path / "b")],
        "--resume": [*base, "--server", "url", "--configs", "chunked", "--resume", "--results", str(tmp_path / "c")],
    }
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("mine")
    cases["not empty"] = [*base, "--server", "url", "--configs", "chunked", "--results", str(tmp_path / "d")]
    for what, cmd in cases.items():
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, (what, done.stderr)
        assert done.stderr.count("\n") == 1 and what in done.stderr, (what, done.stderr)
        assert "Traceback" not in done.stderr


def test_the_key_reaches_children_through_the_environment_only(gt: ServerProcess, tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", [(4, 25)] * 12)
    results, logs = tmp_path / "suite", tmp_path / "suite.log"
    cmd = suite_cmd(gt, results, trace, f"--locust-arg=--api-key={KEY}")
    cmd = [c for c in cmd if c != "--no-report"]
    proc = start(cmd, logs)
    argvs: list[str] = []
    child_env_has_key = False
    # A child caught between fork and exec still shows the suite's own argv: that copy is not a child's
    own_argv = " ".join(cmd)
    while proc.poll() is None:  # every child's argv while the suite runs; ends when the suite does
        for child in psutil.Process(proc.pid).children(recursive=True) if psutil.pid_exists(proc.pid) else []:
            try:
                argv = " ".join(child.cmdline())
                if argv != own_argv:
                    argvs.append(argv)
                child_env_has_key |= child.environ().get("TAILGATE_API_KEY") == KEY
            except psutil.Error:
                continue
        time.sleep(0.1)
    assert proc.wait() == 0, logs.read_text()[-3000:]
    assert child_env_has_key and argvs
    assert not [a for a in argvs if "SECRET-9876" in a]
    assert gt.control({})["last_authorization"]["/v1/completions"] == f"Bearer {KEY}"
    assert "SECRET-9876" not in logs.read_text()
    holding = [str(p) for p in results.rglob("*") if p.is_file() and b"SECRET-9876" in p.read_bytes()]
    assert holding == []
    suite = json.loads((results / "suite.json").read_text())
    assert suite["api_key_set"] is True and "--api-key=<redacted>" in " ".join(suite["environment"]["argv"])
    assert (results / "report" / "report.html").is_file()


def test_stop_process_tree_ends_grandchildren_that_ignore_sigint(tmp_path: Path) -> None:
    script = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "subprocess.Popen([sys.executable, '-c', 'import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        " time.sleep(300)'])\n"
        "print('ready', flush=True); time.sleep(300)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    tree = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
    assert len(tree) == 2
    killed = stop_process_tree(proc, grace_s=0.5, term_s=1.0)
    assert tree[1] in killed  # ignored both SIGINT (never sent to it) and SIGTERM
    time.sleep(0.2)
    assert not [p for p in tree if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_locust_alone_ends_cleanly_on_each_signal(gt: ServerProcess, tmp_path: Path, sig: int) -> None:
    """A Locust run stopped by hand: every request sent has a record, run.json says interrupted, no noise, and
    the exit code names the signal (130, 143, 129), as ``tailgate suite`` and ``tailgate slo`` do."""
    from runkit import start_locust

    from tailgate.records import lost_in_flight

    trace = write_trace(tmp_path / "trace.jsonl", [(4, 25)] * 40)
    out = tmp_path / "results"
    locust = start_locust("continuous.py", gt.base_url, out, tmp_path, "--rates", "8", "--trace-file", str(trace),
                          "--warmup", "0")  # fmt: skip
    wait_for(lambda: records_in(out) >= 2, locust.proc, locust.stderr_path, "the first records")  # type: ignore[arg-type]
    locust.proc.send_signal(sig)
    code = locust.wait(90)
    text = locust.stdout + locust.stderr
    assert code == 128 + sig, (code, text[-3000:])  # the rule of tailgate.exitcodes, as tailgate suite and slo
    assert "Traceback" not in text and "greenlet" not in text.lower() and "KeyboardInterrupt" not in text, text[-3000:]
    run = json.loads((out / "run.json").read_text())
    assert run["status"] in ("stopped", "interrupted") and run["ended"]
    loss = lost_in_flight(out)
    assert loss.lost == 0 and loss.sent == loss.recorded > 0  # in-flight requests became records
    assert mentioning(str(out)) == []


def test_a_cell_that_lost_a_load_process_makes_the_suite_exit_incomplete(gt: ServerProcess, tmp_path: Path) -> None:
    """kill -9 of one of a cell's two load processes mid-stage: the cell is accounted and done, and the suite
    exits with the rule's 4 (its own exit code combines its cells'), as Locust alone does for that run."""
    trace = write_trace(tmp_path / "trace.jsonl", [(4, 25)] * 40)
    results, logs = tmp_path / "suite", tmp_path / "suite.log"
    proc = start(suite_cmd(gt, results, trace, "--processes", "2", "--locust-arg=--request-timeout=5"), logs)
    cell = results / "chunked_cont_r8"

    def sent() -> int:
        return sum(f.read_bytes().count(b"\n") for f in cell.glob("sent-*.log")) if cell.exists() else 0

    wait_for(lambda: sent() >= 10, proc, logs, "the cell under way")
    (locust,) = psutil.Process(proc.pid).children()
    victim = locust.children()[0]
    victim.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=120) == 4, logs.read_text()[-3000:]
    suite = json.loads((results / "suite.json").read_text())
    assert (suite["status"], suite["exit_code"]) == ("completed", 4)
    run = json.loads((cell / "run.json").read_text())
    assert run["status"] == "completed" and len(run["workers_lost"]) == 1, run


@pytest.mark.parametrize("boundary", ["done in", "cell 2/2"], ids=["after-a-cell", "before-the-next"])
def test_a_signal_at_a_cell_boundary_then_resume(gt: ServerProcess, tmp_path: Path, boundary: str) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", [(4, 3)] * 4)
    results, logs = tmp_path / "suite", tmp_path / "suite.log"
    cmd = suite_cmd(gt, results, trace)
    cmd[cmd.index("--rates") + 1] = "8,9"
    proc = start(cmd, logs)
    wait_for(lambda: boundary in logs.read_text(), proc, logs, f"'{boundary}'")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=90) == 143, logs.read_text()[-3000:]
    assert "Traceback" not in logs.read_text()
    suite = json.loads((results / "suite.json").read_text())
    assert (suite["status"], suite["exit_code"]) == ("interrupted", 143)
    assert json.loads((results / "chunked_cont_r8" / "run.json").read_text())["status"] == "completed"
    second = results / "chunked_cont_r9" / "run.json"
    assert not second.exists() or json.loads(second.read_text())["status"] != "running"
    assert mentioning(str(results)) == []
    resumed = subprocess.run([*cmd, "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "chunked_cont_r8 already done, skipped" in resumed.stdout
    assert json.loads((results / "chunked_cont_r9" / "run.json").read_text())["status"] == "completed"
    assert json.loads((results / "suite.json").read_text())["status"] == "completed"


def test_the_stage_warmup_runs_before_the_first_cell_and_is_no_cell(gt: ServerProcess, tmp_path: Path) -> None:
    """Rounds at the server's top rate under stage-warmup/, before the first cell, in suite.json, never a cell."""
    from tailgate.postprocess.runfolders import find_run_dirs

    trace = write_trace(tmp_path / "trace.jsonl", [(4, 3)] * 4)
    results = tmp_path / "suite"
    done = subprocess.run([*suite_cmd(gt, results, trace), "--stage-warmup", "4"], cwd=ROOT, capture_output=True,
                          text=True, timeout=180)  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    warm_line = out.index("[suite] chunked: stage warm-up worst gaps")
    assert warm_line < out.index("[suite] cell 1/1: chunked_cont_r8"), out
    assert out.count("stage warm-up worst gaps") == 1
    suite = json.loads((results / "suite.json").read_text())
    warm = suite["stage_warmup"]["chunked"]
    assert 2 <= len(warm["rounds"]) <= 3 and isinstance(warm["settled"], bool), warm
    assert all(r["value"] == 8 and r["requests"] == 4 and r["dir"].startswith("stage-warmup/") for r in warm["rounds"])
    assert all(list((results / r["dir"]).glob("records-*.jsonl")) for r in warm["rounds"])
    first_cell = min(p.stat().st_mtime for p in (results / "chunked_cont_r8").glob("records-*.jsonl"))
    last_round = max(p.stat().st_mtime for r in warm["rounds"] for p in (results / r["dir"]).glob("records-*.jsonl"))
    assert last_round <= first_cell
    assert suite["cells"] == ["chunked_cont_r8"]
    assert [p.name for p in find_run_dirs(results)] == ["chunked_cont_r8"]


def test_both_commands_check_a_compose_setup_before_starting_anything(tmp_path: Path) -> None:
    """The suite and the search share one setup check: a Docker engine that is down is one line and exit 2
    from either, with no results folder left behind."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    docker.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    base = [sys.executable, "-m", "tailgate.cli"]
    for command, extra in (("suite", []), ("slo", ["--slo", "ttft_p99<=1s"])):
        results = tmp_path / command
        cmd = [*base, command, "--server", "compose", *extra, "--results", str(results)]
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, (command, done.stderr)
        assert done.stderr.count("\n") == 1 and "Docker engine is not running" in done.stderr, done.stderr
        assert not results.exists()
