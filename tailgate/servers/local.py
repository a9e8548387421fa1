"""A CPU vLLM server in a child process group, started from the private environment with the tiny model."""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import psutil

from tailgate.jsontypes import JsonObject
from tailgate.lifecycle import deferred

from .base import HOST, ServerError
from .install import tailgate_home
from .net import free_port, http_json, is_healthy

DEFAULT_SERVED_MODEL_NAME = "tiny-llama"
DEFAULT_MAX_MODEL_LEN = 8192
DEFAULT_NICENESS = 10
"""The server's task nice value. On its own it does little: the server runs in its own session, and with
``CONFIG_SCHED_AUTOGROUP`` (on by default in most distributions) every session is its own scheduling
group, so a task's nice value only ranks it against the tasks of its own group; two groups share the
CPUs equally whatever their tasks' nice values. Niceing the server's whole autogroup
(``autogroup_nice=True``) does rank it below the load generator, but also below every other session on
the machine: on a shared, loaded machine the server then did not start within 240 s
(benchmarks/results/embedded-stall.md). What keeps the generator's timestamps free is placement
instead: the server kept off the generator's core (``AUTO_CPUS``) and the generator at ``SCHED_FIFO``
(:func:`tailgate.load.processes.set_realtime`)."""
AUTO_CPUS = "auto"
"""Default core set: every core this process may use except the lowest, which is left to the load
generator (no restriction on a one-core machine). vLLM's CPU worker pins its OpenMP threads to cores and
its engine process polls: inside this set they cannot take the core the generator timestamps on."""

