"""A Linux ``timerfd`` on ``CLOCK_MONOTONIC``, armed at an absolute nanosecond, for any event loop.

Event loops poll with ``epoll_wait``, whose timeout is a whole millisecond: a timer of asyncio or gevent
wakes between its deadline and a millisecond after it. A timerfd armed at the absolute target becomes
readable at that instant (to the process's timer slack, asked down to 1 ns here from an ordinary task's
50 us), and the loop's ``epoll`` wakes for it like for any socket. ``time.perf_counter_ns`` and
``time.monotonic_ns`` read the same clock on Linux, so targets need no conversion.

The loop-specific halves (an asyncio reader in the reference server, a gevent watcher in the load
process) hold one of these; where the system has no timerfd (not Linux, no libc through ctypes),
:meth:`TimerFd.open` returns None and the caller keeps its loop's own timer.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_CLOCK_MONOTONIC = 1
_TFD_TIMER_ABSTIME = 1
_PR_SET_TIMERSLACK = 29


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


class _Itimerspec(ctypes.Structure):
    _fields_ = (("it_interval", _Timespec), ("it_value", _Timespec))


class TimerFd:
    """One non-blocking timerfd: :meth:`set` arms it at an absolute ns, :meth:`consume` clears a firing."""

    __slots__ = ("_ref", "_settime", "fd", "spec")

    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fd = libc.timerfd_create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create")
        libc.prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)  # refused or not, the timerfd is still exact to the slack
        self.fd: int = fd
        self.spec = _Itimerspec()
        self._ref = ctypes.byref(self.spec)
        self._settime = libc.timerfd_settime

    @classmethod
    def open(cls, disabled_by: str | None = None) -> TimerFd | None:
        """A timerfd, or None where this system has none, or where the environment variable ``disabled_by``
        is ``0`` (to measure what the loop's own timer does instead)."""
        if disabled_by is not None and os.environ.get(disabled_by, "1") == "0":
            return None
        try:
            return cls()
        except (OSError, AttributeError, NotImplementedError):
            return None

    def set(self, when_ns: int) -> None:
        """Fire at ``when_ns`` on ``CLOCK_MONOTONIC`` (at once if it has passed)."""
        value = self.spec.it_value
        value.tv_sec, value.tv_nsec = divmod(max(1, when_ns), 1_000_000_000)
        self._settime(self.fd, _TFD_TIMER_ABSTIME, self._ref, None)

    def disarm(self) -> None:
        value = self.spec.it_value
        value.tv_sec = value.tv_nsec = 0
        self._settime(self.fd, 0, self._ref, None)

    def consume(self) -> bool:
        """Clear a firing; False when there was none (re-armed since it fired: a stale readiness)."""
        try:
            os.read(self.fd, 8)
        except (BlockingIOError, InterruptedError):
            return False
        return True

    def close(self) -> None:
        os.close(self.fd)
