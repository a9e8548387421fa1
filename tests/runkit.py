"""Helpers for tests that run Locust against a misbehaving server and then audit what it wrote.

The audit is the contract every fault must keep: one record per request sent (the sent journal
is the independent witness), nothing dropped, and stage summaries whose error counts are exactly
the error records.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import LOCUST, ROOT

from tailgate.records import RequestRecord, lost_in_flight, read_records, read_sent


@dataclass
class LocustProcess:
    """A ``locust --headless`` started in the background, its output captured to files."""

    proc: subprocess.Popen[bytes]
    stdout_path: Path
    stderr_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self, timeout: float = 180) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


def start_locust(
    locustfile: str, host: str, results: Path, logs: Path, *args: str, env: dict[str, str] | None = None
) -> LocustProcess:
    """Like ``conftest.run_locust`` but returns at once, so a test can break things while it runs."""
    logs.mkdir(parents=True, exist_ok=True)
    cmd = [*LOCUST, "-f", str(ROOT / "locustfiles" / locustfile), "--headless", "--only-summary",
           "--host", host, "--results-dir", str(results), *args]  # fmt: skip
    out, err = logs / "locust.stdout", logs / "locust.stderr"
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=o, stderr=e, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})}
        )
    return LocustProcess(proc, out, err)


def count_lines(directory: Path, pattern: str) -> int:
    total = 0
    for path in directory.glob(pattern):
        try:
            total += path.read_bytes().count(b"\n")
        except OSError:
            pass
    return total


def wait_until(condition: Callable[[], bool], timeout: float, what: str, proc: LocustProcess | None = None) -> None:
    """Poll ``condition``; fail with ``what`` (and the load generator's stderr) if it never holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.proc.poll() is not None:
            raise AssertionError(f"locust exited ({proc.proc.returncode}) before {what}:\n{proc.stderr[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def summaries(results: Path) -> dict[str, dict[str, Any]]:
    return {p.stem.removeprefix("summary-"): json.loads(p.read_text()) for p in results.glob("summary-*.json")}


def assert_no_traceback(*texts: str) -> None:
    for text in texts:
        assert "Traceback" not in text, text[-3000:]
        assert "tailgate run failed" not in text, text[-3000:]


def check_nothing_lost(results: Path, planned: int) -> tuple[list[RequestRecord], dict[str, dict[str, Any]]]:
    """The accounting every completed fault run must satisfy; returns the records and summaries.

    records == requests journaled as sent == planned, each (stage, trace id) exactly once, no
    unreadable line, no arrival dropped, and each summary's errors are exactly its error records.
    """
    scan = read_records(results)
    assert scan.partial_lines == 0
    records = scan.records
    keys = [(r.stage, r.trace_id) for r in records]
    assert len(keys) == len(set(keys)), "a request has two records"
    sent = read_sent(results)
    assert set(keys) == sent, (
        f"sent but not recorded: {sorted(sent - set(keys))}; recorded, not sent: {sorted(set(keys) - sent)}"
    )
    assert len(records) == len(sent) == planned
    assert lost_in_flight(results).lost == 0
    by_label = summaries(results)
    assert by_label, "no stage summary was written"
    assert sum(s["planned"] for s in by_label.values()) == planned
    for label, s in by_label.items():
        stage = [r for r in records if r.stage_label == label]
        assert s["dropped_arrivals"] == 0
        assert len(stage) == s["sent"] == s["planned"], label
        failed = [r for r in stage if r.error_class is not None]
        assert s["errors"] == len(failed), label
        assert s["errors_by_class"] == dict(Counter(r.error_class for r in failed)), label
        assert all(r.error for r in failed), "an error record without a message"
    return records, by_label


def classes(records: Sequence[dict[str, Any]]) -> dict[str | None, int]:
    return dict(Counter(r.error_class for r in records))


def _locust_children(parent: int) -> list[int]:
    """Descendants of ``parent`` whose command line runs Locust (not the ground-truth server)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"locust" in cmd:
            found.append(int(proc.name))
    return found


def _streams_open(pid: int) -> int:
    """Established TCP connections held by process ``pid``: its streams in flight (a fresh connection per
    request, closed when the stream ends).

    What a stall of the stamps needs is streams mid-gap at the moment it lands, and the connections say so
    directly; the files do not (records land late on a starved machine and, with capture stamps, after the
    stream's segments are joined; sends go out in a burst after a starved start)."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return 0
    established = 0
    for table in ("tcp", "tcp6"):
        try:
            rows = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "01" and fields[9] in inodes:
                established += 1
    return established


def stall_locust_mid_stage(keep: Path, extra: list[str]) -> tuple[str, int]:
    """Run ``tailgate selfcheck`` (20 req/s, 60 streams of 40 chunks) and stop its Locust process (SIGSTOP)
    for 300 ms while at least six of its streams are open; the output and exit code."""
    cmd = [sys.executable, "-m", "tailgate.verify.selfcheck", "--rate", "20", "--n", "60", "--tokens", "40",
           "--gap-ms", "10", "--keep", str(keep), *extra]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stalled = False
    try:
        while proc.poll() is None and not stalled:
            for pid in _locust_children(proc.pid):
                if _streams_open(pid) >= 6:
                    os.kill(pid, signal.SIGSTOP)
                    time.sleep(0.3)
                    os.kill(pid, signal.SIGCONT)
                    stalled = True
            time.sleep(0.02)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert stalled, "the Locust process ended before it could be stalled"
    return out + err[-2000:], proc.returncode


class RecordingController:
    """A server controller that restarts nothing and remembers every restart's flags: what the server session and
    the SLO runner are given in tests that fake the server."""

    base_url = "http://127.0.0.1:9"
    restarts = True
    applies_flags = True
    flags_in_files = False

    def __init__(self) -> None:
        self.restarted: list[list[str]] = []
        self.config: str | None = None

    def use_config(self, config: str) -> None:
        self.config = config

    def restart(self, flags: Any) -> None:
        self.restarted.append(list(flags))

    def wait_healthy(self) -> float:
        return 0.0

    def describe(self) -> dict[str, Any]:
        return {"command": ["vllm", *self.restarted[-1]]}

    def stop(self) -> None:
        pass
