"""The API key reaches the server and nothing else: no results file, no output line, no report.

Every way a user can hand over the key is tried (the flag, ``TAILGATE_API_KEY``, Locust's own
``LOCUST_API_KEY``), the ground-truth server confirms it received ``Authorization: Bearer <key>``,
and then every byte the run produced is searched for it, including after the server echoed the key
back inside its error messages, which is how some gateways answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_locust, write_trace
from runkit import assert_no_traceback, check_nothing_lost

from tailgate.postprocess.report import build_report
from tailgate.verify.groundtruth import ServerProcess, start_server_process

KEY = "sk-tailgate-SECRET-1234"
FRAGMENTS = (b"SECRET-1234", KEY[:8].encode())
"""The key's distinctive end, and the shortest start of it a cut-off message could still carry."""
N = 6


@pytest.fixture
def gt() -> Iterator[ServerProcess]:
    """A server per test, so the Authorization header it reports is this test's."""
    with start_server_process(ttft_ms=20, gap_ms=10) as server:
        yield server


def files_holding_the_key(root: Path) -> list[str]:
    """Every file under ``root`` (any depth, any kind) whose bytes contain the key or its distinctive part."""
    hits = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and any(f in path.read_bytes() for f in FRAGMENTS):
            hits.append(str(path.relative_to(root)))
    return hits


def run_with_key(gt: ServerProcess, tmp_path: Path, how: str) -> tuple[Path, str]:
    trace = write_trace(tmp_path / "trace.jsonl", [(4, 5)] * N)
    out = tmp_path / "results"
    args = ["--rates", "10", "--trace-file", str(trace), "--warmup", "0", "--settle", "0"]
    env = {"TAILGATE_API_KEY": "", "LOCUST_API_KEY": ""}
    if how == "flag":
        args += ["--api-key", KEY]
    elif how == "TAILGATE_API_KEY":
        env["TAILGATE_API_KEY"] = KEY
    else:
        env["LOCUST_API_KEY"] = KEY
    done = run_locust("continuous.py", gt.base_url, out, *args, env=env, timeout=120)
    assert_no_traceback(done.stdout, done.stderr)
    return out, done.stdout + done.stderr


@pytest.mark.parametrize("how", ["flag", "TAILGATE_API_KEY", "LOCUST_API_KEY"])
def test_key_is_sent_as_a_bearer_token_and_written_nowhere(gt: ServerProcess, tmp_path: Path, how: str) -> None:
    out, output = run_with_key(gt, tmp_path, how)
    check_nothing_lost(out, N)
    seen = gt.control({})["last_authorization"]
    assert seen["/v1/completions"] == f"Bearer {KEY}"
    assert seen["/v1/models"] == f"Bearer {KEY}"  # the start-up check uses it too
    build_report(out)
    assert (out / "report" / "report.html").is_file()
    assert files_holding_the_key(out) == []
    assert not any(f.decode() in output for f in FRAGMENTS)
    assert '"api_key_set": true' in (out / "run.json").read_text()


def test_key_echoed_by_the_server_is_not_recorded(gt: ServerProcess, tmp_path: Path) -> None:
    echo = f"Incorrect API key provided: {KEY}"
    cut = "x" * 290 + f" {KEY}"  # the client keeps 300 characters of a message: the key is cut mid-way
    gt.control(
        {"faults": [{"kind": "http_500", "match": {"seq": [0, 1]}, "message": echo},
                    {"kind": "error_event", "match": {"seq": [2]}, "at_chunk": 1, "message": echo},
                    {"kind": "http_429", "match": {"seq": [3]}, "message": cut}]}
    )  # fmt: skip
    out, output = run_with_key(gt, tmp_path, "flag")
    records, by_label = check_nothing_lost(out, N)
    assert by_label["cont_r10"]["errors_by_class"] == {"http_500": 2, "server_error_event": 1, "http_429": 1}
    failed = [r for r in records if r.error_class]
    assert sum("Incorrect API key provided: <redacted>" in r.error for r in failed) == 3
    assert any(r.error.startswith("xxxx") and r.error.endswith("<redacted>") for r in failed)
    build_report(out)
    assert files_holding_the_key(out) == []
    assert not any(f.decode() in output for f in FRAGMENTS)


def test_key_is_not_echoed_by_a_usage_error(tmp_path: Path) -> None:
    done = run_locust("continuous.py", "http://127.0.0.1:1", tmp_path / "r", "--api-key", KEY, "--rates", "0")
    assert done.returncode == 2 and "tailgate: error: --rates" in done.stderr
    assert not any(f.decode() in done.stdout + done.stderr for f in FRAGMENTS)
