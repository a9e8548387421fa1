"""One Locust child against one configured server: the single way ``suite``, ``slo`` and ``selfcheck`` run load.

Running a load generator as a child looks simple and goes wrong in the same places every time: a
Ctrl-C in the terminal reaching Locust twice, a signal between ``Popen`` and the assignment of its
handle, Locust's fixed master port shared by two runs on one host, ``--processes`` children left
behind when only the parent is stopped, the records of an interrupted attempt mixed into the next,
and metadata claiming flags were applied to a server nobody restarted. This module settles each once:

- :class:`LocustRun` is the command line (every arm, every option the callers pass, a free master
  port always);
- :class:`ChildRunner` starts it in its own session under :func:`~tailgate.lifecycle.deferred`, keeps
  the tail of its output, polls an early-stop watch, and stops the whole process tree;
- :func:`prepare_results` keeps an interrupted attempt's folder aside;
- :func:`prepare_server` is the one server step: it restarts (or asks for, or only checks) the
  server as the controller's declared capabilities say, and returns what is true to record;
- :func:`signal_guard` makes SIGINT, SIGTERM and SIGHUP of the command raise, so every way out runs
  the ``finally`` that stops the child and the server.

Standard library and psutil only: no gevent, Locust or pandas is imported here.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import tailgate.locustfiles as locustfiles
from tailgate.jsontypes import JsonObject
from tailgate.lifecycle import SignalGuard, deferred, signals_raise, stop_process_tree
from tailgate.load.processes import master_port_args
from tailgate.optiondecl import to_flags
from tailgate.servers.base import ServerController

Log = Callable[[str], None]

LOCUSTFILES = Path(locustfiles.__file__).parent
"""Where the arms' locustfiles live (``continuous.py``, ``gated.py``)."""

POLL_S = 0.05
"""How often the child is checked for its end: short, so a run's wall time is not padded."""
WATCH_S = 0.5
"""How often the early-stop watch reads the run's files."""


@dataclass(frozen=True)
class LocustRun:
    """One headless Locust run as a command line: the arm's locustfile, its stage, and the common options."""

    arm: str
    """``continuous`` or ``gated``: the locustfile."""
    host: str
    results: Path
    stage: tuple[str, ...]
    """``("--rates", "8")`` or ``("--batch-size", "16")``."""
    n: int
    warmup: int
    seed: int
    config_label: str | None = None
    processes: int = 1
    ignore_eos: bool = False
    prometheus_url: str | None = None
    realtime: bool = False
    chunk_stamp: str | None = None
    """``--chunk-stamp`` for the run; None leaves Locust's default ($TAILGATE_CHUNK_STAMP, else kernel)."""
    extra: tuple[str, ...] = ()
    """Passed through last (e.g. ``--trace-file``, ``--settle``), so a caller's choice wins."""

    @property
    def locustfile(self) -> Path:
        return LOCUSTFILES / f"{self.arm}.py"

    def command(self, master_port: int | None = None) -> list[str]:
        cmd = [sys.executable, "-m", "locust", "-f", str(self.locustfile), "--headless", "--only-summary",
               "--host", self.host]  # fmt: skip
        cmd += to_flags({"results_dir": str(self.results), "config_label": self.config_label,
                         "n": self.n, "warmup": self.warmup, "seed": self.seed})  # fmt: skip
        cmd += self.stage
        # the commands' --processes is handed on as Locust's own option of that name
        processes = self.processes if self.processes > 1 else None
        cmd += to_flags({"ignore_eos": self.ignore_eos, "prometheus_url": self.prometheus_url, "processes": processes})
        # always a free master port: Locust's default (5557) makes two runs on one host cross-connect,
        # and a caller's --processes may arrive through ``extra``
        cmd += master_port_args(master_port)
        cmd += to_flags({"realtime": self.realtime, "chunk_stamp": self.chunk_stamp})
        return cmd + list(self.extra)


def prepare_results(out: Path, aside_root: Path | None) -> None:
    """An existing folder is an interrupted attempt: keep it under ``aside_root/.incomplete`` (or remove it
    when ``aside_root`` is None), so its records are never mixed into the new run's."""
    if not out.exists():
        return
    if aside_root is None:
        shutil.rmtree(out)
        return
    aside = aside_root / ".incomplete" / f"{out.name}-{int(time.time())}"
    aside.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(out), str(aside))


@dataclass
class ChildResult:
    exit_code: int
    seconds: float
    stopped_early: str | None
    """Why the watch stopped the run (None: it ran to its end)."""
    tail: list[str]
    """The last lines of its output, for an error message."""
    rusage: Any = None
    """``resource.struct_rusage`` of the child and the children it waited for (CPU seconds)."""
    killed: list[int] = field(default_factory=list)
    """Pids that needed SIGKILL when it was stopped."""


