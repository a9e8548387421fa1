"""A stream's reads: one ``recvmsg`` with its receive stamp, and, under gevent, reads taken in the event loop.

A load process at a few hundred requests per second spends most of its CPU per chunk waking up for a
read. Under gevent a greenlet that waits for its socket costs, per read, a watcher started and stopped
and two greenlet switches (into the hub and back), on top of the read itself. :class:`HubReads` reads
and parses in the I/O watcher's callback instead, inside the hub: one watcher for the stream's life and
one switch back to the stream's greenlet when the stream ends, however many reads it took. A read is
still taken, stamped and parsed the moment the loop sees the socket readable, so a chunk's stamp is the
same as a waiting greenlet would give it.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

from tailgate.load.rxstamp import SO_TIMESTAMPNS, SOL_SOCKET, TIMESPEC, TS_SPACE, WALL

RECV_BYTES = 65536

Read = tuple[bytes, int, int | None]
"""``(bytes, when the read returned, how long its newest bytes had waited or None)``."""

TakeRead = Callable[[bytes, int, "int | None"], bool]
"""Handles one read's bytes, stamp and wait; True when the response is complete."""


def read_stamped(sock: Any, timestamps: bool, clock: Callable[[], int]) -> Read:
    """One read: ``(bytes, when the read returned, how long its newest bytes had waited)``; the wait is None
    where unknown.

    The stamp is taken once, as the call returns, for everything the read delivered. With receive
    timestamps, the wait is the read's return minus the kernel's receive time (wall clock) of the newest
    bytes read, put on ``clock`` with :data:`rxstamp.WALL` (no clock read beyond ``clock()`` on most reads).
    """
    if not timestamps:
        data = sock.recv(RECV_BYTES)
        return data, clock(), None
    data, ancillary, _, _ = sock.recvmsg(RECV_BYTES, TS_SPACE)
    now = clock()
    if ancillary:
        level, kind, payload = ancillary[0]
        if kind == SO_TIMESTAMPNS and level == SOL_SOCKET and len(payload) >= 16:
            sec, nsec = TIMESPEC.unpack_from(payload)
            waited = now - WALL.to_clock(sec * 1_000_000_000 + nsec, now)
            return data, now, waited if waited > 0 else 0
    return data, now, None


class HubReads:
    """Every read of one stream taken in the hub's I/O callback, until the response is complete.

    One timer per stream enforces the stall and request limits: it fires at the latest moment the next
    read may still come, and a read that comes in time only moves that moment (no re-arming per read).
    When it fires, the waiting greenlet gets ``TimeoutError`` and :attr:`deadline_hit` says which limit
    ended the stream. Whatever the stream's handler raises in the callback is raised in the greenlet.
    """

    __slots__ = (
        "_clock",
        "_deadline_ns",
        "_error",
        "_hub",
        "_io",
        "_last_ns",
        "_limit_ns",
        "_raw",
        "_take",
        "_timer",
        "_timestamps",
        "_waiter",
        "deadline_hit",
    )

    def __init__(self, sock: socket.socket, stall_s: float, deadline_ns: int) -> None:
        from gevent import get_hub

        self._hub = get_hub()
        self._raw = sock._sock  # type: ignore[attr-defined]  # gevent's non-blocking socket underneath
        self._io = self._hub.loop.io(sock.fileno(), 1)
        self._limit_ns = int(stall_s * 1e9)
        self._deadline_ns = deadline_ns
        self._last_ns = 0
        self._timer: Any = None
        self._waiter: Any = None
        self._error: BaseException | None = None
        self._take: TakeRead | None = None
        self._timestamps = False
        self._clock: Callable[[], int] = time.perf_counter_ns
        self.deadline_hit = False

    @staticmethod
    def usable(sock: socket.socket) -> bool:
        """A gevent socket, not TLS: a plain socket under threads blocks in its own ``recv``, and TLS may hold
        decrypted bytes (``pending``) that no readiness of the descriptor announces."""
        return (
            type(sock).__module__.startswith("gevent")
            and not isinstance(sock, ssl.SSLSocket)
            and not hasattr(sock, "pending")
            and hasattr(sock, "_sock")
        )

    def run(self, take: TakeRead, timestamps: bool, clock: Callable[[], int]) -> None:
        """Hand every read to ``take`` until it returns True or the server closes the connection.

        Raises ``TimeoutError`` past the stall or request limit, and whatever a read or ``take`` raised.
        """
        from gevent.hub import Waiter

        self._take, self._timestamps, self._clock = take, timestamps, clock
        self._last_ns = clock()
        self._waiter = Waiter(self._hub)
        self._arm(self._last_ns)
        self._io.start(self._on_readable)
        try:
            self._waiter.get()
        finally:
            self.close()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _due_ns(self) -> int:
        due = self._last_ns + self._limit_ns
        return due if due < self._deadline_ns else self._deadline_ns

    def _arm(self, now_ns: int) -> None:
        if self._timer is not None:
            self._timer.close()
        timer = self._hub.loop.timer(max(0.0, (self._due_ns() - now_ns) / 1e9))
        self._timer = timer
        timer.start(self._on_timer)

    def _on_timer(self) -> None:
        now = time.perf_counter_ns()
        due = self._due_ns()
        if now < due:
            self._arm(now)  # reads came meanwhile: wait for the new latest moment
            return
        self.deadline_hit = due >= self._deadline_ns
        self._finish(TimeoutError())

    def _on_readable(self) -> None:
        try:
            data, read_ns, delay = read_stamped(self._raw, self._timestamps, self._clock)
        except BlockingIOError:
            return  # readable, then not: wait for the next readiness
        except BaseException as e:  # raised in the stream's greenlet, never in the hub
            self._finish(e)
            return
        self._last_ns = read_ns
        if not data:
            self._finish(None)
            return
        try:
            complete = self._take(data, read_ns, delay)  # type: ignore[misc]
        except BaseException as e:
            self._finish(e)
            return
        if complete:
            self._finish(None)

    def _finish(self, error: BaseException | None) -> None:
        self._io.stop()
        if self._timer is not None:
            self._timer.stop()
        self._error = error
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            waiter.switch(None)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.close()
            self._timer = None
        self._io.close()
        self._waiter = None
