"""The one-command suite on the embedded default, scaled tiny: interrupt, resume, report."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--rates", "2", "--nochunk-rates", "2", "--preempt-rate", "2", "--n", "6", "--warmup", "2",
        "--batch-size", "4", "--locust-arg=--settle=0"]  # fmt: skip


def suite_cmd(results: Path) -> list[str]:
    return [sys.executable, "-m", "tailgate.cli", "suite", "--embedded", "--results", str(results), *TINY]


def leftovers(results: Path) -> list[str]:
    """What the suite started and should have stopped: its server and Prometheus ports, its Locust runs."""
    found = []
    meta = results / "suite.json"
    urls = []
    if meta.exists():
        suite = json.loads(meta.read_text())
        urls = [s.get("base_url") for s in suite.get("servers", {}).values()] + [suite.get("prometheus_url")]
    for url in filter(None, urls):
        host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
        with socket.socket() as s:
            s.settimeout(1)
            if s.connect_ex((host, int(port))) == 0:
                found.append(url)
    out = subprocess.run(["pgrep", "-af", str(results)], capture_output=True, text=True)
    found += [line for line in out.stdout.splitlines() if "pgrep" not in line]
    return found


def test_embedded_suite_interrupt_resume_report(tmp_path: Path) -> None:
    results = tmp_path / "suite"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen(
        suite_cmd(results), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    seen: list[str] = []
    deadline = time.monotonic() + 600
    assert first.stdout is not None
    for line in first.stdout:
        seen.append(line)
        if "chunked_cont_r2 done" in line:
            first.send_signal(signal.SIGINT)
            break
        assert time.monotonic() < deadline, "".join(seen[-30:])
    rest, _ = first.communicate(timeout=180)
    seen.append(rest)
    output = "".join(seen)
    assert first.returncode == 130, output[-3000:]
    assert f"add --results {results} --resume to the same command to continue" in output
    ended = json.loads((results / "suite.json").read_text())
    assert (ended["status"], ended["exit_code"], ended["end_detail"]) == ("interrupted", 130, "SIGINT")
    assert (results / "chunked_cont_r2" / "run.json").exists()
    assert not (results / "chunked_gated_b4" / "run.json").exists()
    # everything the interrupted suite started is gone
    time.sleep(2)
    assert leftovers(results) == []

    refused = subprocess.run(suite_cmd(results), cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode == 2 and "--resume" in refused.stderr  # the folder holds a suite
    second = subprocess.run(
        [*suite_cmd(results), "--resume"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=1500
    )
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-4000:]
    assert "chunked_cont_r2 already done, skipped" in out
    cells = ["chunked_cont_r2", "chunked_gated_b4", "nochunk_cont_r2", "preempt_cont_r2"]
    for cell in cells:
        meta = json.loads((results / cell / "run.json").read_text())
        assert meta["status"] == "completed"
        for key in ("run_id", "host", "model", "started", "ended", "trace", "options", "versions", "server"):
            assert meta[key] is not None, (cell, key)
        assert meta["trace"]["seed"] == 7 and meta["ignore_eos"] is True
        assert meta["server"]["version"]  # vLLM's /version
    suite = json.loads((results / "suite.json").read_text())
    assert suite["cells"] == cells
    assert (suite["status"], suite["exit_code"]) == ("completed", 0)
    assert suite["environment"]["python"] and suite["environment"]["locust"]
    for config in ("chunked", "nochunk", "preempt"):
        assert suite["servers"][config]["command"], config
    assert "--no-enable-chunked-prefill" in suite["servers"]["nochunk"]["command"]
    # the restart really turned chunked prefill off: the engine says so in its log
    log = (results / "server.log").read_text(errors="replace")
    assert "enable_chunked_prefill=False" in log and "enable_chunked_prefill=True" in log
    report = results / "report" / "report.html"
    assert report.exists() and report.stat().st_size > 10_000
    assert "report.html" in out
    time.sleep(2)
    assert leftovers(results) == []
