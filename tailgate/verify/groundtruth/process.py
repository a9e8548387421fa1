"""The server in a child process, with a small stdlib client, for tests and benchmarks."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from tailgate.jsontypes import JsonMapping, JsonValue, as_object, json_object, json_str

from .settings import ChunkLogDump, read_chunk_log
from .wire import DEFAULT_GAP_MS, DEFAULT_MODEL, DEFAULT_TTFT_MS, json_bytes
from .workers import STOP_TIMEOUT_S

# ---------------------------------------------------------------------------------------- subprocess


class ServerProcess:
    """A ground-truth server running in a child process, with a small stdlib client for it.

    Talks to the server through ``http.client`` so that tests of another client never depend on
    that client to set up or inspect the server.
    """

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        host: str,
        port: int,
        chunk_log_path: Path,
        stderr_path: Path,
        workdir: tempfile.TemporaryDirectory[str] | None,
        workers: int = 1,
    ) -> None:
        self.proc = proc
        self.host = host
        self.port = port
        self.chunk_log_path = chunk_log_path
        self.stderr_path = stderr_path
        self._workdir = workdir
        self.workers = workers
        """Server processes on the port: above 1 the log exists only once the server stopped (:meth:`dump`)."""
        self.stop_timeout_s = STOP_TIMEOUT_S + 10.0
        """How long :meth:`stop` waits for the log to be written before it kills the server (a log of millions of
        chunks takes seconds to write; a server that ignores SIGTERM is killed after this)."""

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def request(
        self, method: str, path: str, body: JsonValue = None, timeout: float = 30.0
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            payload = None if body is None else json_bytes(body)
            headers = {"content-type": "application/json"} if payload is not None else {}
            conn.request(method, path, body=payload, headers=headers)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def control(self, changes: Mapping[str, JsonValue]) -> JsonMapping:
        """Apply a control document; raises ``ValueError`` with the server's message if refused. Returns the
        settings that result (``GET /_control``'s document)."""
        status, _, data = self.request("POST", "/_control", dict(changes))
        doc = as_object(json.loads(data), where="POST /_control")
        if status != 200:
            raise ValueError(json_str(json_object(doc, "error", {}), "message", data.decode("utf-8", "replace")))
        return doc

    def metrics(self) -> str:
        return self.request("GET", "/metrics")[2].decode("utf-8")

    def dump(self) -> ChunkLogDump:
        """The full log: live from the server, or from the file it wrote when it stopped. A server of several
        workers is stopped first: their logs are merged only then."""
        if self.proc.poll() is None and self.workers == 1:
            return read_chunk_log(self.request("GET", "/_chunklog")[2], where="GET /_chunklog")
        self.stop()
        return read_chunk_log(self.chunk_log_path.read_bytes(), where=str(self.chunk_log_path))

    def pids(self) -> list[int]:
        """The server's process and its workers (for CPU accounting)."""
        try:
            import psutil

            return [self.pid, *(c.pid for c in psutil.Process(self.pid).children(recursive=True))]
        except Exception:  # psutil missing or the process gone: the parent alone
            return [self.pid]

    def chunk_log(self) -> list[list[int]]:
        """``[seq, chunk index, write time ns]`` for every content chunk written, in write order."""
        return self.dump()["chunks"]

    def stop(self, timeout: float | None = None) -> int:
        """SIGTERM (the server writes its chunk log and exits), SIGKILL if it does not within ``timeout``
        (default :attr:`stop_timeout_s`)."""
        timeout = self.stop_timeout_s if timeout is None else timeout
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)

    def close(self) -> None:
        self.stop()
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def start_server_process(
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    ttft_ms: float = DEFAULT_TTFT_MS,
    gap_ms: float = DEFAULT_GAP_MS,
    model: str = DEFAULT_MODEL,
    accept_any_model: bool = False,
    prefix_caching: bool = False,
    script: Mapping[str, JsonValue] | str | Path | None = None,
    engine: Mapping[str, JsonValue] | None = None,
    chunk_log: str | Path | None = None,
    startup_timeout_s: float = 20.0,
    python: str = sys.executable,
    workers: int = 1,
    realtime: bool = False,
    write_delay_us: float = 0.0,
    wrap: Sequence[str] = (),
) -> ServerProcess:
    """Start ``python -m tailgate.verify.groundtruth`` and return once it listens (its port file exists).

    Files the caller does not name (port file, chunk log, stderr, script) go to a temporary folder
    that :meth:`ServerProcess.close` removes; a named ``chunk_log`` is left in place. ``workers``: server
    processes on the one port (:mod:`.workers`); ``wrap``: a command the server runs under (``ip netns exec
    NS``, a server on another host's address).
    """
    workdir = tempfile.TemporaryDirectory(prefix="groundtruth-")
    wd = Path(workdir.name)
    port_file = wd / "port"
    log_path = Path(chunk_log) if chunk_log is not None else wd / "chunklog.json"
    stderr_path = wd / "stderr.txt"
    args = [
        *wrap,
        python,
        "-m",
        "tailgate.verify.groundtruth",
        "--host",
        host,
        "--port",
        str(port),
        "--port-file",
        str(port_file),
        "--chunk-log",
        str(log_path),
        "--ttft-ms",
        str(ttft_ms),
        "--gap-ms",
        str(gap_ms),
        "--model",
        model,
    ]
    if workers > 1:
        args += ["--workers", str(workers)]
    if realtime:
        args.append("--realtime")
    if write_delay_us:
        args += ["--write-delay-us", f"{write_delay_us:g}"]
    if accept_any_model:
        args.append("--accept-any-model")
    if prefix_caching:
        args.append("--prefix-caching")
    if engine is not None:
        args += ["--engine", json.dumps(dict(engine))]
    if script is not None:
        if isinstance(script, Mapping):
            script_path = wd / "script.json"
            script_path.write_text(json.dumps(dict(script)), encoding="utf-8")
        else:
            script_path = Path(script)
        args += ["--script", str(script_path)]
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[3])  # the source tree, for a run without an install
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env)
    deadline = time.monotonic() + startup_timeout_s
    while True:
        if port_file.exists():
            text = port_file.read_text(encoding="ascii").strip()
            if text:
                return ServerProcess(proc, host, int(text), log_path, stderr_path, workdir, workers)
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            tail = stderr_path.read_text(encoding="utf-8", errors="replace")[-2000:]
            workdir.cleanup()
            raise RuntimeError(f"ground-truth server did not start (exit {proc.returncode}): {tail}")
        time.sleep(0.01)
