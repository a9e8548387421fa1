"""The one exit-code rule (``tailgate.exitcodes``): its reading of a child's code and how endings combine.

The commands themselves are held to it where each ending is injected: a lost worker (kill -9, a partition,
SIGSTOP: ``test_distributed.py``, 4), a run that ended itself early (``--on-worker-loss stop``,
``--stop-on-errors``: 1), failed requests (``test_faults.py``: 0), each signal (``test_suite_lifecycle.py``,
``test_runner.py``, ``test_webui.py``: 128 + N), bad input (``test_bad_input.py``: 2).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tailgate import exitcodes
from tailgate.exitcodes import DONE, FAILED, INCOMPLETE, NOT_MET, USAGE, child_ending, combine, run_exit_code

# the busy pass (scripts/test.sh) runs these again: their verdicts depend on when things happen
pytestmark = pytest.mark.timing


def test_a_childs_code_is_read_one_way() -> None:
    assert child_ending(DONE).finished and child_ending(INCOMPLETE).finished
    for code in (FAILED, USAGE, 130, 143, -9):
        assert not child_ending(code).finished, code
    assert child_ending(143).signum == signal.SIGTERM and child_ending(-9).signum == signal.SIGKILL
    assert child_ending(INCOMPLETE).describe() == "locust exit 4 (incomplete)"
    assert child_ending(130).describe() == "locust exit 130 (SIGINT)"


def test_a_run_ends_with_its_most_severe_row() -> None:
    clean = {"signum": None, "failed": False, "cut_short": False, "lost": False, "stopped": False}
    assert run_exit_code(**clean) == DONE
    assert run_exit_code(**{**clean, "lost": True}) == INCOMPLETE
    assert run_exit_code(**{**clean, "stopped": True}) == INCOMPLETE
    assert run_exit_code(**{**clean, "lost": True, "cut_short": True}) == FAILED
    assert run_exit_code(**{**clean, "failed": True, "signum": signal.SIGTERM}) == 143


def test_several_endings_combine_to_the_most_severe() -> None:
    assert combine([]) == DONE
    assert combine([DONE, NOT_MET]) == NOT_MET
    assert combine([NOT_MET, INCOMPLETE, DONE]) == INCOMPLETE  # a probe that lost a process outranks the answer
    assert combine([INCOMPLETE, FAILED]) == FAILED
    assert combine([FAILED, USAGE]) == USAGE
    assert combine([USAGE, 130]) == 130


def test_every_command_uses_the_one_rule() -> None:
    """The suite's, the search's and the Locust process's constants are this module's, not copies."""
    from tailgate import lifecycle
    from tailgate.slo import spec

    assert (lifecycle.EXIT_OK, lifecycle.EXIT_ERRORS, lifecycle.EXIT_USAGE) == (DONE, FAILED, USAGE)
    assert (spec.EXIT_OK, spec.EXIT_FAILED, spec.EXIT_USAGE, spec.EXIT_NOT_MET) == (DONE, FAILED, USAGE, NOT_MET)
    assert lifecycle.Stopped(signal.SIGTERM).exit_code == exitcodes.interrupted(signal.SIGTERM) == 143


def test_a_probe_that_lost_a_load_process_makes_the_search_exit_incomplete(tmp_path: Path) -> None:
    """kill -9 of one of a probe's two load processes: the search still answers (slo.json), and exits with
    the rule's 4, as ``tailgate suite`` and Locust do for a run that lost a load process."""
    import psutil
    from conftest import ROOT, write_trace

    from tailgate.verify.groundtruth import start_server_process

    trace = write_trace(tmp_path / "trace.jsonl", [(4, 25)] * 40)  # about 1.5 s per stream at 8 req/s
    results, log = tmp_path / "r", tmp_path / "slo.log"
    with start_server_process(ttft_ms=50, gap_ms=60, accept_any_model=True) as server:
        cmd = [sys.executable, "-m", "tailgate.cli", "slo", "--server", "url", "--host", server.base_url,
               "--slo", "ttft_p99<=10s,errors<=60%", "--results", str(results), "--n", "40", "--warmup", "0",
               "--duration", "0", "--start-rate", "8", "--max-rate", "8", "--max-probes", "1", "--reruns", "0",
               "--extend", "0", "--no-report", "--processes", "2", "--trace-file", str(trace),
               "--locust-arg=--settle=0", "--locust-arg=--request-timeout=5", "--model-replicates", "0"]  # fmt: skip
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while sum(f.read_bytes().count(b"\n") for f in results.glob("*_slo_*/sent-*.log")) < 10:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.05)
            (locust,) = psutil.Process(proc.pid).children()
            locust.children()[0].send_signal(signal.SIGKILL)
            code = proc.wait(180)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert code == INCOMPLETE, (code, log.read_text()[-3000:])
    (run,) = [json.loads(p.read_text()) for p in results.glob("*_slo_*/run.json")]
    assert run["status"] == "completed" and len(run["workers_lost"]) == 1, run
    assert (results / "slo.json").exists()
