"""The one runner for a Locust child and the one server step, as ``suite``, ``slo`` and ``selfcheck`` use them.

Against the ground-truth server (seconds, no vLLM): the child's own session and free master port, the
whole process tree stopped on SIGTERM of ``tailgate slo``, and what is recorded about a server that a
person restarts. Controllers declare their capabilities; nothing probes for them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import ROOT, write_trace
from recordkit import record
from runkit import RecordingController

from tailgate import slo
from tailgate.runner import ChildRunner, LocustRun, prepare_server
from tailgate.servers import FixedServer, LocalVllmServer, ManualServer
from tailgate.servers.base import ServerController
from tailgate.servers.compose import ComposeByConfig, ComposeServer
from tailgate.servers.sweep import CommandServer, ComposeWithFlags
from tailgate.suite import Suite, SuitePlan
from tailgate.verify.groundtruth import ServerProcess, start_server_process

# the busy pass (scripts/test.sh) runs these again: their verdicts depend on when things happen
pytestmark = pytest.mark.timing

CONTROLLERS = (LocalVllmServer, ComposeServer, ComposeByConfig, ManualServer, FixedServer, CommandServer,
               ComposeWithFlags)  # fmt: skip


@pytest.fixture(scope="module")
def gt() -> Iterator[ServerProcess]:
    """About 1.5 s per stream, so a probe always has requests in flight when the signal comes."""
    with start_server_process(ttft_ms=50, gap_ms=60) as server:
        yield server


# ------------------------------------------------------------------------------------------ the contract


@pytest.mark.parametrize("cls", CONTROLLERS, ids=lambda c: c.__name__)
def test_every_controller_declares_its_capabilities(cls: type) -> None:
    for name in ("restarts", "applies_flags", "flags_in_files"):
        assert isinstance(getattr(cls, name), bool), f"{cls.__name__}.{name} is not declared"
    for method in ("use_config", "start", "stop", "restart", "wait_healthy", "describe"):
        assert callable(getattr(cls, method, None)), f"{cls.__name__}.{method} is missing"


def test_no_runner_probes_for_capabilities() -> None:
    """The capabilities are members of the protocol; a ``getattr`` default would hide a missing one."""
    tg = ROOT / "tailgate"
    sources = [tg / "suite.py", tg / "runner.py", *(tg / "slo").glob("*.py"), *(tg / "verify").glob("selfcheck*.py")]
    for path in sources:
        text = path.read_text()
        for name in ("restarts", "applies_flags", "flags_in_files", "use_config"):
            assert not re.search(rf'(get|has)attr\([^)]*"{name}"', text), (path, name)


def test_the_command_always_names_a_free_master_port(tmp_path: Path) -> None:
    """Locust's default master port (5557) makes two runs on one host cross-connect, even with one process:
    a caller's ``--processes`` may arrive through the extra options."""
    for processes in (1, 3):
        cmd = LocustRun(arm="continuous", host="http://127.0.0.1:9", results=tmp_path, stage=("--rates", "2"),
                        n=3, warmup=0, seed=7, processes=processes).command()  # fmt: skip
        port = int(cmd[cmd.index("--master-bind-port") + 1])
        assert port != 5557 and cmd[cmd.index("--master-port") + 1] == str(port)


def test_the_child_has_its_own_session_and_its_tree_is_stopped(tmp_path: Path) -> None:
    """A Ctrl-C in the terminal must reach the caller alone, and stopping the child ends its grandchildren."""
    script = ("import subprocess, sys, time, signal\n"
              "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
              "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
              "signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)'])\n"
              "print('ready', flush=True)\n"
              "time.sleep(60)\n")  # fmt: skip
    runner = ChildRunner(log=lambda _line: None)
    seen: dict[str, Any] = {}

    def watch() -> str | None:
        child = runner.child
        if child is None or child.returncode is not None or "sid" in seen:  # the last look after the end
            return None
        kids = psutil.Process(child.pid).children(recursive=True)
        if not kids:
            return None
        seen.update(sid=os.getsid(child.pid), pid=child.pid, tree={p.pid for p in kids})
        return "enough"

    done = runner.run([sys.executable, "-c", script], watch=watch, stop_grace_s=1.0)
    assert seen["sid"] == seen["pid"] != os.getsid(0)
    assert done.stopped_early == "enough" and runner.child is None
    assert seen["tree"] and _alive(seen["tree"]) == []


# ------------------------------------------------------------------------------------------- the server


