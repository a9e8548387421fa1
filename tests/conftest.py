"""Shared fixtures: real servers started by the tests themselves.

The CPU vLLM is expensive to start (about a minute on 2 cores), so one server per
configuration lives for the whole session. Tests that need it are marked ``vllm``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest


def _import_locust_unpatched() -> None:
    """Import Locust once, before any test starts a thread, without its gevent monkey-patching.

    A few tests use Locust's option parser or the run coordinator in this process. Importing Locust later,
    from inside a test, would monkey-patch a process that already runs real threads (the tests' small
    servers), and their module locks then deadlock the next import. Real Locust runs are child processes,
    which do not inherit the variable and are patched as usual."""
    os.environ["LOCUST_SKIP_MONKEY_PATCH"] = "1"
    try:
        import locust  # noqa: F401
    finally:
        del os.environ["LOCUST_SKIP_MONKEY_PATCH"]


_import_locust_unpatched()

from tailgate.load.workload import TraceItem, save_jsonl  # noqa: E402
from tailgate.servers import LocalVllmServer, ensure_tiny_model, ensure_vllm_venv  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LOCUST = [sys.executable, "-m", "locust"]


class RunningServer:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url


def vllm_python() -> Path:
    try:
        return ensure_vllm_venv(log=lambda line: print(line, file=sys.stderr))
    except Exception as e:  # surfaced as a test error, with the reason
        pytest.fail(f"the CPU vLLM is not available: {e}")


def _start(tmp_root: Path, name: str, extra: Sequence[str]) -> Iterator[LocalVllmServer]:
    python = vllm_python()
    model = ensure_tiny_model(python=python)
    # eager mode starts in ~40 s instead of ~100 s of compilation; tests assert behaviour, not speed
    server = LocalVllmServer(
        python, model, extra_args=[*extra, "--enforce-eager"], log_path=tmp_root / f"vllm-{name}.log"
    )
    server.start()
    try:
        server.wait_healthy(timeout=420)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalVllmServer | RunningServer]:
    """The default server: chunked prefill on (the engine default).

    ``TAILGATE_TEST_VLLM_URL`` reuses a server that is already up (handy while developing)."""
    url = os.environ.get("TAILGATE_TEST_VLLM_URL")
    if url:
        yield RunningServer(url.rstrip("/"))
        return
    yield from _start(tmp_path_factory.mktemp("vllm"), "default", [])


@pytest.fixture(scope="session")
def vllm_preempt_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalVllmServer]:
    """A KV pool of 24 blocks x 128 tokens: eight long generations cannot all fit, so vLLM preempts."""
    flags = ["--max-model-len", "2048", "--num-gpu-blocks-override", "24"]
    yield from _start(tmp_path_factory.mktemp("vllm-preempt"), "preempt", flags)


def write_trace(path: Path, lengths: Sequence[tuple[int, int]]) -> Path:
    save_jsonl([TraceItem(i, p, m) for i, (p, m) in enumerate(lengths)], path)
    return path


def run_locust(
    locustfile: str, host: str, results: Path, *args: str, timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess[str]:
    """A real ``locust --headless`` process, as a user would start it."""
    cmd = [*LOCUST, "-f", str(ROOT / "locustfiles" / locustfile), "--headless", "--only-summary",
           "--host", host, "--results-dir", str(results), *args]  # fmt: skip
    return subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


def load_records(results: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(results.glob("records-*.jsonl")) for line in f.read_text().splitlines()]


def load_summaries(results: Path) -> dict[str, dict]:
    return {p.stem.removeprefix("summary-"): json.loads(p.read_text()) for p in results.glob("summary-*.json")}
