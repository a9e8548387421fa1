"""The compose path with a real Docker engine: the CPU stack up, driven by the suite, scraped, and down.

Every container uses host networking and listens on 127.0.0.1 (free ports from the environment), so
nothing the suite or Prometheus sends leaves loopback. The images are built by scripts/setup.sh
(scripts/compose-images.sh); where Docker cannot be installed at all these tests skip and say why, but
a CI run as root must have it and fails instead of skipping.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tailgate.servers import free_port

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parent.parent
CPU_FILE = "docker-compose.cpu.yml"
NOCHUNK_FILE = "deploy/cpu/compose.nochunk.yml"
PREEMPT_FILE = "deploy/cpu/compose.preempt.yml"
IMAGES = ("tailgate/vllm-cpu:local", "tailgate/prometheus-cpu:local")
NOCHUNK_FLAG = "--no-enable-chunked-prefill"


def _docker_ok() -> str | None:
    """None when the engine answers and the images are built, else why not."""
    if shutil.which("docker") is None:
        return "docker is not installed"
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode != 0:
        return "the Docker engine is not running"
    if subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=60).returncode != 0:
        return "the docker compose plugin is not installed"
    missing = [i for i in IMAGES if subprocess.run(["docker", "image", "inspect", i], capture_output=True,
                                                   timeout=60).returncode != 0]  # fmt: skip
    return f"images not built: {', '.join(missing)}" if missing else None


def require_docker() -> None:
    """Skip with the reason where Docker is unavailable; in CI as root setup.sh provides it, so fail."""
    why = _docker_ok()
    if why is None:
        return
    message = f"{why} (scripts/setup.sh installs Docker, starts dockerd and builds the images)"
    if os.environ.get("CI") and os.geteuid() == 0:
        pytest.fail(message)
    pytest.skip(message)


def tailgate_suite(env: dict[str, str], host: str, prom: str, results: Path, *extra: str,
                   timeout: float = 900) -> subprocess.CompletedProcess[str]:  # fmt: skip
    cmd = [
        sys.executable, "-m", "tailgate.cli", "suite", "--server", "compose", "--compose-file", CPU_FILE,
        "--nochunk-compose-file", NOCHUNK_FILE, "--preempt-compose-file", PREEMPT_FILE,
        "--configs", "chunked,nochunk", "--host", host, "--prometheus-url", prom, "--results", str(results),
        "--rates", "2", "--nochunk-rates", "2", "--preempt-rate", "none", "--no-gated",
        "--n", "6", "--warmup", "2", "--stage-warmup", "0", "--ignore-eos", "--locust-arg=--settle=0", *extra,
    ]  # fmt: skip
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def project_containers(project: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={project}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return out.stdout.split()


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(1)
    raise AssertionError(f"{what} not within {timeout:.0f} s")


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.status == 200
    except OSError:
        return False


def prom_query(prom: str, query: str) -> list[dict]:
    url = f"{prom}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())["data"]["result"]
    except (OSError, ValueError, KeyError):
        return []


@pytest.fixture
def stack_env() -> Iterator[dict[str, str]]:
    """A compose project of its own on free ports; `down` at the end whatever happened."""
    require_docker()
    project = f"tgtest{os.getpid()}x{free_port()}"
    env = {**os.environ, "COMPOSE_PROJECT_NAME": project, "PYTHONUNBUFFERED": "1",
           "VLLM_PORT": str(free_port()), "PROMETHEUS_PORT": str(free_port())}  # fmt: skip
    yield env
    subprocess.run(["docker", "compose", "-f", CPU_FILE, "--profile", "cpu", "down", "--timeout", "10"],
                   cwd=ROOT, env=env, capture_output=True, timeout=180)  # fmt: skip


@pytest.mark.vllm
def test_cpu_stack_up_suite_report_down(stack_env: dict[str, str], tmp_path: Path) -> None:
    env = stack_env
    project = env["COMPOSE_PROJECT_NAME"]
    host = f"http://127.0.0.1:{env['VLLM_PORT']}"
    prom = f"http://127.0.0.1:{env['PROMETHEUS_PORT']}"
    compose = ["docker", "compose", "-f", CPU_FILE, "--profile", "cpu"]
    up = subprocess.run([*compose, "up", "-d"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, up.stderr
    try:
        wait_for(lambda: http_ok(host + "/health"), 600, "the CPU vLLM's /health")
    except AssertionError:
        logs = subprocess.run([*compose, "logs", "--tail", "30", "vllm"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        raise AssertionError(f"the CPU vLLM never became healthy; its log:\n{logs.stdout[-4000:]}") from None
    # Prometheus scrapes the server over loopback (host networking), at the port the file was given
    wait_for(
        lambda: any(r["metric"].get("instance") == f"127.0.0.1:{env['VLLM_PORT']}" and r["value"][1] == "1"
                    for r in prom_query(prom, 'up{job="vllm"}')),
        90, "Prometheus scraping the server",
    )  # fmt: skip
    wait_for(lambda: bool(prom_query(prom, "vllm:num_requests_running")), 60, "vllm:* series in Prometheus")

    started = time.monotonic()
    done = tailgate_suite(env, host, prom, tmp_path / "suite")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    print(f"suite over compose: {time.monotonic() - started:.0f} s")
    suite = json.loads((tmp_path / "suite" / "suite.json").read_text())
    on, off = suite["servers"]["chunked"], suite["servers"]["nochunk"]
    # what ran is read from the running container, not from the files; the override re-created it
    assert on["effective_command_from"] == off["effective_command_from"] == "docker inspect"
    assert NOCHUNK_FLAG in off["effective_command"] and NOCHUNK_FLAG not in on["effective_command"]
    assert on["container"]["id"] != off["container"]["id"]
    assert on["image"] == "tailgate/vllm-cpu:local" and on["image_id"].startswith("sha256:")
    assert on["vllm_version"]
    for cell in ("chunked_cont_r2", "nochunk_cont_r2"):
        meta = json.loads((tmp_path / "suite" / cell / "run.json").read_text())
        assert meta["status"] == "completed", cell
        series = tmp_path / "suite" / cell / "prometheus-series.csv"
        assert series.exists() and len(series.read_text().splitlines()) > 2, cell
    with (tmp_path / "suite" / "report" / "table.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["preemptions_source"] == "prometheus" for r in rows), rows
    assert all(r["preemptions_prometheus"] not in ("", "nan") for r in rows), rows
    assert (tmp_path / "suite" / "report" / "report.html").exists()

    down = subprocess.run([*compose, "down", "--timeout", "10"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180)  # fmt: skip
    assert down.returncode == 0, down.stderr
    assert project_containers(project) == []
    for port in (env["VLLM_PORT"], env["PROMETHEUS_PORT"]):
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", int(port))) != 0, f"something still listens on {port}"


def _one_line_exit_2(done: subprocess.CompletedProcess[str], *words: str) -> None:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_engine_not_running_is_one_line(tmp_path: Path) -> None:
    """No engine behind DOCKER_HOST (or no docker at all): said in one line before anything starts."""
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    port = free_port()
    done = tailgate_suite(env, f"http://127.0.0.1:{port}", "http://127.0.0.1:9", tmp_path / "s", timeout=120)
    _one_line_exit_2(done, "Docker")


def test_missing_image_is_one_line(stack_env: dict[str, str], tmp_path: Path) -> None:
    env = {**stack_env, "TAILGATE_VLLM_CPU_IMAGE": "tailgate/vllm-cpu:not-built"}
    done = tailgate_suite(env, f"http://127.0.0.1:{env['VLLM_PORT']}", "http://127.0.0.1:9", tmp_path / "s",
                          timeout=120)  # fmt: skip
    _one_line_exit_2(done, "tailgate/vllm-cpu:not-built", "not on this machine")
    assert project_containers(env["COMPOSE_PROJECT_NAME"]) == []


def test_port_taken_is_one_line(stack_env: dict[str, str], tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = {**stack_env, "VLLM_PORT": str(port)}
        done = tailgate_suite(env, f"http://127.0.0.1:{port}", "http://127.0.0.1:9", tmp_path / "s", timeout=120)
    _one_line_exit_2(done, f"127.0.0.1:{port}", "taken")
    assert project_containers(env["COMPOSE_PROJECT_NAME"]) == []
