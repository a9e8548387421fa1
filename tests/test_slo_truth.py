"""The SLO decision rules against a server whose answer is known, and the search's exits end to end.

The simulated engine's true p99 at a rate follows from its model (a long simulation), so a verdict can
be held to the truth: a limit the true p99 exceeds must never pass, one well above it must pass at
enough n, and too few requests must say so. The probes are in-process simulations (fast); the exits
run the real command against the ground-truth server.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tailgate import slo
from tailgate.load.workload import make_trace
from tailgate.stats import measured_records
from tailgate.verify.groundtruth import start_server_process
from tailgate.verify.groundtruth.engine import EngineModel, poisson_arrivals, simulate, true_quantiles

ROOT = Path(__file__).resolve().parents[1]
MODEL = EngineModel(slots=32, step_ms=4.0, step_ms_per_seq=0.1, prefill_ms_per_token=0.01)
RATE = 8.0


def _lengths(count: int, seed: int) -> list[tuple[int, int]]:
    return [(t.prompt_tokens, t.max_tokens) for t in make_trace(count, seed)]


@pytest.fixture(scope="module")
def true_ttft_p99() -> float:
    return true_quantiles(MODEL, RATE, _lengths(6000, 99))["ttft"]


def _probe(n: int, seed: int) -> slo.ProbeAttempt:
    outs = simulate(MODEL, poisson_arrivals(RATE, _lengths(n + 25, seed), seed + 1))
    lengths = _lengths(n + 25, seed)
    recs = [o.record(i, p, mx, rate=RATE) for i, (o, (p, mx)) in enumerate(zip(outs, lengths, strict=True))]
    return slo.ProbeAttempt(measured_records(recs, 25), sent=len(recs), errors=0)


def test_true_p99_just_over_the_limit_never_passes(true_ttft_p99: float) -> None:
    limits = slo.parse_slo(f"ttft_p99<={true_ttft_p99 * 0.95:.3f}ms")
    verdicts = [slo.check_probe([_probe(1500, seed)], limits, rate=RATE)[0] for seed in (1, 2, 3, 4)]
    assert "pass" not in verdicts, verdicts


def test_well_under_the_limit_passes_at_enough_n(true_ttft_p99: float) -> None:
    limits = slo.parse_slo(f"ttft_p99<={true_ttft_p99 * 2:.3f}ms")
    verdict, checks = slo.check_probe([_probe(2000, 11)], limits, rate=RATE)
    assert verdict == "pass", checks
    assert checks[0].high is not None and checks[0].high <= true_ttft_p99 * 2


def test_small_n_is_not_enough_data(true_ttft_p99: float) -> None:
    limits = slo.parse_slo(f"ttft_p99<={true_ttft_p99 * 2:.3f}ms")
    verdict, checks = slo.check_probe([_probe(150, 11)], limits, rate=RATE)
    assert verdict == "not_enough_data" and checks[0].high is None and "449" in checks[0].reason


# ------------------------------------------------------------------------------------------- exits


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _slo(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tailgate.cli", "slo", *args, "--model-replicates", "0"], cwd=ROOT,
                          capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def test_unreachable_server_exits_2_before_any_probe(tmp_path: Path) -> None:
    done = _slo("--server", "url", "--host", f"http://127.0.0.1:{_free_port()}", "--slo", "ttft_p99<=1s",
                "--results", str(tmp_path / "r"), timeout=60)  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--host" in lines[0] and "does not answer" in lines[0]
    assert not (tmp_path / "r").exists()  # nothing left behind by a search that never started


def test_errors_that_bind_exit_1_and_resume_refuses_another_plan(tmp_path: Path) -> None:
    results = tmp_path / "r"
    with start_server_process(accept_any_model=True) as server:
        server.control({"faults": [{"match": {"all": True}, "kind": "http_500"}]})
        common = ["--server", "url", "--host", server.base_url, "--slo", "ttft_p99<=1s", "--results", str(results),
                  "--n", "20", "--warmup", "0", "--duration", "0", "--start-rate", "20", "--max-rate", "20",
                  "--max-probes", "1", "--reruns", "0", "--no-report", "--locust-arg=--settle=0",
                  "--stage-warmup", "0"]  # fmt: skip
        done = _slo(*common)
        out = done.stdout + done.stderr
        assert done.returncode == 1, out[-3000:]
        assert "Traceback" not in out
        bind = [line for line in done.stdout.splitlines() if "errors bind" in line]
        assert len(bind) == 1 and re.search(r"\((\d+) of \1 requests", bind[0]), out[-3000:]
        state = json.loads((results / "slo.json").read_text())
        assert state["configs"][0]["status"] == "done" and state["configs"][0]["result"]["binding"] == "errors"
        again = _slo(*[("8" if a == "7" else a) for a in common], "--seed", "8")
    assert again.returncode == 2 and "another plan" in again.stderr and "seed" in again.stderr, again.stderr


def test_queue_stop_fires_relative_to_the_probe(tmp_path: Path) -> None:
    """One slot and a rate far above it: the waiting queue passes a quarter of the probe's requests and the
    probe stops early (read from the server's own gauge), failing with the reason recorded."""
    results = tmp_path / "r"
    engine = {"slots": 1, "step_ms": 40.0, "step_ms_per_seq": 0.0, "prefill_ms_per_token": 0.0}
    with start_server_process(accept_any_model=True, engine=engine) as server:
        done = _slo("--server", "url", "--host", server.base_url, "--slo", "ttft_p99<=1s", "--results", str(results),
                    "--n", "60", "--warmup", "0", "--duration", "0", "--start-rate", "40", "--max-rate", "40",
                    "--max-probes", "1", "--reruns", "0", "--no-report", "--locust-arg=--settle=0",
                    "--stage-warmup", "0")  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 3 and "Traceback" not in out, out[-3000:]
    attempt = json.loads((results / "slo.json").read_text())["configs"][0]["probes"][0]["attempts"][0]
    assert attempt["stopped_early"] and "waiting queue reached" in attempt["stopped_early"], attempt
    assert "stop at 15" in attempt["stopped_early"] and attempt["errors"] == 0  # the cancelled are not errors
    assert "errors bind" not in out and "binding limit at the upper end: sustained" in out, out


def test_stage_warmup_runs_at_the_top_rate_and_is_no_cell(tmp_path: Path) -> None:
    """The real command against the ground-truth server: warm-up rounds at --max-rate go under stage-warmup/,
    are recorded in slo.json, and the report's run finder does not see them as cells."""
    from tailgate.postprocess.runfolders import find_run_dirs

    results = tmp_path / "r"
    with start_server_process(accept_any_model=True) as server:
        done = _slo("--server", "url", "--host", server.base_url, "--slo", "ttft_p99<=5s", "--results", str(results),
                    "--n", "20", "--warmup", "0", "--duration", "0", "--start-rate", "10", "--max-rate", "10",
                    "--max-probes", "1", "--no-report", "--locust-arg=--settle=0", "--stage-warmup", "15")  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode in (0, 3, 5) and "Traceback" not in out, out[-3000:]
    config = json.loads((results / "slo.json").read_text())["configs"][0]
    rounds = config["stage_warmup"]["rounds"]
    assert 2 <= len(rounds) <= 3 and all(r["rate"] == 10 for r in rounds), rounds
    assert all((results / r["dir"]).is_dir() and r["dir"].startswith("stage-warmup/") for r in rounds)
    assert "stage warm-up round 1: 15 requests at 10 req/s" in out
    assert [r.name for r in find_run_dirs(results)] == [a["dir"] for p in config["probes"] for a in p["attempts"]]
