"""``tailgate serve``: the CPU vLLM on a loopback port until Ctrl-C, and Locust run against it by hand, as the
README's "Using Locust directly" shows."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import LOCUST, ROOT, write_trace

SERVE = [sys.executable, "-m", "tailgate.cli", "serve"]


def test_a_taken_port_is_one_line_before_any_start(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        done = subprocess.run([*SERVE, "--port", str(port)], cwd=tmp_path, capture_output=True, text=True,
                              timeout=60)  # fmt: skip
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    (line,) = done.stderr.splitlines()
    assert line.startswith("tailgate serve: error: --port:") and str(port) in line, line


def test_flags_the_command_owns_are_refused(tmp_path: Path) -> None:
    done = subprocess.run([*SERVE, "--port", "0", "--flags=--port 9"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    (line,) = done.stderr.splitlines()
    assert "--flags:" in line and "--port" in line, line


@pytest.mark.vllm
def test_serve_then_locust_then_ctrl_c(tmp_path: Path) -> None:
    out = tmp_path / "serve.out"
    with open(out, "wb") as o:
        serve = subprocess.Popen([*SERVE, "--port", "0"], cwd=ROOT, stdout=o, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 400
        url = None
        while url is None:
            found = re.search(r"serves \S+ \(dummy weights\) on (http://127\.0\.0\.1:\d+)", out.read_text())
            url = found.group(1) if found else None
            assert serve.poll() is None, out.read_text()[-3000:]
            assert time.monotonic() < deadline, out.read_text()[-3000:]
            time.sleep(0.5)
        with urllib.request.urlopen(url + "/v1/models", timeout=10) as resp:
            assert json.loads(resp.read())["data"][0]["id"] == "tiny-llama"
        # the README's next step: Locust by hand, --ignore-eos for the dummy weights
        trace = write_trace(tmp_path / "trace.jsonl", [(32, 16)] * 3)
        results = tmp_path / "results"
        done = subprocess.run([*LOCUST, "-f", "locustfiles/continuous.py", "--headless", "--only-summary", "--host",
                               url, "--ignore-eos", "--rates", "2", "--trace-file", str(trace), "--warmup", "0",
                               "--results-dir", str(results)], cwd=ROOT, capture_output=True, text=True,
                              timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        summary = json.loads((results / "summary-cont_r2.json").read_text())
        assert summary["errors"] == 0 and summary["n"] == 3, summary
        records = [json.loads(line) for f in results.glob("records-*.jsonl") for line in f.read_text().splitlines()]
        assert [r["completion_tokens"] for r in records] == [16, 16, 16]  # every planned token: ignore_eos
        serve.send_signal(signal.SIGINT)
        code = serve.wait(60)
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
    assert code == 128 + signal.SIGINT, out.read_text()[-3000:]
    assert "SIGINT: stopping the server" in out.read_text()
    port = int(url.rsplit(":", 1)[1])
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("127.0.0.1", port))  # nothing of the server listens any more
