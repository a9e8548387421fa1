"""Every stream's next write in one heap, woken by a Linux ``timerfd`` at the write's absolute target.

An asyncio timer cannot wake the server on time: the selector rounds every timeout up to a whole
millisecond (``epoll_wait`` takes milliseconds), so a write planned for ``t`` ran between ``t`` and
``t + 1 ms``, 0.5 ms late at the median and 1.1 ms at p99 on the 16-core host. That noise hides the lateness
that matters, a server falling behind its schedule, which the self-check judges against a bound of the
same size. A ``timerfd`` armed at the absolute ``CLOCK_MONOTONIC`` target (the clock the log is written in)
becomes readable at that instant, and the event loop's ``epoll`` wakes for it like any socket. The process
also asks for a timer slack of 1 ns instead of an ordinary task's 50 us.

Where ``timerfd`` is missing (not Linux, no libc through ctypes), or ``TAILGATE_GROUNDTRUTH_TIMERFD=0`` asks for
it (to compare the two), the heap falls back to one asyncio timer.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import heapq
import os
from typing import Protocol

from .wire import monotonic_ns


class Due(Protocol):
    """What the heap holds: a stream, whose next write :meth:`fire` makes unless it already ended."""

    ended: bool

    def fire(self) -> None: ...


_CLOCK_MONOTONIC = 1
_TFD_TIMER_ABSTIME = 1
_PR_SET_TIMERSLACK = 29


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


class _Itimerspec(ctypes.Structure):
    _fields_ = (("it_interval", _Timespec), ("it_value", _Timespec))


class WakeFd:
    """A ``timerfd`` on ``CLOCK_MONOTONIC`` registered with the loop: :meth:`set` arms it at an absolute ns."""

    __slots__ = ("_ref", "_settime", "callback", "fd", "loop", "spec")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: object) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        create = libc.timerfd_create
        fd = create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create")
        libc.prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)  # refused or not, the timerfd is still exact to the slack
        self.fd = fd
        self.loop = loop
        self.callback = callback
        self.spec = _Itimerspec()
        self._ref = ctypes.byref(self.spec)
        self._settime = libc.timerfd_settime
        loop.add_reader(fd, self._ready)

    @classmethod
    def open(cls, loop: asyncio.AbstractEventLoop, callback: object) -> WakeFd | None:
        """A wake-up fd, or None where this system has none (the caller uses asyncio's timer)."""
        if os.environ.get("TAILGATE_GROUNDTRUTH_TIMERFD", "1") == "0":
            return None
        try:
            return cls(loop, callback)
        except (OSError, AttributeError, NotImplementedError):
            return None

    def set(self, when_ns: int) -> None:
        value = self.spec.it_value
        value.tv_sec, value.tv_nsec = divmod(max(1, when_ns), 1_000_000_000)
        self._settime(self.fd, _TFD_TIMER_ABSTIME, self._ref, None)

    def disarm(self) -> None:
        value = self.spec.it_value
        value.tv_sec = value.tv_nsec = 0
        self._settime(self.fd, 0, self._ref, None)

    def _ready(self) -> None:
        try:
            os.read(self.fd, 8)
        except (BlockingIOError, InterruptedError):
            return  # re-armed since it fired: nothing is due
        self.callback()  # type: ignore[operator]

    def close(self) -> None:
        self.loop.remove_reader(self.fd)
        os.close(self.fd)


class Timers:
    """Every stream's next write in one heap of ``(target_ns, order, stream)``, under one wake-up.

    An asyncio timer per chunk costs a ``TimerHandle`` and heap comparisons made in Python; tuples of
    integers compare in C. A stream has at most one entry at a time; a stream that ended is skipped
    when its entry comes up rather than searched for. One pass runs at most as many entries as were
    in the heap when it began, so a server that has fallen behind still reads sockets between passes.
    """

    __slots__ = ("armed", "heap", "in_pass", "loop", "order", "timer", "wake", "when")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.heap: list[tuple[int, int, Due]] = []
        self.order = 0
        self.timer: asyncio.TimerHandle | None = None
        self.when = 0
        self.armed = False
        self.in_pass = False
        self.wake = WakeFd.open(loop, self.run_due)

    def push(self, target: int, stream: Due) -> None:
        self.order += 1
        heapq.heappush(self.heap, (target, self.order, stream))
        if not self.in_pass and (not self.armed or target < self.when):
            self.arm()

    def arm(self) -> None:
        wake = self.wake
        if wake is None and self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.armed = bool(self.heap)
        if not self.heap:
            if wake is not None:
                wake.disarm()
            return
        self.when = self.heap[0][0]
        if wake is not None:
            wake.set(self.when)
        else:
            self.timer = self.loop.call_at(self.when * 1e-9, self.run_due)

    def run_due(self) -> None:
        self.timer = None
        self.in_pass = True
        heap = self.heap
        budget = len(heap)
        now = monotonic_ns()
        # asyncio's timer fired because the first entry is due to its float rounding: run it. A timerfd is
        # exact, and may be a stale wake-up from an earlier arming: only what is due runs.
        first = self.wake is None
        try:
            while heap and budget > 0 and (first or heap[0][0] <= now):
                first = False
                budget -= 1
                stream = heapq.heappop(heap)[2]
                if not stream.ended:
                    stream.fire()
                now = monotonic_ns()
        finally:
            self.in_pass = False
            self.arm()

    def close(self) -> None:
        if self.wake is not None:
            self.wake.close()
            self.wake = None