def _manual(gt: ServerProcess) -> ManualServer:
    """A person who restarts at once: the prompt is answered, the server is up."""
    return ManualServer(gt.base_url, out=lambda _line: None, interactive=True, input_fn=lambda _prompt: "")


def test_a_manual_server_never_records_flags_as_applied(gt: ServerProcess, tmp_path: Path) -> None:
    flags = ["--max-num-seqs", "8"]
    entry = prepare_server(_manual(gt), "seqs8", flags, log=lambda _line: None)
    assert entry["flags_applied"] is False and entry["flags"] is None and entry["requested_flags"] == flags
    # slo: the same step, recorded in slo.json
    plan = slo.SloPlan(
        limits=slo.parse_slo("ttft_p99<=300ms"), configs=[slo.parse_config("seqs8: max-num-seqs=8")], model_replicates=0
    )
    runner = slo.SloRunner(plan, _manual(gt), tmp_path / "slo", log=lambda _line: None)
    runner.root.mkdir()
    runner.serve(plan.configs[0])
    server = json.loads((tmp_path / "slo" / slo.SLO_FILE).read_text())["configs"][0]["server"]
    assert server["flags_applied"] is False and server["requested_flags"] == flags
    # suite: the same
    suite = Suite(SuitePlan(server_flags={"chunked": flags}), _manual(gt), tmp_path / "suite", log=lambda _l: None)
    suite.root.mkdir()
    suite.serve("chunked")
    server = json.loads((tmp_path / "suite" / "suite.json").read_text())["servers"]["chunked"]
    assert server["flags_applied"] is False and server["requested_flags"] == flags
    # a server nobody restarts keeps the declared flags apart; one restarted here applies them
    fixed = prepare_server(FixedServer(gt.base_url), "x", flags, declared=flags, log=lambda _line: None)
    assert fixed["flags_applied"] is False and fixed["declared_flags"] == flags and fixed["flags"] is None
    assert isinstance(FixedServer(gt.base_url), ServerController)


def test_the_server_session_restarts_and_warms_up_once_per_start(tmp_path: Path) -> None:
    """A configuration already running is neither restarted nor warmed again; moving to another restarts it,
    and its fresh engine is warmed again: rounds in their folders with their seeds, recorded, and said once."""
    from tailgate.serversession import RoundRun, ServerSession, StageLoad
    from tailgate.stagewarmup import STAGE_WARMUP_SEED, StageWarmup

    ctl, lines = RecordingController(), list[str]()
    session = ServerSession(ctl, tmp_path, ChildRunner(lines.append), log=lines.append, tag="[x] ")  # type: ignore[arg-type]
    entries: list[dict[str, Any]] = []
    warmed: list[StageWarmup] = []
    rounds: list[tuple[int, Path, int]] = []
    gaps = {1: 900.0, 2: 80.0, 3: 70.0}

    def one_round(k: int, out: Path, seed: int) -> RoundRun:
        rounds.append((k, out, seed))
        return RoundRun([record(worst_gap_ms=gaps[k])], 1.0)

    def load() -> StageLoad:
        return StageLoad(7, one_round, arm="continuous", value=8.0, requests=5, at="8 req/s")

    def ensure(config: str) -> bool:
        return session.ensure(
            config, ["--f", config], declared=None, record=entries.append, warmup=load, record_warmup=warmed.append
        )

    assert ensure("a") and not ensure("a") and ensure("b")
    assert ctl.restarted == [["--f", "a"], ["--f", "b"]] and [e["flags"] for e in entries] == ctl.restarted
    assert [(k, out.relative_to(tmp_path).as_posix(), seed) for k, out, seed in rounds[:3]] == [
        (k, f"stage-warmup/a_w{k}", 7 + STAGE_WARMUP_SEED + k) for k in (1, 2, 3)
    ]
    assert len(rounds) == 6 and len(warmed) == 2 and warmed[0].settled
    assert [r.worst_gap_ms for r in warmed[1].rounds] == [900.0, 80.0, 70.0]
    first = {"round": 1, "dir": "stage-warmup/a_w1", "arm": "continuous", "value": 8.0, "requests": 5,
             "worst_gap_ms": 900.0, "seconds": 1.0}  # fmt: skip
    assert warmed[0].rounds[0].to_json() == first
    said = [line for line in lines if "stage warm-up worst gaps" in line]
    assert said == [f"[x] {c}: stage warm-up worst gaps 900 -> 80 -> 70 ms: no first-time pause left "
                    "(3 x 5 requests at 8 req/s)" for c in "ab"]  # fmt: skip


