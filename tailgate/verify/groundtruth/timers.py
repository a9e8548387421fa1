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
import heapq
from typing import Protocol

from tailgate.timerfd import TimerFd

from .wire import monotonic_ns


class Due(Protocol):
    """What the heap holds: a stream, whose next write :meth:`fire` makes unless it already ended."""

    ended: bool

    def fire(self) -> None: ...


class WakeFd:
    """A :class:`~tailgate.timerfd.TimerFd` registered with an asyncio loop: :meth:`set` arms it at an
    absolute ns, and ``callback`` runs when it fires."""

    __slots__ = ("callback", "loop", "timer")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: object, timer: TimerFd) -> None:
        self.loop = loop
        self.callback = callback
        self.timer = timer
        loop.add_reader(timer.fd, self._ready)

    @classmethod
    def open(cls, loop: asyncio.AbstractEventLoop, callback: object) -> WakeFd | None:
        """A wake-up fd, or None where this system has none (the caller uses asyncio's timer)."""
        timer = TimerFd.open(disabled_by="TAILGATE_GROUNDTRUTH_TIMERFD")
        return None if timer is None else cls(loop, callback, timer)

    def set(self, when_ns: int) -> None:
        self.timer.set(when_ns)

    def disarm(self) -> None:
        self.timer.disarm()

    def _ready(self) -> None:
        if self.timer.consume():  # else re-armed since it fired: nothing is due
            self.callback()  # type: ignore[operator]

    def close(self) -> None:
        self.loop.remove_reader(self.timer.fd)
        self.timer.close()


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
