"""Waking the dispatcher at a send time: a timerfd for the wait, a spin of microseconds for the rest.

gevent's timers overshoot by up to a millisecond (the event loop polls with millisecond timeouts). The
dispatcher used to sleep until 1.5 ms before each send and spin on the loop for the rest: sends went out
within microseconds of their schedule, but every arrival cost up to 1.5 ms of busy CPU, which at a few
hundred arrivals per second per process was a quarter of what the process spent per chunk. A
:class:`~tailgate.timerfd.TimerFd` armed just before the send time wakes the loop within tens of
microseconds of it; the spin now only covers that last stretch.

The spin waits on ``gevent.idle()``, which lets the loop poll sockets between turns, so streams keep
being read and timestamped meanwhile. ``gevent.sleep(0)`` would not: it only queues a callback, and the
loop runs callbacks back to back for up to the switch interval (5 ms) without polling, so every chunk that
arrived during the spin was stamped late, by up to the whole spin.

The spin behind a timerfd follows how late this host's wake-ups are: twice the recent peak lateness (a peak
that decays by 1/64 a wake) plus 10 us, between 15 and 100 us. A fixed 100 us is what a 2-core VM needs (its
wake-ups come 34 us late at p10, 50-80 us at p50, 260-400 us at p99, even at a timer slack of 1 ns), and there
the spin stays near it; where wake-ups are prompt, spinning 25 us instead of 100 saves ~3% of the load
process's CPU per chunk (measured on the 2-core machine, ``benchmarks/results/cpu-per-chunk-2core/``).

``TAILGATE_SPIN_US`` fixes the spin's length (microseconds) to measure what it costs;
``TAILGATE_SEND_TIMERFD=0`` keeps gevent's own timer (and the 1.5-ms spin) to compare the two.
"""

from __future__ import annotations

import gevent

import os
import time
from typing import Any

from tailgate.timerfd import TimerFd

SPIN_ENV = "TAILGATE_SPIN_US"
TIMERFD_ENV = "TAILGATE_SEND_TIMERFD"

LOOP_TIMER_SPIN_NS = 1_500_000
"""The spin behind gevent's own timer: its overshoot, about a millisecond, with room."""
TIMERFD_SPIN_NS = 100_000
"""The longest spin behind a timerfd (and the first): covers the wake-ups of a busy 2-core machine at their median."""
TIMERFD_SPIN_MIN_NS = 15_000
"""The shortest: a host whose wake-ups are prompt still pays a loop turn or two of lateness."""
SPIN_MARGIN_NS = 10_000
PEAK_DECAY_SHIFT = 6
"""The peak lateness loses 1/64 of itself a wake: half-life ~44 sends, so one late wake-up widens the spin for a
second or so at a few dozen sends a second, and a host that turns busy widens it at the first late wake-up."""

SPIN_PRIORITY = 2
"""libev priority of the spin's idle watcher and of the timerfd's watcher (the highest): served in every
loop iteration before socket events, so a send is late by at most one iteration's work and never waits
behind records being written."""


def spin_ns(default_ns: int) -> int:
    """The spin's length: ``TAILGATE_SPIN_US`` (microseconds) where set, else ``default_ns``."""
    try:
        return max(0, int(float(os.environ.get(SPIN_ENV, "")) * 1000))
    except ValueError:
        return default_ns


class SendClock:
    """One per dispatcher: :meth:`wait_until` returns at an absolute ``perf_counter_ns`` instant."""

    __slots__ = ("_adapt", "_hub", "_io", "_timer", "late_peak_ns", "spin_ns")

    def __init__(self) -> None:
        self._timer = TimerFd.open(disabled_by=TIMERFD_ENV)
        self._hub: Any = gevent.get_hub()
        self._io: Any = None
        if self._timer is not None:
            self._io = self._hub.loop.io(self._timer.fd, 1, priority=SPIN_PRIORITY)
        self.spin_ns = spin_ns(LOOP_TIMER_SPIN_NS if self._timer is None else TIMERFD_SPIN_NS)
        self._adapt = self._timer is not None and not os.environ.get(SPIN_ENV)
        self.late_peak_ns = 0
        """The recent peak of the timerfd wake-ups' lateness, decaying (what the adaptive spin covers)."""

    @property
    def kind(self) -> str:
        return "gevent timer" if self._timer is None else "timerfd"

    def wait_until(self, when_ns: int) -> None:
        clock = time.perf_counter_ns
        wake_ns = when_ns - self.spin_ns
        timer = self._timer
        if timer is None:
            delay = wake_ns - clock()
            if delay > 0:
                gevent.sleep(delay / 1e9)
        else:
            # a readiness left from a wait that was interrupted (a killed greenlet) returns at once: the
            # clock says whether it was this wait's, and a stale one re-arms
            woke = clock()
            while woke < wake_ns:
                timer.set(wake_ns)
                self._hub.wait(self._io)
                timer.consume()
                woke = clock()
                if self._adapt and woke >= wake_ns:
                    self._follow(woke - wake_ns)
        idle = gevent.idle
        while clock() < when_ns:
            idle(SPIN_PRIORITY)

    def _follow(self, late_ns: int) -> None:
        """Sizes the next spin from this wake-up's lateness (see the module's notes)."""
        peak = self.late_peak_ns
        peak = late_ns if late_ns > peak else peak - (peak >> PEAK_DECAY_SHIFT)
        self.late_peak_ns = peak
        self.spin_ns = min(TIMERFD_SPIN_NS, max(TIMERFD_SPIN_MIN_NS, 2 * peak + SPIN_MARGIN_NS))

    def close(self) -> None:
        if self._timer is not None:
            self._io.close()
            self._timer.close()
            self._timer = None