class ChildRunner:
    """Runs one Locust child at a time and is the only holder of its handle, so any way out can stop it.

    The child gets its own session: a Ctrl-C in the terminal reaches the caller alone, which stops
    Locust exactly once (:meth:`stop`, SIGINT first so in-flight requests are written as cancelled
    records, then the whole tree). ``deferred()`` makes sure no child exists without ``self.child``
    naming it.
    """

    def __init__(
        self, log: Log = print, env: dict[str, str] | None = None, tail_lines: int = 40, tag: str = "    "
    ) -> None:
        self.log = log
        self.tag = tag
        self.env = dict(env or {})
        """Added to the child's environment: the only way a secret (the API key) reaches it."""
        self.tail_lines = tail_lines
        self.child: subprocess.Popen[bytes] | None = None

    def run(
        self,
        cmd: Sequence[str],
        *,
        on_line: Callable[[str], None] | None = None,
        output: Path | None = None,
        watch: Callable[[], str | None] | None = None,
        on_start: Callable[[int], None] | None = None,
        stop_grace_s: float = 30.0,
    ) -> ChildResult:
        """Run ``cmd`` to its end (or until ``watch`` returns a reason to stop it early).

        ``on_line`` sees every output line; ``output`` also keeps all of it in a file; ``on_start`` gets
        the child's pid as soon as it exists (a CPU sampler).
        """
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        tail: list[str] = []
        t0 = time.monotonic()
        with deferred():
            self.child = child = subprocess.Popen(
                list(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,
            )  # fmt: skip
        if on_start is not None:
            on_start(child.pid)
        pump_args = (child.stdout, tail, self.tail_lines, on_line, output)
        reader = threading.Thread(target=_pump, args=pump_args, daemon=True)
        reader.start()
        stopped: str | None = None
        killed: list[int] = []
        rusage = None
        next_watch = time.monotonic() + WATCH_S
        try:
            while True:
                pid, status, usage = os.wait4(child.pid, os.WNOHANG)
                if pid:
                    child.returncode = os.waitstatus_to_exitcode(status)
                    rusage = usage
                    break
                if watch is not None and stopped is None and time.monotonic() >= next_watch:
                    next_watch = time.monotonic() + WATCH_S
                    stopped = watch()
                    if stopped:
                        self.log(f"{self.tag}stopping the run early: {stopped}")
                        killed = stop_process_tree(child, first=signal.SIGINT, grace_s=stop_grace_s)
                        break
                time.sleep(POLL_S)
        except ChildProcessError:  # reaped elsewhere (a stop from a signal handler's cleanup)
            child.wait()
        reader.join(timeout=5)
        if watch is not None:
            watch()  # a last look at what the run wrote
        self.child = None
        code = child.returncode if child.returncode is not None else child.wait()
        return ChildResult(code, time.monotonic() - t0, stopped, tail, rusage, killed)

    def stop(self, grace_s: float = 20.0) -> list[int]:
        """Stop the running child and every process it started (SIGINT, then SIGTERM, then SIGKILL);
        return the pids that needed SIGKILL. Does nothing when no child runs."""
        child = self.child
        if child is None:
            return []
        killed = stop_process_tree(child, first=signal.SIGINT, grace_s=grace_s)
        self.child = None
        return killed


def _pump(
    stream: BinaryIO | None, tail: list[str], keep: int, on_line: Callable[[str], None] | None, output: Path | None
) -> None:
    """Read the child's output to its end (a full pipe would block it), keeping the tail."""
    if stream is None:
        return
    sink = open(output, "wb") if output is not None else None
    try:
        for raw in stream:
            if sink is not None:
                sink.write(raw)
            line = raw.decode("utf-8", "replace").rstrip("\n")
            tail.append(line)
            del tail[:-keep]
            if on_line is not None:
                on_line(line)
    except (OSError, ValueError):
        pass
    finally:
        if sink is not None:
            sink.close()
        try:
            stream.close()
        except OSError:
            pass


@contextlib.contextmanager
def signal_guard(tag: str) -> Iterator[SignalGuard]:
    """:func:`~tailgate.lifecycle.signals_raise` for a command that runs children: the first signal raises
    :class:`~tailgate.lifecycle.Stopped`; a repeated one only says the cleanup is still going."""

    # os.write, not print: a handler that prints while the main code prints raises "reentrant call"
    def still_stopping(_signum: int) -> None:
        os.write(1, f"{tag} still stopping: waiting for every process to end\n".encode())

    with signals_raise(on_repeat=still_stopping) as guard:
        yield guard


# --------------------------------------------------------------------------------------------- the server


def prepare_server(
    controller: ServerController,
    config: str,
    flags: Sequence[str],
    *,
    declared: Sequence[str] | None = None,
    log: Log = print,
    tag: str = "",
) -> JsonObject:
    """Bring the server to ``config`` as the controller's capabilities allow; return what is true to record.

    ``flags_applied`` is True only when this process restarted the server with ``flags``. A server
    nobody restarts keeps the user's ``declared`` flags apart; one restarted by a person (manual) has
    them as ``requested_flags``, which nobody here can confirm; compose files carry their own command,
    which ``describe()`` reports.
    """
    flags = list(flags)
    entry: JsonObject = {"flags": None, "flags_applied": False}
    controller.use_config(config)
    t0 = time.monotonic()
    if not controller.restarts:
        log(f"{tag}server configuration '{config}': using the server as it runs (started elsewhere); "
            f"declared flags {shlex.join(declared or []) or '(none)'} are recorded, not applied")  # fmt: skip
        entry["declared_flags"] = list(declared) if declared else None
        controller.restart(None)
    elif controller.flags_in_files:
        log(f"{tag}server configuration '{config}': re-creating the service from its compose files")
        controller.restart(None)
    elif not controller.applies_flags:
        log(f"{tag}server configuration '{config}': asking for a restart")
        entry["requested_flags"] = flags
        controller.restart(flags)
    else:
        log(f"{tag}server configuration '{config}': restarting with {shlex.join(flags) or 'default flags'}")
        entry.update(flags=flags, flags_applied=True)
        controller.restart(flags)
    controller.wait_healthy()
    entry["ready_s"] = round(time.monotonic() - t0, 1)
    log(f"{tag}server healthy after {entry['ready_s']:.0f} s")
    return {**entry, **controller.describe()}


__all__ = [
    "ChildResult", "ChildRunner", "LocustRun", "prepare_results", "prepare_server", "signal_guard",
]  # fmt: skip
