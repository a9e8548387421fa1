"""The processes a run starts beside the load, and what it asks the server about itself.

The ``/metrics`` sampler and the report build run as their own processes, at ordinary priority: the
load process stamps chunks in one event loop, and neither an HTTP scrape nor pandas may hold it. Both
are started here and told apart from the coordinator (:mod:`tailgate.load.session`), which only keeps
their handles.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from tailgate.jsontypes import JsonObject
from tailgate.load.options import Settings
from tailgate.resultfiles import REPORT_LOG, SERVER_METRICS, report_html

log = logging.getLogger("tailgate")

REPORT_INTERRUPTED = "interrupted"
"""First word of the last line of report.log when the build was cut short by the process quitting."""


def start_sampler(s: Settings, folder: Path) -> subprocess.Popen[bytes] | None:
    """The direct ``/metrics`` sampler of a run, or None when none is asked for or Prometheus already scrapes."""
    if not s.metrics_url or not s.sample_metrics:
        return None
    if s.prometheus_url and _answers(s.prometheus_url + "/-/ready"):
        # a Prometheus already scrapes the server; every extra read of /metrics costs the server
        # a few milliseconds of streaming (measured on vLLM 0.24: results/h200/README.md). A
        # Prometheus that is down at the start gets the direct samples as its fallback.
        log.info("tailgate: Prometheus at %s is up: no direct /metrics sampling", s.prometheus_url)
        return None
    cmd = [sys.executable, "-m", "tailgate.load.metrics", "--url", s.metrics_url,
           "--out", str(folder / SERVER_METRICS), "--interval", str(s.sample_metrics)]  # fmt: skip
    return subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=_ordinary_priority,
    )  # fmt: skip


def stop_helper(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM, then SIGKILL after 5 s."""
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def launch_report(folder: Path) -> subprocess.Popen[bytes]:
    """``python -m tailgate.postprocess FOLDER`` at a lower priority, its output in ``report.log``."""
    with open(folder / REPORT_LOG, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tailgate.postprocess", str(folder)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            preexec_fn=lambda: os.nice(10),  # the build yields the CPU to the load path
        )  # fmt: skip


def report_log_tail(folder: Path) -> str:
    try:
        lines = (folder / REPORT_LOG).read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


def report_state(report: subprocess.Popen[bytes] | None, folder: Path) -> str:
    """``none`` (not asked for), ``building``, ``ready``, ``failed`` or ``interrupted`` (the process quit while
    it built)."""
    if report is None:
        if report_html(folder).exists():
            return "ready"
        return "interrupted" if report_log_tail(folder).startswith(REPORT_INTERRUPTED) else "none"
    code = report.poll()
    if code is None:
        return "building"
    return "ready" if code == 0 and report_html(folder).exists() else "failed"


def report_error(report: subprocess.Popen[bytes] | None, folder: Path) -> str | None:
    """The last line the failed report build wrote (None unless it failed)."""
    if report_state(report, folder) != "failed":
        return None
    try:
        lines = (folder / REPORT_LOG).read_text(errors="replace").strip().splitlines()
    except OSError:
        return "the report process failed"
    return lines[-1][:300] if lines else "the report process failed"


def _answers(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            ok: bool = resp.status == 200
            return ok
    except Exception:
        return False


def _ordinary_priority() -> None:
    """A helper process does not inherit the load generator's ``SCHED_FIFO`` (``--realtime``)."""
    try:
        if os.sched_getscheduler(0) != os.SCHED_OTHER:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except (OSError, AttributeError):
        pass


def server_info(s: Settings) -> JsonObject:
    """What the server says about itself (``/version``, served models); absent fields stay None."""
    import urllib.request

    info: JsonObject = {"version": None, "models": None}
    headers = {"Authorization": f"Bearer {s.api_key}"} if s.api_key else {}
    for key, path in (("version", "/version"), ("models", "/v1/models")):
        try:
            req = urllib.request.Request(s.target.url(path), headers=headers)
            with urllib.request.urlopen(req, timeout=5) as resp:
                body = json.loads(resp.read())
            info[key] = body.get("version") if key == "version" else [m.get("id") for m in body.get("data", [])]
        except Exception:
            pass
    return info