# ------------------------------------------------------------------------------------------ slo, whole


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _alive(pids: set[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            continue
    return out


def _cmdlines(pids: set[int]) -> str:
    """The command lines of those still alive; a short-lived child (a compile helper of the engine's) may end
    between the listing and the read, and is skipped."""
    lines = []
    for pid in _alive(pids):
        try:
            lines.append(" ".join(psutil.Process(pid).cmdline()))
        except psutil.Error:
            continue
    return " ".join(lines)


def test_sigterm_of_slo_mid_probe_stops_the_locust_tree(gt: ServerProcess, tmp_path: Path) -> None:
    """The child in its own session with a free master port (its ``--processes`` workers on it too), and
    SIGTERM of ``tailgate slo`` going through the cleanup that stops the whole tree."""
    trace = write_trace(tmp_path / "trace.jsonl", [(4, 25)] * 40)
    results, logs = tmp_path / "slo", tmp_path / "slo.log"
    cmd = [sys.executable, "-m", "tailgate.cli", "slo", "--server", "url", "--host", gt.base_url,
           "--slo", "ttft_p99<=60s", "--trace-file", str(trace), "--warmup", "0", "--start-rate", "8",
           "--max-rate", "8", "--processes", "2", "--results", str(results), "--no-report",
           "--locust-arg=--settle=0", "--model-replicates", "0"]  # fmt: skip
    with open(logs, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not any(p.read_bytes().count(b"\n") >= 2 for p in results.glob("*/records-*.jsonl")):
            assert proc.poll() is None, logs.read_text()[-3000:]
            assert time.monotonic() < deadline, logs.read_text()[-3000:]
            time.sleep(0.05)
        tree = _descendants(proc.pid)
        locusts = [p for p in tree if "locust" in " ".join(p.cmdline())]
        assert locusts, "no Locust child seen"
        top = min(locusts, key=lambda p: p.create_time())
        assert os.getsid(top.pid) == top.pid != os.getsid(proc.pid)  # its own session
        argv = top.cmdline()
        port = argv[argv.index("--master-bind-port") + 1]
        assert port != "5557" and argv[argv.index("--master-port") + 1] == port
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=90)
        output = logs.read_text()
        assert code == 128 + signal.SIGTERM, output[-3000:]
        assert "Traceback" not in output and "[slo] SIGTERM: stopping everything" in output, output[-3000:]
        assert _alive({p.pid for p in tree}) == []
        state = json.loads((results / "slo.json").read_text())  # never left "running" by a gone process
        assert [c["status"] for c in state["configs"]] == ["interrupted"] and state["ended"]
        assert state["configs"][0]["error"].startswith("SIGTERM")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.vllm
def test_sigterm_of_embedded_slo_mid_probe_leaves_no_process(tmp_path: Path) -> None:
    """``tailgate slo --embedded`` owns a CPU vLLM with its engine processes and a Locust child: SIGTERM in
    the middle of a probe must go through the ``finally`` that stops them all (no Prometheus is started)."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"prompt_tokens": 16, "max_tokens": 64}) + "\n" for _ in range(6)))
    results, logs = tmp_path / "slo", tmp_path / "slo.log"
    cmd = [sys.executable, "-m", "tailgate.cli", "slo", "--embedded", "--results", str(results),
           "--slo", "ttft_p99<=60s", "--trace-file", str(trace), "--warmup", "0", "--start-rate", "1",
           "--max-rate", "1", "--max-probes", "1", "--reruns", "0", "--no-report",
           "--locust-arg=--settle=0", "--model-replicates", "0"]  # fmt: skip
    with open(logs, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)  # fmt: skip
    tree: set[int] = set()
    try:
        deadline = time.monotonic() + 480  # the CPU vLLM's start on a busy 2-core machine
        while not list(results.glob("*/records-*.jsonl")):
            assert proc.poll() is None, logs.read_text()[-3000:]
            assert time.monotonic() < deadline, logs.read_text()[-3000:]
            tree.update(p.pid for p in _descendants(proc.pid))
            time.sleep(0.5)
        tree.update(p.pid for p in _descendants(proc.pid))
        names = _cmdlines(tree)
        assert "vllm" in names and "locust" in names, names
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
        output = logs.read_text()
        assert code == 128 + signal.SIGTERM, output[-3000:]
        assert "Traceback" not in output, output[-3000:]
        assert _alive(tree) == [], _cmdlines(tree)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in _alive(tree):  # only what this test's command started
            psutil.Process(pid).kill()