#: Set for every local server: no telemetry, and no network lookups for a model that lives on disk.
SERVER_ENV: dict[str, str] = {
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
#: Defaults the caller's environment or ``env`` argument may change: 1 GiB of KV cache fits small CPUs.
SERVER_ENV_DEFAULTS: dict[str, str] = {"VLLM_CPU_KVCACHE_SPACE": "1"}

#: Flags the server owns because ``base_url`` and the served name depend on them.
_OWNED_FLAGS: frozenset[str] = frozenset({"--model", "--served-model-name", "--host", "--port"})
# --------------------------------------------------------------------------------------------- local


def vllm_server_argv(
    python: Path | str,
    model_dir: Path | str,
    port: int,
    extra_args: Sequence[str] = (),
    served_model_name: str = DEFAULT_SERVED_MODEL_NAME,
    host: str = HOST,
) -> list[str]:
    """The exact command for a local server; defaults that ``extra_args`` restate are dropped.

    Random weights (``--load-format dummy``) need no download; prefix caching is off so identical filler
    prompts cost a full prefill every time. A flag in ``extra_args`` replaces the default of the same
    name (``--max-model-len 2048``) or its opposite (``--enable-prefix-caching``), so the recorded command
    never carries two contradicting values.
    """
    extra = [str(a) for a in extra_args]
    given = {_flag_name(a) for a in extra if a.startswith("--")}
    owned = sorted(given & _OWNED_FLAGS)
    if owned:
        raise ValueError(f"{', '.join(owned)} are set by the server object, not by extra_args")
    defaults: list[list[str]] = [
        ["--load-format", "dummy"],
        ["--dtype", "bfloat16"],
        ["--max-model-len", str(DEFAULT_MAX_MODEL_LEN)],
        ["--no-enable-prefix-caching"],
    ]
    kept = [d for d in defaults if _base_flag(d[0]) not in {_base_flag(g) for g in given}]
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
    argv += ["--served-model-name", served_model_name]
    for d in kept:
        argv += d
    argv += ["--host", host, "--port", str(port)]
    return argv + extra


def _flag_name(arg: str) -> str:
    """``--max-model-len=2048`` → ``--max-model-len``."""
    return arg.split("=", 1)[0]


def _base_flag(flag: str) -> str:
    """``--no-enable-prefix-caching`` and ``--enable-prefix-caching`` name the same setting."""
    return "--" + flag[len("--no-") :] if flag.startswith("--no-") else flag


class LocalVllmServer:
    """A vLLM OpenAI server in a child process group, so stopping it takes its engine process too.

    vLLM runs its engine in a separate process; killing only the API server would leave that engine
    holding memory and CPU. The server therefore gets its own session, and :meth:`stop` signals the
    whole group and waits until no member is left.
    """

    restarts = True
    applies_flags = True
    flags_in_files = False

    def __init__(
        self,
        python: Path | str,
        model_dir: Path | str,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        log_path: Path | str | None = None,
        served_model_name: str = DEFAULT_SERVED_MODEL_NAME,
        env: Mapping[str, str] | None = None,
        niceness: int = DEFAULT_NICENESS,
        cpus: Sequence[int] | str | None = AUTO_CPUS,
        autogroup_nice: bool = False,
    ) -> None:
        self.python = Path(python)
        self.niceness = niceness
        if cpus == AUTO_CPUS:
            self.cpus: list[int] | None = server_cpus()
        else:
            self.cpus = None if cpus is None else sorted(int(c) for c in cpus)
        """Cores the server (and its OpenMP threads) may use; None: no restriction."""
        self.autogroup_nice = autogroup_nice
        self.model_dir = Path(model_dir)
        self.port = port if port is not None else free_port()
        self.served_model_name = served_model_name
        self.env_overrides: dict[str, str] = dict(env or {})
        self.log_path = Path(log_path) if log_path is not None else tailgate_home() / "logs" / f"vllm-{self.port}.log"
        self._extra_args: list[str] = [str(a) for a in extra_args]
        vllm_server_argv(self.python, self.model_dir, self.port, self._extra_args)  # reject bad flags now
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        self._started_at: float | None = None
        self.startup_seconds: float | None = None

    # -- facts

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://{HOST}:{self.port}"

    @property
    def extra_args(self) -> list[str]:
        """The vLLM flags of the current (or next) start."""
        return list(self._extra_args)

    @property
    def command(self) -> list[str]:
        """The exact argv of the current (or next) start, for run metadata."""
        return vllm_server_argv(self.python, self.model_dir, self.port, self._extra_args, self.served_model_name)

    @property
    def pid(self) -> int | None:
        """The API server's pid (also its process-group id), or None before the first start."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """True while the API server process is alive (it may not be healthy yet)."""
        return self._proc is not None and self._proc.poll() is None

    def environment(self) -> dict[str, str]:
        """The full environment the server starts with."""
        env = dict(os.environ)
        env.update(SERVER_ENV)
        for key, value in SERVER_ENV_DEFAULTS.items():
            env.setdefault(key, value)
        if self.cpus:
            # vLLM's auto binding would pick cores itself (from the whole machine); bind its OpenMP threads to
            # exactly the server's set instead. An explicit setting from the caller wins.
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(str(c) for c in self.cpus))
        env.update(self.env_overrides)
        return env

    def describe(self) -> JsonObject:
        """Command, vLLM-relevant environment, and the version the server reports when it is up."""
        env = self.environment()
        keys = set(SERVER_ENV) | set(SERVER_ENV_DEFAULTS) | set(self.env_overrides)
        keys |= {k for k in env if k.startswith("VLLM_")}
        version = http_json(self.base_url + "/version", timeout=2.0) if self.running else None
        return {
            "kind": "local-vllm",
            "base_url": self.base_url,
            "command": self.command,
            "niceness": self.niceness,
            "autogroup_nice": self.autogroup_nice,
            "cpus": self.cpus,
            "extra_args": self.extra_args,
            "served_model_name": self.served_model_name,
            "model_dir": str(self.model_dir),
            "env": {k: env[k] for k in sorted(keys)},
            "vllm_version": version.get("version") if isinstance(version, dict) else None,
            "log_path": str(self.log_path),
            "startup_seconds": self.startup_seconds,
        }

    # -- lifecycle

    def start(self, extra_args: Sequence[str] | None = None) -> None:
        """Launch the server (without waiting for it); ``extra_args`` replaces the previous flags."""
        if self.running:
            raise ServerError(f"server on port {self.port} is already running (pid {self.pid})")
        if extra_args is not None:
            vllm_server_argv(self.python, self.model_dir, self.port, extra_args)
            self._extra_args = [str(a) for a in extra_args]
        argv = self.command
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Append, so a restart keeps the previous run's log; the offset marks where this start begins.
        with self.log_path.open("ab") as log:
            self._log_offset = log.tell()
            log.write(f"==== tailgate: starting {shlex.join(argv)}\n".encode())
            log.flush()
            # signals held back until the handle is stored: a Ctrl-C here must not orphan the server
            with deferred():
                self._proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.environment(),
                    start_new_session=True,
                    preexec_fn=self._place if self.niceness or self.cpus else None,
                )
        self._started_at = time.monotonic()
        self.startup_seconds = None
        atexit.register(self.stop)

    def _place(self) -> None:
        """In the child, after ``setsid``: lower its priority (task and autogroup) and restrict its cores."""
        if self.niceness:
            os.nice(self.niceness)
            if self.autogroup_nice:
                # no autogroups (kernel option off): the task nice is enough
                with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as f:
                    f.write(str(self.niceness))
        if self.cpus:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, self.cpus)

    def wait_healthy(self, timeout: float = 240.0, interval: float = 0.5) -> float:
        """Poll ``/health`` until 200 and return seconds since start; fail fast if the process exits."""
        if self._proc is None:
            raise ServerError("server was never started")
        deadline = time.monotonic() + timeout
        while True:
            code = self._proc.poll()
            if code is not None:
                raise ServerError(
                    f"vLLM server exited with code {code} before becoming healthy; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if is_healthy(self.base_url, timeout=min(2.0, timeout)):
                started = self._started_at if self._started_at is not None else time.monotonic()
                self.startup_seconds = round(time.monotonic() - started, 2)
                return self.startup_seconds
            if time.monotonic() >= deadline:
                raise ServerError(
                    f"vLLM server on {self.base_url} not healthy after {timeout:.0f} s; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(interval)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the process group, SIGKILL whatever is left after ``timeout``; safe to repeat."""
        proc = self._proc
        if proc is None:
            return
        pgid = proc.pid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if proc.poll() is None or _group_alive(pgid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            proc.wait()
            kill_deadline = time.monotonic() + 10.0
            while _group_alive(pgid) and time.monotonic() < kill_deadline:
                time.sleep(0.1)
        atexit.unregister(self.stop)

    def use_config(self, config: str) -> None:
        """One command for every configuration: the name changes nothing."""

    def restart(self, extra_args: Sequence[str] | None = None) -> None:
        """Stop, then start with new flags (None keeps the current ones); does not wait for health."""
        self.stop()
        self.start(extra_args)

    def __enter__(self) -> LocalVllmServer:
        """Start (if not running) and wait until healthy, so the ``with`` body can send requests."""
        if not self.running:
            self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- logs

    def log_text(self, current_only: bool = True) -> str:
        """The server log; by default only what the current (or last) start wrote."""
        try:
            with self.log_path.open("rb") as fh:
                if current_only:
                    fh.seek(self._log_offset)
                return fh.read().decode(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the current start's log, for error messages."""
        return "\n".join(self.log_text().splitlines()[-lines:])

    def __repr__(self) -> str:
        return f"LocalVllmServer(port={self.port}, pid={self.pid}, extra_args={self._extra_args!r})"


def server_cpus(available: Sequence[int] | None = None) -> list[int] | None:
    """Every usable core but the lowest (see ``AUTO_CPUS``); None when there is only one."""
    cpus = sorted(available if available is not None else os.sched_getaffinity(0))
    return cpus[1:] if len(cpus) >= 2 else None


def group_members(pgid: int) -> list[int]:
    """Pids of live (non-zombie) processes in a process group.

    Engine processes orphaned by a killed API server are reparented; if nothing reaps them they linger as
    zombies, which ``killpg(pgid, 0)`` would still count as members. Tests use this to prove that nothing
    was left running.
    """
    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                continue
            if os.getpgid(proc.pid) == pgid:
                members.append(proc.pid)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return members


def _group_alive(pgid: int) -> bool:
    """True while a live process remains in the group."""
    return bool(group_members(pgid))
