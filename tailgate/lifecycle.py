"""How a ``tailgate`` command ends: one cleanup path for a normal end, Ctrl-C, SIGTERM, SIGHUP and errors.

A suite owns processes that outlive a careless exit: a vLLM server with its engine processes, a
Prometheus, Locust with its worker processes. Python turns only SIGINT into an exception; SIGTERM
(``kill``, a CI timeout, systemd) and SIGHUP (a closed terminal or SSH session) would end the
interpreter without running a single ``finally``. :func:`signals_raise` makes all three raise
:class:`Stopped`, so every way out goes through the same ``finally`` blocks, and :func:`deferred`
holds signals back while a child is being started, so no child is ever started without a handle to
stop it by. :func:`stop_process_tree` ends a child and everything it started.

Exit codes follow the one rule of :mod:`tailgate.exitcodes` (the README's table): 0 done, 4 done but
incomplete, 1 failed, 2 bad input, 128 + the signal's number when a signal ended the run.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, NoReturn

import psutil

from tailgate.exitcodes import DONE as EXIT_OK
from tailgate.exitcodes import FAILED as EXIT_ERRORS
from tailgate.exitcodes import USAGE as EXIT_USAGE
from tailgate.exitcodes import interrupted

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """A signal asked the run to end. A BaseException, so ``except Exception`` cleanup code lets it pass."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)

    @property
    def name(self) -> str:
        """``SIGINT``, ``SIGTERM``, ``SIGHUP``."""
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """The shell convention: 128 + the signal's number."""
        return interrupted(self.signum)


class SignalGuard:
    """What :func:`signals_raise` saw: the first signal, and whether later ones may still raise."""

    def __init__(self, on_repeat: Callable[[int], None] | None) -> None:
        self.received: int | None = None
        self.armed = True
        self.on_repeat = on_repeat

    def disarm(self) -> None:
        """From now on a signal is noted, not raised: cleanup has started and must run to its end."""
        self.armed = False

    def handler(self, signum: int, frame: FrameType | None) -> None:
        if not self.armed:
            if self.received is None:
                self.received = signum
            if self.on_repeat is not None:
                self.on_repeat(signum)
            return
        self.armed = False
        self.received = signum
        if _deferring:
            _pending.append(signum)
            return
        raise Stopped(signum)


@contextlib.contextmanager
def signals_raise(on_repeat: Callable[[int], None] | None = None) -> Iterator[SignalGuard]:
    """Within the block, the first SIGINT, SIGTERM or SIGHUP raises :class:`Stopped`.

    Later signals do not raise again: a second Ctrl-C during cleanup must not abandon the cleanup
    half-way (that is what leaves an engine process behind); ``on_repeat`` may say "still stopping".
    Call ``disarm()`` on the guard when cleanup starts after a normal end, for the same reason.
    The previous handlers are restored on the way out.
    """
    guard = SignalGuard(on_repeat)
    previous = {s: signal.signal(s, guard.handler) for s in HANDLED}
    try:
        yield guard
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


_deferring = 0
_pending: list[int] = []


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold a :class:`Stopped` back for the block; it is raised when the block ends.

    Wrap ``Popen`` and the assignment of its handle: a signal in between would otherwise leave a
    started child that no cleanup code knows about. (Not the signal mask: children inherit it, and a
    server started with SIGTERM blocked could not be stopped.)
    """
    global _deferring
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    if not _deferring and _pending:
        raise Stopped(_pending.pop())


class ArgumentParser(argparse.ArgumentParser):
    """argparse that fails with one line (no usage block) and exit 2: bad input never ends in a traceback.

    Options must be spelt out: argparse would take ``--rate 2`` for ``--rates 2`` (or ``--prefix 8`` for one
    of three ``--prefix-*`` options) by prefix and silently run another plan."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def usage_error(prog: str, message: str) -> int:
    """Bad input found after parsing: one line on stderr, exit 2."""
    sys.stderr.write(f"{prog}: error: {message}\n")
    return EXIT_USAGE


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        children: list[psutil.Process] = psutil.Process(pid).children(recursive=True)
        return children
    except psutil.Error:
        return []


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.Error:
            continue
    return alive


def stop_process_tree(
    proc: subprocess.Popen[Any], first: int = signal.SIGINT, grace_s: float = 20.0, term_s: float = 10.0
) -> list[int]:
    """End ``proc`` and every process it started; return the pids that needed SIGKILL.

    ``first`` goes to the child alone so it can shut down its own way (Locust writes its in-flight
    requests as cancelled records on SIGINT). Whatever of its tree is still alive after ``grace_s``
    gets SIGTERM, then SIGKILL after ``term_s``. The tree is listed before the first signal, so
    processes that get reparented when their parent exits are still found.
    """
    tree = _descendants(proc.pid)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(first)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    tree += [p for p in _descendants(proc.pid) if p not in tree]
    left = _alive(tree)
    if proc.poll() is None or left:
        for p in left:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        deadline = time.monotonic() + term_s
        while time.monotonic() < deadline and (proc.poll() is None or _alive(tree)):
            time.sleep(0.1)
    killed = []
    for p in _alive(tree):
        with contextlib.suppress(psutil.Error):
            p.kill()
            killed.append(p.pid)
    if proc.poll() is None:
        proc.kill()
        killed.append(proc.pid)
    proc.wait()
    return killed


__all__ = [
    "EXIT_ERRORS",
    "EXIT_OK",
    "EXIT_USAGE",
    "ArgumentParser",
    "SignalGuard",
    "Stopped",
    "deferred",
    "signals_raise",
    "stop_process_tree",
    "usage_error",
]
