"""A local Prometheus, from the OS package, scraping one server every second.

Used by the embedded suite and by the tests: a real Prometheus gives the same preemption
deltas and time series the GPU deployment gets from ``docker-compose.yml``, where the
``deploy/prometheus/prometheus.yml`` config plays this role.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from tailgate.lifecycle import deferred
from tailgate.servers import free_port

CONFIG = """\
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: vllm
    metrics_path: /metrics
    static_configs:
      - targets: ['{target}']
"""


class PrometheusError(RuntimeError):
    pass


def find_prometheus() -> str | None:
    """The ``prometheus`` binary on PATH (Debian installs it in /usr/bin), or None."""
    return shutil.which("prometheus")


class LocalPrometheus:
    """``prometheus`` with its own config and TSDB in a folder, on a loopback port."""

    def __init__(self, scrape_url: str, directory: Path, port: int | None = None, binary: str | None = None) -> None:
        parts = urlsplit(scrape_url)
        self.target = f"{parts.hostname}:{parts.port or 80}"
        self.directory = Path(directory)
        self.port = port or free_port()
        self.binary = binary or find_prometheus()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> None:
        if not self.binary:
            raise PrometheusError("no prometheus binary on PATH (Debian: apt-get install prometheus)")
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "prometheus.yml"
        config.write_text(CONFIG.format(target=self.target), encoding="utf-8")
        log = open(self.directory / "prometheus.log", "ab")
        with deferred():  # no Prometheus without a handle to stop it by
            self._proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.directory / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=2d",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                raise PrometheusError(f"prometheus exited with {code}; see {self.directory}/prometheus.log")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise PrometheusError(f"prometheus not ready after {timeout:.0f} s")

    def wait_for_target(self, timeout: float = 30.0) -> None:
        """Block until the first successful scrape, so a stage window never starts before the data."""
        import json

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/api/v1/query?query=up", timeout=2) as resp:
                    result = json.loads(resp.read())["data"]["result"]
                if any(r["value"][1] == "1" for r in result):
                    return
            except (OSError, KeyError, ValueError):
                pass
            time.sleep(0.5)
        raise PrometheusError(f"prometheus never scraped {self.target} within {timeout:.0f} s")

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def __enter__(self) -> LocalPrometheus:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
