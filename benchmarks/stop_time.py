"""Seconds from a signal to nothing left running, for the embedded suite while a cell runs.

    .venv/bin/python benchmarks/stop_time.py [SIGNAL_NUMBER]    # 15 (SIGTERM) by default

Starts ``tailgate suite --embedded`` (CPU vLLM with its engine processes, Prometheus when
installed, Locust), waits until the first cell has requests in flight, sends the signal, and
prints the suite's exit code, when it exited, when the last process it started (or any process
in their process groups, which is where vLLM's EngineCore lives) was gone, and suite.json's end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent


def alive(tree: list[psutil.Process], groups: set[int]) -> list[int]:
    out = []
    for q in psutil.process_iter(["status"]):
        try:
            if q.pid == os.getpid() or q.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if q in tree or os.getpgid(q.pid) in groups:
                out.append(q.pid)
        except (psutil.Error, ProcessLookupError):
            continue
    return out


def main() -> int:
    sig = int(sys.argv[1]) if len(sys.argv) > 1 else signal.SIGTERM
    results = Path(tempfile.mkdtemp(prefix="tailgate-stop-")) / "suite"
    cmd = [sys.executable, "-m", "tailgate.cli", "suite", "--embedded", "--results", str(results), "--rates", "2",
           "--nochunk-rates", "none", "--preempt-rate", "none", "--no-gated", "--n", "30", "--warmup", "2",
           "--no-report"]  # fmt: skip
    suite = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)  # fmt: skip
    assert suite.stdout is not None
    for line in suite.stdout:
        if "cell 1/1" in line:
            break
    else:
        print("the suite ended before its first cell", file=sys.stderr)
        return 1
    time.sleep(8)  # Locust started, requests in flight
    tree = [p for p in psutil.Process(suite.pid).children(recursive=True) if p.is_running()]
    groups = {os.getpgid(p.pid) for p in tree}
    t0 = time.monotonic()
    suite.send_signal(sig)
    suite.stdout.read()
    code = suite.wait()
    exited = time.monotonic() - t0
    while alive(tree, groups) and time.monotonic() - t0 < 120:
        time.sleep(0.05)
    gone = time.monotonic() - t0
    meta = json.loads((results / "suite.json").read_text())
    print(f"{signal.Signals(sig).name}: {len(tree)} processes; suite exit {code} after {exited:.2f} s; "
          f"nothing left after {gone:.2f} s; left: {alive(tree, groups)}; suite.json: "
          f"{meta.get('status')} / {meta.get('exit_code')} / {meta.get('end_detail')}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
